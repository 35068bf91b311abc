import { Chunk, Effect, Option, Schedule, Stream } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { makeId } from "../../core/Ids.ts"
import { SealStream } from "../../core/SealStream.ts"
import { Storage } from "../../core/Storage.ts"
import { getMessage, readSubject } from "../../core/StreamRead.ts"
import { storageRuntime } from "../../test/harness/NatsServer.ts"
import {
  incompleteTail,
  KEEP_BYTES,
  make,
  outputHeaders,
  outputObject,
  publishChunk,
  READ_MAX_BYTES,
  readOutput,
} from "./OutputSink.ts"

const runtime = storageRuntime()
afterAll(() => runtime.dispose())

const ACC = makeId("acc")

const ids = () => ({ run: makeId("run"), cmd: makeId("cmd") })

// Every stored message of one command's subject, in order.
const stored = (run: string, cmd: string) =>
  runtime.runPromise(
    Effect.gen(function* () {
      const { names } = yield* Storage
      const stream = names.streams.OUTPUT.name
      const subject = names.subjects.output(run, cmd)
      const last = yield* getMessage(stream, { lastOf: subject })
      if (Option.isNone(last)) return []
      return Chunk.toReadonlyArray(yield* Stream.runCollect(readSubject(stream, subject, 1, last.value.seq)))
    }),
  )

// The stored chunks of one command, opened (the done marker left out).
const opened = (run: string, cmd: string) =>
  stored(run, cmd).then((messages) =>
    runtime.runPromise(
      Effect.gen(function* () {
        const pieces = yield* Effect.flatMap(SealStream, (s) => s.pieces(ACC, outputObject(run, cmd)))
        return messages
          .filter((m) => m.header(outputHeaders.done) !== "1")
          .map((m) => {
            const offset = Number(m.header(outputHeaders.offset))
            const data = pieces.open(offset, m.data)
            if (!(data instanceof Uint8Array)) throw data
            return { offset, data }
          })
      }),
    ),
  )

// Writes `bytes` through a sink in pieces of `piece` bytes, then finishes it.
const writeAll = (run: string, cmd: string, bytes: Buffer, piece: number) =>
  runtime.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const sink = yield* make(ACC, run, cmd)
        for (let at = 0; at < bytes.length; at += piece) {
          sink.write(bytes.subarray(at, at + piece))
          // Let the publisher and the timer run now and then, as a live command would.
          if ((at / piece) % 4096 === 0) yield* Effect.yieldNow()
        }
        const totals = yield* sink.finish
        yield* sink.marked
        return totals
      }),
    ),
  )

const read = (run: string, cmd: string, after: number, maxBytes?: number) =>
  runtime.runPromise(readOutput(ACC, run, cmd, after, maxBytes))

const euros = (n: number) => Buffer.from("€".repeat(Math.ceil(n / 3))).subarray(0, n)

describe("OutputSink", () => {
  it("keeps exactly the first 4 MiB of 10 MiB of tiny writes, in batches, with a done marker", async () => {
    const { run, cmd } = ids()
    const total = 10 * 1024 * 1024
    const totals = await writeAll(run, cmd, euros(total), 7)
    expect(totals).toEqual({ output_bytes: total, stored_bytes: KEEP_BYTES })
    const messages = await stored(run, cmd)
    const data = await opened(run, cmd)
    const kept = Buffer.concat(data.map((m) => m.data))
    expect(kept.length).toBe(KEEP_BYTES)
    expect(kept.equals(euros(KEEP_BYTES))).toBe(true)
    // Batched: 4 MiB in 7-byte writes is ~600,000 writes, stored in chunks of about 64 KiB.
    expect(data.length).toBeLessThan(200)
    let offset = 0
    for (const m of data) {
      expect(m.offset).toBe(offset)
      offset += m.data.length
    }
    const done = messages.at(-1)
    expect(done?.header(outputHeaders.done)).toBe("1")
    expect(done?.header(outputHeaders.outputBytes)).toBe(String(total))
    expect(done?.header(outputHeaders.storedBytes)).toBe(String(KEEP_BYTES))
    expect(done?.data.length).toBe(0)
  })

  it("the reader pages 512 KiB at a time, never splitting a character, done only at the end", async () => {
    const { run, cmd } = ids()
    await writeAll(run, cmd, euros(10 * 1024 * 1024), 1000)
    const pages: Array<{ output: string; next: number; done: boolean }> = []
    let after = 0
    for (;;) {
      const page = await read(run, cmd, after)
      expect(page.output_bytes).toBe(10 * 1024 * 1024)
      expect(page.stored_bytes).toBe(KEEP_BYTES)
      expect(page.next - after).toBeLessThanOrEqual(READ_MAX_BYTES)
      expect(page.next).toBeGreaterThan(after)
      pages.push(page)
      after = page.next
      if (page.done) break
    }
    expect(after).toBe(KEEP_BYTES)
    expect(pages.slice(0, -1).every((p) => !p.done)).toBe(true)
    // 512 KiB is not a multiple of 3: every page but the last ends early, on a whole `€`.
    for (const p of pages.slice(0, -1)) {
      expect(p.output).toMatch(/^€+$/)
      expect(p.next % 3).toBe(0)
    }
    // 4 MiB = 3 × 1,398,101 + 1: the kept output itself ends inside a character.
    const all = pages.map((p) => p.output).join("")
    expect(all).toBe(`${"€".repeat(1398101)}\uFFFD`)
    // Past the end: nothing, done.
    expect(await read(run, cmd, KEEP_BYTES + 10)).toMatchObject({
      output: "",
      next: KEEP_BYTES + 10,
      done: true,
    })
  })

  it("a read starting inside a character returns its tail bytes as U+FFFD and goes on", async () => {
    const { run, cmd } = ids()
    await writeAll(run, cmd, euros(3000), 3000)
    const page = await read(run, cmd, 1, 100)
    expect(page.output).toBe(`\uFFFD\uFFFD${"€".repeat(32)}`)
    expect(page.next).toBe(99)
    expect(page.done).toBe(false)
    // The smallest window still moves on; a window of exactly one character returns it.
    expect(await read(run, cmd, 3, 1)).toMatchObject({ output: "€", next: 6 })
  })

  it("bytes that are not UTF-8 read back as U+FFFD with byte offsets", async () => {
    const { run, cmd } = ids()
    const bytes = Buffer.from([0xff, 0xfe, 0x61, 0x62, 0xc3, 0x28, 0xe2, 0x82])
    await writeAll(run, cmd, bytes, 1)
    expect(await read(run, cmd, 0)).toEqual({
      output: "\uFFFD\uFFFDab\uFFFD(\uFFFD",
      next: 8,
      output_bytes: 8,
      stored_bytes: 8,
      done: true,
    })
    expect(await read(run, cmd, 2)).toMatchObject({ output: "ab\uFFFD(\uFFFD", next: 8, done: true })
  })

  it("while the command runs, a read stops before an unfinished character and is not done", async () => {
    const { run, cmd } = ids()
    const result = await runtime.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const sink = yield* make(ACC, run, cmd, { flushBytes: 1 })
          sink.write(Buffer.from([0x61, 0xe2, 0x82]))
          // Wait until the chunk is stored (the publisher runs as the fiber yields).
          for (;;) {
            const p = yield* readOutput(ACC, run, cmd, 0)
            if (p.stored_bytes === 3) break
            yield* Effect.sleep("5 millis")
          }
          const before = yield* readOutput(ACC, run, cmd, 0)
          sink.write(Buffer.from([0xac]))
          const totals = yield* sink.finish
          yield* sink.marked
          return { before, after: yield* readOutput(ACC, run, cmd, before.next), totals }
        }),
      ),
    )
    expect(result.before).toEqual({ output: "a", next: 1, output_bytes: 3, stored_bytes: 3, done: false })
    expect(result.after).toEqual({ output: "€", next: 4, output_bytes: 4, stored_bytes: 4, done: true })
  })

  it("at exactly 4 MiB everything is kept; one byte more is counted, not kept", async () => {
    const at = ids()
    expect(await writeAll(at.run, at.cmd, Buffer.alloc(KEEP_BYTES, 0x61), 65_536)).toEqual({
      output_bytes: KEEP_BYTES,
      stored_bytes: KEEP_BYTES,
    })
    const past = ids()
    expect(await writeAll(past.run, past.cmd, Buffer.alloc(KEEP_BYTES + 1, 0x61), 65_536)).toEqual({
      output_bytes: KEEP_BYTES + 1,
      stored_bytes: KEEP_BYTES,
    })
    const kept = (await opened(past.run, past.cmd)).reduce((n, m) => n + m.data.length, 0)
    expect(kept).toBe(KEEP_BYTES)
  })

  it("one read returns at most 512 KiB, even when asked for more", async () => {
    const { run, cmd } = ids()
    await writeAll(run, cmd, Buffer.alloc(READ_MAX_BYTES + 1, 0x61), 4096)
    const page = await read(run, cmd, 0, 10 * READ_MAX_BYTES)
    expect(page).toMatchObject({ next: READ_MAX_BYTES, done: false })
    expect(page.output.length).toBe(READ_MAX_BYTES)
    expect(await read(run, cmd, page.next)).toEqual({
      output: "a",
      next: READ_MAX_BYTES + 1,
      output_bytes: READ_MAX_BYTES + 1,
      stored_bytes: READ_MAX_BYTES + 1,
      done: true,
    })
  })

  it("before any output the read is empty and not done", async () => {
    const { run, cmd } = ids()
    expect(await read(run, cmd, 0)).toEqual({
      output: "",
      next: 0,
      output_bytes: 0,
      stored_bytes: 0,
      done: false,
    })
  })

  it("a command with no output stores nothing, not even a marker; finishing again answers the same", async () => {
    const { run, cmd } = ids()
    const totals = await runtime.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const sink = yield* make(ACC, run, cmd)
          const first = yield* sink.finish
          expect(yield* sink.finish).toEqual(first)
          yield* sink.marked
          return first
        }),
      ),
    )
    expect(totals).toEqual({ output_bytes: 0, stored_bytes: 0 })
    const messages = await stored(run, cmd)
    expect(messages).toEqual([])
    // The stream alone cannot tell: the gateway's output route takes `done` from the ended record.
    expect(await read(run, cmd, 0)).toMatchObject({ output: "", output_bytes: 0, done: false })
  })

  it("output is stored within the flush interval, before the command ends", async () => {
    const { run, cmd } = ids()
    await runtime.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const sink = yield* make(ACC, run, cmd, { flushMs: 20 })
          sink.write(Buffer.from("partial"))
          // Read until the timer has published the chunk (the test timeout bounds it).
          yield* Effect.promise(() => read(run, cmd, 0)).pipe(
            Effect.repeat({ until: (r) => r.output === "partial", schedule: Schedule.spaced("10 millis") }),
          )
          expect(yield* Effect.promise(() => read(run, cmd, 0))).toMatchObject({
            output: "partial",
            done: false,
          })
        }),
      ),
    )
    // The scope closed without `finish`: no marker.
    expect((await stored(run, cmd)).map((m) => m.header(outputHeaders.done) ?? "")).toEqual([""])
  })

  it("closing the scope before finish drops what waits for the flush: nothing is stored, later either", async () => {
    const { run, cmd } = ids()
    await runtime.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const sink = yield* make(ACC, run, cmd, { flushMs: 100 })
          sink.write(Buffer.from("never stored"))
        }),
      ),
    )
    // Past the flush interval: the timer went with the scope.
    await new Promise((r) => setTimeout(r, 300))
    expect(await stored(run, cmd)).toEqual([])
  })

  it("a retried publish of the same chunk is stored once", async () => {
    const { run, cmd } = ids()
    const acks = await runtime.runPromise(
      Effect.gen(function* () {
        const { names } = yield* Storage
        const subject = names.subjects.output(run, cmd)
        const chunk = Buffer.from("hello")
        const first = yield* publishChunk(subject, cmd, 0, chunk, 5)
        const again = yield* publishChunk(subject, cmd, 0, chunk, 5)
        return [first, again]
      }),
    )
    expect(acks.map((a) => a.duplicate)).toEqual([false, true])
    expect(acks[1]?.seq).toBe(acks[0]?.seq)
    expect((await stored(run, cmd)).map((m) => Buffer.from(m.data).toString())).toEqual(["hello"])
  })

  it("stores every chunk sealed for the account: no plaintext in the stream, and a chunk opens only at its own offset, command and account", async () => {
    const { run, cmd } = ids()
    const secret = `secret-${makeId("cmd")}`
    await writeAll(run, cmd, Buffer.from(`${secret}\n`.repeat(20_000)), 4096)
    const messages = await stored(run, cmd)
    expect(messages.length).toBeGreaterThan(2)
    for (const m of messages) expect(Buffer.from(m.data).includes(secret)).toBe(false)
    expect((await read(run, cmd, 0)).output.startsWith(`${secret}\n`)).toBe(true)

    const [first, second] = messages
    const open = (account: string, object: string, offset: number, data: Uint8Array) =>
      runtime.runPromise(
        Effect.flatMap(SealStream, (s) => s.pieces(account, object)).pipe(
          Effect.map((p) => p.open(offset, data)),
        ),
      )
    const at = (m: (typeof messages)[number]) => Number(m.header(outputHeaders.offset))
    expect(await open(ACC, outputObject(run, cmd), at(first!), first!.data)).toBeInstanceOf(Uint8Array)
    // The second chunk's bytes claimed at the first chunk's offset (a reordered stream).
    expect(await open(ACC, outputObject(run, cmd), at(first!), second!.data)).toMatchObject({
      _tag: "DecryptFailed",
    })
    expect(await open(ACC, outputObject(run, makeId("cmd")), at(first!), first!.data)).toMatchObject({
      _tag: "DecryptFailed",
    })
    expect(await open(makeId("acc"), outputObject(run, cmd), at(first!), first!.data)).toMatchObject({
      _tag: "DecryptFailed",
    })
    // Another account's reader fails instead of answering bytes.
    const exit = await runtime.runPromiseExit(readOutput(makeId("acc"), run, cmd, 0))
    expect(String(exit)).toContain("DecryptFailed")
  })

  it("incompleteTail finds a started character at the end only", () => {
    expect(incompleteTail(Buffer.from("a€"))).toBe(0)
    expect(incompleteTail(Buffer.from([0x61, 0xe2]))).toBe(1)
    expect(incompleteTail(Buffer.from([0x61, 0xe2, 0x82]))).toBe(2)
    expect(incompleteTail(Buffer.from([0xf0, 0x9f, 0x98]))).toBe(3)
    expect(incompleteTail(Buffer.from([0xf0, 0x9f, 0x98, 0x80]))).toBe(0)
    expect(incompleteTail(Buffer.from([0x82, 0x82]))).toBe(0)
    expect(incompleteTail(Buffer.from([0xff]))).toBe(0)
    expect(incompleteTail(Buffer.alloc(0))).toBe(0)
  })
})

import { Deferred, Effect, Exit, Fiber, Schedule, Schema, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { makeId } from "../../core/Ids.ts"
import type { ObjectStore } from "../../core/ObjectStore.ts"
import { SealStream } from "../../core/SealStream.ts"
import { CommandRecord } from "../../schema/Command.ts"
import { storageRuntime } from "../../test/harness/NatsServer.ts"
import { store, type TestGuest, testGuest } from "../guest/testing.ts"
import * as Dispatcher from "./Dispatcher.ts"
import { type CommandContext, execute, type Outcome } from "./Executor.ts"
import { KEEP_BYTES, readOutput } from "./OutputSink.ts"

const ACC = "acc_0000000000000000000000000e"
const RUN = makeId("run")
let t: TestGuest
let files: ObjectStore
let context: CommandContext
const runtime = storageRuntime()
let leftovers: ReadonlyArray<string> | undefined

beforeAll(async () => {
  t = await testGuest("exec")
  files = await runtime.runPromise(store("files"))
  context = {
    account: ACC,
    files,
    signDownload: (object, as) => Effect.succeed(`https://dl.test/${object.name}/${as.kind}/${as.filename}`),
  }
}, 15 * 60_000)

afterAll(async () => {
  await runtime.dispose()
  expect(leftovers ?? (await t.close())).toEqual([])
})

let sequence = 0
const record = (kind: string, args: Record<string, unknown>, seq = ++sequence) =>
  Schema.decodeUnknownSync(CommandRecord)({
    id: makeId("cmd"),
    run: RUN,
    state: "queued",
    source: "caller",
    sequence: seq,
    created_at: new Date().toISOString(),
    kind,
    arguments: args,
  })

const exec = (r: CommandRecord) => runtime.runPromise(execute(t.guest, r, context))
const sh = async (command: string) => {
  const o = await exec(record("bash", { command }))
  if (o.state !== "succeeded") throw new Error(JSON.stringify(o))
  return (o.result as { output: string }).output
}
// The stream's read once the done marker (which follows a command's end) is stored.
const untilMarked = (cmd: string) =>
  runtime.runPromise(
    readOutput(ACC, RUN, cmd, 0).pipe(
      Effect.repeat({ until: (o) => o.done, schedule: Schedule.spaced("5 millis") }),
      Effect.zipRight(readOutput(ACC, RUN, cmd, 0)),
    ),
  )
const readAll = async (cmd: string) => {
  const pages = []
  let after = 0
  for (;;) {
    const page = await runtime.runPromise(readOutput(ACC, RUN, cmd, after))
    pages.push(page)
    after = page.next
    if (page.done) return pages
  }
}

describe("Executor", () => {
  it("bash: 10 MiB of small writes keeps 4 MiB in the stream, counts 10 MiB, and reads back in pages", async () => {
    // `€` (3 bytes) in writes of 999 bytes: page and stream boundaries fall inside characters.
    const r = record("bash", {
      command: `python3 -c "
import os
b = '€'.encode() * 333
n = 10 * 1024 * 1024
while n > 0:
    k = min(n, len(b)); os.write(1, b[:k]); n -= k
"`,
    })
    const outcome = await exec(r)
    expect(outcome.state).toBe("succeeded")
    expect(outcome.state === "succeeded" && outcome.result).toMatchObject({
      exit_code: 0,
      output_bytes: 10 * 1024 * 1024,
      truncated: true,
      timed_out: false,
      oom_killed: false,
    })
    const pages = await readAll(r.id)
    expect(pages.length).toBe(9) // each of the first 8 pages stops short of 512 KiB at a whole `€`
    expect(pages.every((p, i) => p.done === (i === pages.length - 1))).toBe(true)
    expect(pages.at(-1)).toMatchObject({
      next: KEEP_BYTES,
      output_bytes: 10 * 1024 * 1024,
      stored_bytes: KEEP_BYTES,
    })
    expect(pages.map((p) => p.output).join("")).toBe(`${"€".repeat(1398101)}\uFFFD`)
  })

  it("bash: a non-zero exit is still `succeeded`, and its output is streamed", async () => {
    const r = record("bash", { command: "printf 'x\\xffy'; exit 3" })
    const outcome = await exec(r)
    expect(outcome).toMatchObject({ state: "succeeded", result: { exit_code: 3, output_bytes: 3 } })
    // Every chunk is stored when the command ends; its done marker follows.
    expect(await runtime.runPromise(readOutput(ACC, RUN, r.id, 0))).toMatchObject({
      output: "x\uFFFDy",
      next: 3,
      stored_bytes: 3,
    })
    const marked = await untilMarked(r.id)
    expect(marked).toEqual({ output: "x\uFFFDy", next: 3, output_bytes: 3, stored_bytes: 3, done: true })
  })

  it("bash: arguments that are not valid make the command `failed` with the field named, never run", async () => {
    // The API refuses a NUL first (400); a record that got past it anyway (written by an older
    // version, say) is refused by the executor's own decoding rather than run.
    const valid = record("bash", { command: "echo x" })
    const withNul = { ...valid, arguments: { ...valid.arguments, command: "echo \0" } } as CommandRecord
    const outcome = await exec(withNul)
    expect(outcome.state).toBe("failed")
    expect(outcome.state === "failed" && outcome.error).toMatch(/^invalid arguments: .*command/s)
  })

  it("write, read, edit, list: the machine's answers, `{error}` included, are `succeeded`", async () => {
    expect(await exec(record("write", { file_path: "k/a.txt", content: "one\ntwo\n" }))).toEqual({
      state: "succeeded",
      result: { bytes: 8 },
    })
    expect(
      await exec(record("edit", { file_path: "k/a.txt", edits: [{ old_text: "two", new_text: "2" }] })),
    ).toEqual({ state: "succeeded", result: { applied: 1 } })
    expect(await exec(record("read", { file_path: "/workspace/k/a.txt" }))).toMatchObject({
      state: "succeeded",
      result: { output: expect.stringContaining("2") },
    })
    expect(await exec(record("list", { path: "k" }))).toEqual({
      state: "succeeded",
      result: { entries: [{ name: "a.txt", type: "file", size: 6 }], truncated: false, skipped: [] },
    })
    expect(await exec(record("read", { file_path: "k/missing" }))).toMatchObject({
      state: "succeeded",
      result: { error: expect.stringContaining("no such file") },
    })
  })

  it("put and get: an upload goes in, a file comes out as a download link", async () => {
    const name = makeId("file")
    await runtime.runPromise(
      Effect.gen(function* () {
        const seal = yield* SealStream
        yield* files.put(name, Stream.make(Buffer.from("uploaded\n")).pipe(seal.seal(ACC, name)))
      }),
    )
    expect(await exec(record("put", { file: name, path: "k/up.txt" }))).toEqual({
      state: "succeeded",
      result: { bytes: 9 },
    })
    expect(await sh("cat /workspace/k/up.txt")).toBe("uploaded\n")
    const g = record("get", { path: "k/up.txt" })
    expect(await exec(g)).toEqual({
      state: "succeeded",
      result: { download_url: `https://dl.test/${g.id}/file/up.txt` },
    })
    const folder = record("get", { path: "k" })
    expect(await exec(folder)).toEqual({
      state: "succeeded",
      result: { download_url: `https://dl.test/${folder.id}/folder/k.tar.gz` },
    })
    expect(await exec(record("get", { path: "k/nothing" }))).toMatchObject({
      state: "succeeded",
      result: { error: expect.stringContaining("no such file") },
    })
  })

  it("finish and terminal are handled elsewhere", async () => {
    const finish = await runtime.runPromiseExit(
      execute(t.guest, record("finish", { state: "succeeded" }), context),
    )
    expect(Exit.isFailure(finish) && JSON.stringify(finish.cause)).toContain("HandledElsewhere")
    const key = Buffer.concat([Buffer.from([4]), Buffer.alloc(64, 1)]).toString("base64url")
    const terminal = await runtime.runPromiseExit(
      execute(t.guest, record("terminal", { rows: 24, cols: 80, public_key: key }), context),
    )
    expect(Exit.isFailure(terminal) && JSON.stringify(terminal.cause)).toContain("HandledElsewhere")
  })
})

describe("Dispatcher", () => {
  it("starts in sequence order (a gap waits) and runs started commands concurrently", async () => {
    await sh("rm -f /tmp/flag2")
    const started: Array<number> = []
    const outcomes = await runtime.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const d = yield* Dispatcher.make({
            guest: t.guest,
            context,
            firstSequence: 101,
            onStart: (r) => Effect.sync(() => started.push(r.sequence)),
          })
          // 102 only finishes if 101 runs beside it... and 101 waits for 102's flag.
          const second = yield* d.submit(record("bash", { command: "touch /tmp/flag2; echo two" }, 102))
          const waitedBeforeFirst = !(yield* Deferred.isDone(second.started))
          const first = yield* d.submit(
            record(
              "bash",
              { command: "while [ ! -f /tmp/flag2 ]; do sleep 0.01; done; echo one", timeout_ms: 60_000 },
              101,
            ),
          )
          // A skipped sequence (a `finish` handled by the run actor) does not hold 104 back.
          yield* d.skip(103)
          const fourth = yield* d.submit(record("bash", { command: "echo four" }, 104))
          return {
            waitedBeforeFirst,
            first: yield* Deferred.await(first.outcome),
            second: yield* Deferred.await(second.outcome),
            fourth: yield* Deferred.await(fourth.outcome),
          }
        }),
      ),
    )
    expect(outcomes.waitedBeforeFirst).toBe(true)
    expect(started).toEqual([101, 102, 104])
    expect(outcomes.first).toMatchObject({
      state: "succeeded",
      result: { output: "one\n", timed_out: false },
    })
    expect(outcomes.second).toMatchObject({ state: "succeeded", result: { output: "two\n" } })
    expect(outcomes.fourth).toMatchObject({ state: "succeeded", result: { output: "four\n" } })
  })

  it("commands submitted while a pass is starting others are started by that pass, in order; those cancelled meanwhile never run", async () => {
    await sh("rm -f /tmp/ran301 /tmp/ran302")
    const started: Array<number> = []
    const outcomes = await runtime.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const inStart = yield* Deferred.make<void>()
          const release = yield* Deferred.make<void>()
          const d = yield* Dispatcher.make({
            guest: t.guest,
            context,
            firstSequence: 301,
            // The pass starting 301 waits here: the submits and cancels below come while it goes on.
            onStart: (r) =>
              Effect.zipRight(
                Effect.sync(() => started.push(r.sequence)),
                r.sequence === 301
                  ? Effect.zipRight(Deferred.succeed(inStart, undefined), Deferred.await(release))
                  : Effect.void,
              ),
          })
          const r301 = record("bash", { command: "touch /tmp/ran301" }, 301)
          const submitting = yield* Effect.fork(d.submit(r301))
          yield* Deferred.await(inStart)
          // Neither waits for the pass going on.
          const second = yield* d.submit(record("bash", { command: "touch /tmp/ran302" }, 302))
          const third = yield* d.submit(record("bash", { command: "echo three" }, 303))
          // 301 is cancelled between its start being told and its run; 302 before its turn.
          const cancels = [yield* d.cancel(r301.id), yield* d.cancel(second.record.id)]
          yield* Deferred.succeed(release, undefined)
          const first = yield* Fiber.join(submitting)
          return {
            cancels,
            first: yield* Deferred.await(first.outcome),
            second: yield* Deferred.await(second.outcome),
            third: yield* Deferred.await(third.outcome),
          }
        }),
      ),
    )
    expect(started).toEqual([301, 303])
    expect(outcomes.cancels).toEqual([true, true])
    expect(outcomes.first).toEqual({ state: "cancelled" })
    expect(outcomes.second).toEqual({ state: "cancelled" })
    expect(outcomes.third).toMatchObject({ state: "succeeded", result: { output: "three\n" } })
    expect(await sh("ls /tmp/ran301 /tmp/ran302 2>/dev/null || echo absent")).toBe("absent\n")
  })

  it("cancel of a running process tree: `cancelled`, no process left, the output marked done", async () => {
    const r = record("bash", {
      command: "sleep 1000 & (setsid sleep 1000 &); bash -c 'sleep 1000' & echo started; wait",
    })
    const result = await runtime.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const d = yield* Dispatcher.make({ guest: t.guest, context, firstSequence: r.sequence })
          const ticket = yield* d.submit(r)
          // The tree is up once its output says so.
          for (;;) {
            const page = yield* readOutput(ACC, RUN, r.id, 0)
            if (page.output.includes("started")) break
            yield* Effect.sleep("20 millis")
          }
          const running = yield* Effect.promise(() => sh("pgrep -x sleep | wc -l"))
          const cancelled = yield* d.cancel(r.id)
          const again = yield* d.cancel(r.id)
          return { running, cancelled, again, outcome: yield* Deferred.await(ticket.outcome) }
        }),
      ),
    )
    expect(result.running).toBe("3\n")
    expect(result).toMatchObject({ cancelled: true, again: false, outcome: { state: "cancelled" } })
    expect(await sh("pgrep -x sleep | wc -l")).toBe("0\n")
    expect(await untilMarked(r.id)).toEqual({
      output: "started\n",
      next: 8,
      output_bytes: 8,
      stored_bytes: 8,
      done: true,
    })
  })

  it("cancel of a queued command ends it without running it", async () => {
    const outcome: Outcome = await runtime.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const d = yield* Dispatcher.make({ guest: t.guest, context, firstSequence: 201 })
          const queued = yield* d.submit(record("bash", { command: "touch /tmp/ran202" }, 202))
          expect(yield* d.cancel(queued.record.id)).toBe(true)
          const first = yield* d.submit(record("bash", { command: "echo first" }, 201))
          yield* Deferred.await(first.outcome)
          expect(yield* Deferred.isDone(queued.started)).toBe(false)
          return yield* Deferred.await(queued.outcome)
        }),
      ),
    )
    expect(outcome).toEqual({ state: "cancelled" })
    expect(await sh("ls /tmp/ran202 2>&1 >/dev/null | wc -l")).toBe("1\n")
  })

  // Last: it destroys the machine.
  it("a command on a destroyed machine is `failed` with an error", async () => {
    leftovers = await t.close()
    const bash = await exec(record("bash", { command: "echo hi" }))
    expect(bash.state).toBe("failed")
    expect(bash.state === "failed" && bash.error).toMatch(/^the machine is unavailable: /)
    // File kinds go over SFTP, which never answers on a closed connection by itself: the session
    // fails them as soon as the connection is gone (not after the executor's 5-minute file timeout).
    for (const [kind, args] of [
      ["read", { file_path: "/etc/hostname" }],
      ["write", { file_path: "x", content: "y" }],
      ["list", { path: "/workspace" }],
    ] as const) {
      const outcome = await exec(record(kind, args))
      expect(outcome.state).toBe("failed")
      expect(outcome.state === "failed" && outcome.error).toMatch(/^the machine is unavailable: .*connection/)
    }
  })
})

/**
 * Waiting for a command's output (`awaitOutputAfter`) and the stream sequence a read reports
 * (`readOutputAt`), over a real nats-server. The reader itself is tested with the sink that writes
 * it (`host-agent/commands/OutputSink.test.ts`).
 */
import { Deferred, Effect, Exit, Fiber } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { storageRuntime } from "../test/harness/NatsServer.ts"
import { awaitOutputAfter, outputHeaders, outputObject, readOutputAt } from "./CommandOutput.ts"
import { makeId } from "./Ids.ts"
import { SealStream } from "./SealStream.ts"
import { Storage } from "./Storage.ts"
import { publish } from "./Stream.ts"

const runtime = storageRuntime()
afterAll(() => runtime.dispose())

const ACC = makeId("acc")

const ids = () => ({ run: makeId("run"), cmd: makeId("cmd") })

// One output chunk at `offset`, as the host agent's sink publishes it (sealed for the account).
const chunk = (run: string, cmd: string, offset: number, text: string) =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const pieces = yield* Effect.flatMap(SealStream, (s) => s.pieces(ACC, outputObject(run, cmd)))
    return yield* publish(names.subjects.output(run, cmd), pieces.seal(offset, Buffer.from(text)), {
      msgId: `${cmd}:${offset}`,
      headers: {
        [outputHeaders.offset]: String(offset),
        [outputHeaders.outputBytes]: String(offset + Buffer.byteLength(text)),
        [outputHeaders.sealed]: "1",
      },
    })
  })

describe("readOutputAt", () => {
  it("reads chunks stored in clear before output was sealed (no Hangar-Sealed) beside sealed ones", () =>
    runtime.runPromise(
      Effect.gen(function* () {
        const { run, cmd } = ids()
        const { names } = yield* Storage
        yield* publish(names.subjects.output(run, cmd), "old ", {
          msgId: `${cmd}:0`,
          headers: { [outputHeaders.offset]: "0", [outputHeaders.outputBytes]: "4" },
        })
        yield* chunk(run, cmd, 4, "new")
        const read = yield* readOutputAt(ACC, run, cmd, 0)
        expect(read.output).toMatchObject({ output: "old new", next: 7, stored_bytes: 7, done: false })
        expect((yield* readOutputAt(ACC, run, cmd, 2)).output.output).toBe("d new")
      }),
    ))
})

describe("awaitOutputAfter", () => {
  it("waits for the next chunk after the sequence read, and not for the ones before", () =>
    runtime.runPromise(
      Effect.gen(function* () {
        const { run, cmd } = ids()
        yield* chunk(run, cmd, 0, "one ")
        const first = yield* readOutputAt(ACC, run, cmd, 0)
        expect(first.output).toMatchObject({ output: "one ", next: 4, done: false })
        expect(first.lastSeq).toBeGreaterThan(0)
        const started = yield* Deferred.make<void>()
        const waiting = yield* Deferred.succeed(started, undefined).pipe(
          Effect.zipRight(awaitOutputAfter(run, cmd, first.lastSeq)),
          Effect.fork,
        )
        yield* Deferred.await(started)
        // Still waiting: nothing newer is stored.
        expect(yield* Fiber.poll(waiting).pipe(Effect.map((o) => o._tag))).toBe("None")
        yield* chunk(run, cmd, 4, "two")
        yield* Fiber.join(waiting)
        expect((yield* readOutputAt(ACC, run, cmd, 4)).output.output).toBe("two")
      }),
    ))

  it("a chunk stored between the read and the wait is not missed", () =>
    runtime.runPromise(
      Effect.gen(function* () {
        const { run, cmd } = ids()
        const before = yield* readOutputAt(ACC, run, cmd, 0)
        expect(before.lastSeq).toBe(0)
        yield* chunk(run, cmd, 0, "early")
        // Completes at once: the stream already holds a message after the sequence read.
        yield* awaitOutputAfter(run, cmd, before.lastSeq)
      }),
    ))

  it("ignores other commands' output and can be interrupted", () =>
    runtime.runPromise(
      Effect.gen(function* () {
        const { run, cmd } = ids()
        const waiting = yield* Effect.fork(awaitOutputAfter(run, cmd, 0))
        yield* chunk(run, makeId("cmd"), 0, "someone else")
        const exit = yield* Fiber.interrupt(waiting)
        expect(Exit.isInterrupted(exit)).toBe(true)
      }),
    ))
})

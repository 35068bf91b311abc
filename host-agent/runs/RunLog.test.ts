/**
 * The run log against a real nats-server: parts are numbered from 1 without gaps, sealed for the
 * account, and a line appended while a part is being stored is in the next part, never lost.
 */
import { Chunk, Effect, Fiber, Layer, ManagedRuntime, Option, Stream } from "effect"
import { afterAll, expect, it } from "vitest"
import * as Mailbox from "../../core/actors/Mailbox.ts"
import { ActorSettings } from "../../core/actors/Settings.ts"
import { makeId } from "../../core/Ids.ts"
import * as Keyring from "../../core/Keyring.ts"
import * as MasterKey from "../../core/MasterKey.ts"
import * as ObjectStore from "../../core/ObjectStore.ts"
import * as SealStream from "../../core/SealStream.ts"
import { Storage } from "../../core/Storage.ts"
import * as WrappedKeyStore from "../../core/WrappedKeyStore.ts"
import type { AccountId, RunId } from "../../schema/Ids.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { layerAll } from "../../test/harness/NatsServer.ts"
import * as RunLog from "./RunLog.ts"

const runtime = ManagedRuntime.make(
  Layer.mergeAll(
    Mailbox.layer,
    SealStream.layer.pipe(
      Layer.provide(Keyring.layer),
      Layer.provide(Layer.merge(MasterKey.layerMemory(), WrappedKeyStore.layerMemory)),
    ),
  ).pipe(Layer.provideMerge(ActorSettings.layer({})), Layer.provideMerge(layerAll()), Layer.orDie),
)
afterAll(() => runtime.dispose())

const account = makeId("acc") as AccountId

/** The lines of part `n` of `run`'s log, opened; none when the part is absent. */
const part = (run: RunId, n: number) =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const seal = yield* SealStream.SealStream
    const name = kvKeys.logPart(run, n)
    const found = yield* (yield* ObjectStore.make(names.objects.logs.name)).get(name)
    if (Option.isNone(found)) return undefined
    const bytes = Buffer.concat(
      Chunk.toReadonlyArray(yield* Stream.runCollect(found.value.data.pipe(seal.open(account, name)))),
    )
    return bytes
      .toString("utf8")
      .split("\n")
      .filter((l) => l !== "")
      .map((l) => JSON.parse(l) as { kind: string; i?: number })
  })

it("a line appended while a part is stored goes in the next part; parts count from 1 without gaps", async () => {
  const run = makeId("run") as RunId
  const { parts, lines } = await runtime.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        // No timer flushes here: only the explicit ones below.
        const log = yield* RunLog.make({ run, account, flushMs: 3_600_000 })
        for (let i = 0; i < 100; i++) {
          yield* log.append("step", { i })
          if (i % 10 === 9) {
            // A flush in flight while the next lines come in.
            // (Storing a part takes a few round trips to the server; a millisecond in, it is busy.)
            const flushing = yield* Effect.fork(log.flush)
            yield* Effect.sleep("1 millis")
            yield* log.append("during", { i })
            yield* Fiber.join(flushing)
          }
        }
        yield* log.flush
        const parts = yield* log.parts
        const lines: Array<{ kind: string; i?: number }> = []
        for (let n = 1; n <= parts; n++) lines.push(...((yield* part(run, n)) ?? []))
        expect(yield* part(run, parts + 1)).toBeUndefined()
        return { parts, lines }
      }),
    ),
  )
  expect(parts).toBeGreaterThanOrEqual(10)
  const steps = lines.filter((l) => l.kind === "step").map((l) => l.i)
  const during = lines.filter((l) => l.kind === "during").map((l) => l.i)
  expect(steps).toEqual(Array.from({ length: 100 }, (_, i) => i))
  expect(during).toEqual(Array.from({ length: 10 }, (_, k) => k * 10 + 9))
})

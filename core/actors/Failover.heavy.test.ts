import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Either, Option } from "effect"
import { kvKeys } from "../../schema/Subjects.ts"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import type { Delivery } from "../Consumer.ts"
import * as Kv from "../Kv.ts"
import { Storage } from "../Storage.ts"
import { handle } from "./internal/Handle.ts"
import * as Mailbox from "./Mailbox.ts"
import { type ActorRecord, encodedStateRecordSchema, recordSchema } from "./Record.ts"
import { ActorSettings } from "./Settings.ts"
import * as State from "./State.ts"
import { eventually, fast, startWorker, withClient as withClientOn } from "./testing/Harness.ts"
import { Recorder, Sink } from "./testing/TestActors.ts"

let server: StartedNatsServer
beforeAll(async () => {
  server = await startNatsServer()
})
afterAll(() => server?.stop())

const actors = [Recorder, Sink]

const withClient = <A, E>(body: Parameters<typeof withClientOn<A, E>>[1]) => withClientOn(server.url, body)

const recorded = (
  id: string,
  predicate: (r: ActorRecord<typeof Recorder.initial>) => boolean,
  what: string,
) =>
  eventually(
    Effect.map(State.read(Recorder, id), (r) => Option.filter(r, predicate)),
    "30 seconds",
    what,
  )

describe("partitions", () => {
  it.live(
    "3 workers split 32 partitions 11/11/10; a killed worker's partitions move and its messages are handled",
    () =>
      withClient((prefix) =>
        Effect.gen(function* () {
          const ids = Array.from({ length: 40 }, (_, i) => `a${i}`)
          const doomed = yield* startWorker(server.url, prefix, actors, fast, {
            crashAt: "afterAck",
            match: (info) => info.tag === "Add" && info.seq > 60,
          })
          const w2 = yield* startWorker(server.url, prefix, actors, fast)
          const w3 = yield* startWorker(server.url, prefix, actors, fast)
          const counts = yield* eventually(
            Effect.gen(function* () {
              const owned = yield* Effect.all([doomed.worker.owned, w2.worker.owned, w3.worker.owned])
              const perType = owned.map((o) => o.filter((l) => l.startsWith("recorder.")).length)
              return perType.reduce((a, b) => a + b, 0) === 32 &&
                Math.max(...perType) - Math.min(...perType) <= 1
                ? Option.some(perType)
                : Option.none()
            }),
            "30 seconds",
            "an even split",
          )
          expect([...counts].sort()).toEqual([10, 11, 11])

          // Messages keep flowing while one worker dies mid-stream.
          yield* Effect.forEach(
            Array.from({ length: 4 }, (_, round) => round),
            (round) =>
              Effect.forEach(
                ids,
                (id) =>
                  Mailbox.send(
                    Recorder,
                    id,
                    { _tag: "Add", sender: "s", n: round },
                    { msgId: `${id}-${round}` },
                  ),
                { concurrency: 8, discard: true },
              ),
            { discard: true },
          )
          yield* doomed.worker.crashed
          yield* doomed.stop
          for (const id of ids) {
            const r = yield* recorded(id, (x) => x.state.log.length >= 4, `${id} to handle 4 messages`)
            expect(r.state.log).toEqual(["s:0", "s:1", "s:2", "s:3"])
          }
          const after = yield* eventually(
            Effect.gen(function* () {
              const owned = yield* Effect.all([w2.worker.owned, w3.worker.owned])
              const perType = owned.map((o) => o.filter((l) => l.startsWith("recorder.")).length)
              // Under load a survivor may briefly hold more than its share (it saw the other's
              // presence expire); what must happen is that the two settle on an even split.
              return perType[0]! + perType[1]! === 32 && perType[0] === perType[1]
                ? Option.some(perType)
                : Option.none()
            }),
            "30 seconds",
            "the survivors to split every partition evenly",
          )
          expect([...after].sort()).toEqual([16, 16])
          yield* w2.stop
          yield* w3.stop
        }),
      ),
  )

  it.live("a paused owner whose lease expired cannot overwrite state written by the new owner", () =>
    withClient((prefix) =>
      Effect.gen(function* () {
        const old = yield* startWorker(server.url, prefix, actors, fast)
        yield* Mailbox.send(Recorder, "x", { _tag: "Add", sender: "s", n: 1 }, { msgId: "x1" })
        yield* recorded("x", (r) => r.state.log.length === 1, "the first message")

        // The old owner "pauses" right after reading: it keeps the record and revision it read.
        const { names } = yield* Storage
        const settings = yield* ActorSettings.Tag
        const kv = (yield* Kv.make(names.kv.actors.name, recordSchema(Recorder))) as Kv.Kv<
          ActorRecord<unknown>
        >
        const read = Option.getOrThrow(yield* kv.get(kvKeys.actor("recorder", "x")))
        const paused = {
          actor: Recorder,
          partition: 0,
          label: "recorder.paused",
          kv,
          encodedKv: (yield* Kv.make(names.kv.actors.name, encodedStateRecordSchema)) as Kv.Kv<
            ActorRecord<unknown>
          >,
          names,
          settings,
          cache: new Map([[kvKeys.actor("recorder", "x"), { record: read.value, revision: read.revision }]]),
          leaseDeadline: () => Number.POSITIVE_INFINITY,
          fault: () => Effect.void,
        }
        yield* old.stop
        const next = yield* startWorker(server.url, prefix, actors, fast)
        yield* Mailbox.send(Recorder, "x", { _tag: "Add", sender: "s", n: 2 }, { msgId: "x2" })
        yield* recorded("x", (r) => r.state.log.length === 2, "the new owner's write")

        const acks: Array<string> = []
        const delivery: Delivery = {
          subject: names.subjects.mailbox("recorder", 0, "x"),
          seq: 1_000_000,
          deliveries: 1,
          storedAt: Date.now(),
          data: new TextEncoder().encode(JSON.stringify({ _tag: "Add", sender: "stale", n: 3 })),
          header: () => undefined,
          ack: () => acks.push("ack"),
          nak: () => acks.push("nak"),
          working: () => {},
        }
        const stale = yield* handle(paused, [delivery]).pipe(Effect.either)
        expect(Either.isLeft(stale) && stale.left._tag).toBe("StaleOwner")
        // A lease known to be expired stops it before it even reads.
        const expired = yield* handle({ ...paused, leaseDeadline: () => 0 }, [delivery]).pipe(Effect.either)
        expect(Either.isLeft(expired) && expired.left._tag).toBe("LeaseExpired")
        expect(acks).toEqual([])
        const final = yield* State.read(Recorder, "x")
        expect(Option.getOrThrow(final).state.log).toEqual(["s:1", "s:2"])
        yield* next.stop
      }),
    ),
  )
})

describe("timers", () => {
  it.live(
    "fire at their time, are replaced by a later schedule, stay cancelled, and survive a restart of every worker",
    () =>
      withClient((prefix) =>
        Effect.gen(function* () {
          let workers = [
            yield* startWorker(server.url, prefix, actors, fast),
            yield* startWorker(server.url, prefix, actors, fast),
          ]
          const now = Date.now()
          const set = (name: string, n: number, inMs: number) =>
            Mailbox.send(
              Recorder,
              "t",
              { _tag: "SetTimer", name, n, at: now + inMs },
              { msgId: `set-${name}-${n}` },
            )
          yield* set("a", 1, 700)
          yield* set("b", 1, 700)
          yield* set("b", 2, 1_400) // replaces b/1
          yield* set("c", 1, 700)
          yield* Mailbox.send(Recorder, "t", { _tag: "CancelTimer", name: "c" }, { msgId: "cancel-c" })
          yield* set("d", 1, 3_500) // fires after every worker has been replaced
          const early = yield* recorded("t", (r) => r.state.fired.some((f) => f.name === "b"), "timer b")
          expect(early.state.fired.map((f) => `${f.name}:${f.n}`)).toEqual(["a:1", "b:2"])
          for (const f of early.state.fired) expect(f.handledAt).toBeGreaterThanOrEqual(f.at)

          yield* Effect.forEach(workers, (w) => w.stop, { discard: true })
          workers = [
            yield* startWorker(server.url, prefix, actors, fast),
            yield* startWorker(server.url, prefix, actors, fast),
          ]
          const late = yield* recorded("t", (r) => r.state.fired.some((f) => f.name === "d"), "timer d")
          expect(late.state.fired.map((f) => `${f.name}:${f.n}`)).toEqual(["a:1", "b:2", "d:1"])
          expect(late.timers).toEqual({})
          yield* Effect.forEach(workers, (w) => w.stop, { discard: true })
        }),
      ),
  )
})

/**
 * The followers of runs' records (`Records.ts`): one subscription per run however many waits use
 * it, let go once idle (never while a wait uses it), and at most 1,024 on a connection. Against a
 * real nats-server; subscriptions are counted on the connection itself.
 */
import { expect, layer } from "@effect/vitest"
import { Clock, Effect, Fiber, Layer } from "effect"
import { Nats } from "../../core/Nats.ts"
import { layerAll } from "../../test/harness/NatsServer.ts"
import { uniqueName } from "../../test/harness/names.ts"
import { CommandRouteSettings } from "./LongPoll.ts"
import * as Records from "./Records.ts"

const IDLE_MS = 300

// The connection's live subscriptions (nats.js keeps them in its protocol handler).
const subscriptions = (connection: unknown): number =>
  (connection as { protocol: { subscriptions: { size: () => number } } }).protocol.subscriptions.size()

// Until `done` holds, looking every 20 ms; fails after 10 s.
const until = (done: () => boolean) =>
  Effect.sleep("20 millis").pipe(
    Effect.repeat({ until: done }),
    Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => new Error("never came") }),
  )

const live = Effect.withClock(Clock.make())

// Each test on the real clock (idle times pass as they would in a gateway). Not with
// `excludeTestServices`: `layer` sets its methods on the shared `it`, and the files after this one
// in the same fork (`isolate: false`) would lose their test clock.
layer(Layer.merge(layerAll(), CommandRouteSettings.layer({ followIdleMs: IDLE_MS })))(
  "Records: a run's follower",
  (it) => {
    it.effect("one subscription per run; let go once idle, but not while a wait uses it", () =>
      Effect.gen(function* () {
        const { connection } = yield* Nats
        const [busy, idle] = [uniqueName("run"), uniqueName("run")]
        const before = subscriptions(connection)
        yield* Records.follow(busy)
        yield* Records.follow(busy)
        yield* Records.follow(idle)
        expect(subscriptions(connection)).toBe(before + 2)
        // Two waits on the busy run's records (none there: they wait as long as it takes).
        const waits = yield* Effect.all(
          [Records.awaitEnded(busy, 1), Records.awaitEnded(busy, 2)].map((w) => Effect.fork(w)),
        )
        // The idle one goes; the busy one stays while its waits last, well past its idle time.
        yield* until(() => subscriptions(connection) === before + 1)
        yield* Effect.sleep(`${IDLE_MS * 2} millis`)
        expect(subscriptions(connection)).toBe(before + 1)
        yield* Effect.forEach(waits, Fiber.interrupt)
        yield* until(() => subscriptions(connection) === before)
      }).pipe(live),
    )

    it.effect("at most 1,024 runs are followed on a connection: the least recently used goes first", () =>
      Effect.gen(function* () {
        const { connection } = yield* Nats
        const before = subscriptions(connection)
        const runs = Array.from({ length: 1_030 }, () => uniqueName("run"))
        yield* Effect.forEach(runs, Records.follow, { discard: true })
        expect(subscriptions(connection)).toBe(before + 1_024)
        // The first six went: following the seventh again makes nothing new.
        yield* Records.follow(runs[6] as string)
        expect(subscriptions(connection)).toBe(before + 1_024)
        yield* until(() => subscriptions(connection) === before)
      }).pipe(live),
    )
  },
)

/**
 * The followers of runs' records (`Records.ts`): one subscription per run however many waits use
 * it, let go once idle (never while a wait uses it), at most 1,024 on a connection (the least
 * recently used go first; past that many in use, a wait still gets one). Against a real
 * nats-server; the subscriptions are read from the connection itself.
 */
import { expect, layer } from "@effect/vitest"
import { Clock, Effect, Fiber, Layer } from "effect"
import { Nats } from "../../core/Nats.ts"
import { layerAll } from "../../test/harness/NatsServer.ts"
import { uniqueName } from "../../test/harness/names.ts"
import { CommandRouteSettings } from "./LongPoll.ts"
import * as Records from "./Records.ts"

const IDLE_MS = 300

// The runs whose records the connection follows now (nats.js keeps its subscriptions in its
// protocol handler; a follower's subject is `$KVR.<bucket>.<run>.*`).
const followedRuns = (connection: unknown): ReadonlySet<string> =>
  new Set(
    (
      connection as { protocol: { subscriptions: { all: () => Array<{ subject: string }> } } }
    ).protocol.subscriptions
      .all()
      .flatMap(({ subject }) => (subject.startsWith("$KVR.") ? [subject.split(".")[2] as string] : [])),
  )

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
        yield* Records.follow(busy)
        yield* Records.follow(busy)
        yield* Records.follow(idle)
        expect(followedRuns(connection)).toEqual(new Set([busy, idle]))
        // Two waits on the busy run's records (none there: they wait as long as it takes).
        const waits = yield* Effect.all(
          [Records.awaitEnded(busy, 1), Records.awaitEnded(busy, 2)].map((w) => Effect.fork(w)),
        )
        // The idle one goes; the busy one stays while its waits last, well past its idle time.
        yield* until(() => !followedRuns(connection).has(idle))
        yield* Effect.sleep(`${IDLE_MS * 2} millis`)
        expect(followedRuns(connection)).toEqual(new Set([busy]))
        yield* Effect.forEach(waits, Fiber.interrupt)
        yield* until(() => followedRuns(connection).size === 0)
      }).pipe(live),
    )
  },
)

// The most kept, on a connection of its own whose followers idle for a minute: making 1,030 of them
// one after another on a loaded machine must not outlast their idle time. Its connection's close
// ends them.
layer(Layer.merge(layerAll(), CommandRouteSettings.layer({ followIdleMs: 60_000 })))(
  "Records: the runs followed on a connection",
  (it) => {
    it.effect("at most 1,024 runs are followed on a connection: the least recently used go first", () =>
      Effect.gen(function* () {
        const { connection } = yield* Nats
        const runs = Array.from({ length: 1_030 }, () => uniqueName("run"))
        yield* Effect.forEach(runs, Records.follow, { discard: true })
        // The first six went.
        expect(followedRuns(connection)).toEqual(new Set(runs.slice(6)))
        // Used again, the seventh is the most recent: a new run's follower pushes out the eighth.
        yield* Records.follow(runs[6] as string)
        const more = uniqueName("run")
        yield* Records.follow(more)
        expect(followedRuns(connection)).toEqual(new Set([...runs.slice(6, 7), ...runs.slice(8), more]))
      }).pipe(live),
    )

    it.effect("with 1,024 runs' followers in use, a wait on one more still gets one", () =>
      Effect.gen(function* () {
        const { connection } = yield* Nats
        const runs = Array.from({ length: 1_024 }, () => uniqueName("run"))
        const waits = yield* Effect.forEach(runs, (run) => Effect.fork(Records.awaitEnded(run, 1)))
        // Every one followed (the earlier test's, not in use, pushed out meanwhile).
        yield* until(() => {
          const now = followedRuns(connection)
          return now.size === 1_024 && runs.every((run) => now.has(run))
        })
        const extra = uniqueName("run")
        const wait = yield* Effect.fork(Records.awaitEnded(extra, 1))
        yield* until(() => followedRuns(connection).has(extra))
        // It waits (no record comes), its follower kept past the most, none of the others let go.
        yield* Effect.sleep("300 millis")
        expect(wait.unsafePoll()).toBeNull()
        const now = followedRuns(connection)
        expect(now.size).toBe(1_025)
        expect(runs.every((run) => now.has(run))).toBe(true)
        yield* Effect.forEach([...waits, wait], Fiber.interrupt)
      }).pipe(live),
    )
  },
)

/**
 * Scheduler benchmark (prints figures; not a test): placements per second with 100 simulated
 * hosts registered (records in KV `hosts`, 14 vCPUs each: room for 1,400 size-`s` runs).
 *
 * - `place()` alone: the pure placement rule (oldest run first, to the live host with the most
 *   free vCPUs), N runs over the 100 host records, in memory: the ceiling of the rule itself.
 * - the actor: the one scheduler instance on a real nats-server and a real worker, N `Enqueue`
 *   messages sent at once (64 in flight); the rate is N over the time from the first send until
 *   the scheduler's stored state has offered all N (each offer is a `Place` in a host's mailbox).
 *   The hosts come from the worker's watched cache; a group of messages (up to 64) is placed in
 *   one pass by its last message, its state encoded and written once. Goal: ≥ 1,000/s.
 *
 * Run: node --import tsx bench/scheduler.ts [N]   (N ≤ 1,400; default 1,000)
 */
import { Effect, Option } from "effect"
import { hostRecord, startRunWorker, writeHost } from "../actors/run/testing.ts"
import { place } from "../actors/scheduler/Scheduler.ts"
import * as Mailbox from "../core/actors/Mailbox.ts"
import * as State from "../core/actors/State.ts"
import { clientLayer, fast } from "../core/actors/testing/Harness.ts"
import { makeId } from "../core/Ids.ts"
import { Scheduler, type SchedulerState, schedulerId, type Waiting } from "../schema/actors/Scheduler.ts"
import { timestamp } from "../schema/Common.ts"
import type { AccountId, RunId } from "../schema/Ids.ts"
import { sizes } from "../schema/Limits.ts"
import { startNatsServer } from "../test/harness/NatsServer.ts"
import { uniquePrefix } from "../test/harness/names.ts"

const N = Math.min(1_400, Number(process.argv[2] ?? 1_000))
const HOSTS = 100
const account = makeId("acc") as AccountId
const hostIds = Array.from({ length: HOSTS }, (_, i) => `bench-host-${String(i).padStart(3, "0")}`)

const waiting = (i: number): Waiting => ({
  run: makeId("run", 1_000 + i) as RunId,
  account,
  size: "s",
  vcpus: sizes.s.vcpus,
  memory_mib: sizes.s.memoryMib,
  created_at: timestamp(1_000 + i),
})

// 1. The rule alone: N runs placed one message at a time (as the actor does: one `place` per Enqueue).
const pure = () => {
  const hosts = hostIds.map((id) => hostRecord(id, { vcpus: 14, memory_mib: 14 * 4_096 }))
  let state: SchedulerState = { queue: [], offered: {}, placed: {}, room: {}, suspect: {}, draining: [] }
  const started = performance.now()
  for (let i = 0; i < N; i++) state = place({ ...state, queue: [waiting(i)] }, hosts).state
  const ms = performance.now() - started
  const perHost = new Map<string, number>()
  for (const o of Object.values(state.offered)) perHost.set(o.host, (perHost.get(o.host) ?? 0) + 1)
  return { ms, offered: Object.keys(state.offered).length, spread: [...perHost.values()] }
}

const main = async () => {
  const p = pure()
  console.log(
    `place() alone, ${HOSTS} hosts: ${N} placements in ${p.ms.toFixed(1)} ms = ${Math.round((N / p.ms) * 1_000).toLocaleString("en")}/s (runs per host ${Math.min(...p.spread)}–${Math.max(...p.spread)})`,
  )

  const server = await startNatsServer()
  const prefix = uniquePrefix()
  const client = clientLayer(server.url, prefix, fast)
  // Deployed lease times: a group of placements outlasts the tests' 1.5 s lease.
  const worker = await Effect.runPromise(
    startRunWorker(server.url, prefix, { actor: { leaseMs: 15_000, renewMs: 5_000 } }),
  )
  try {
    await Effect.runPromise(
      Effect.forEach(hostIds, (id) => writeHost(hostRecord(id, { vcpus: 14, memory_mib: 14 * 4_096 })), {
        concurrency: 16,
        discard: true,
      }).pipe(Effect.provide(client), Effect.scoped),
    )
    const offered = Effect.map(State.read(Scheduler, schedulerId), (r) =>
      Option.match(r, { onNone: () => 0, onSome: (x) => Object.keys(x.state.offered).length }),
    )
    const result = await Effect.runPromise(
      Effect.gen(function* () {
        const started = performance.now()
        yield* Effect.forEach(
          Array.from({ length: N }, (_, i) => i),
          (i) => {
            const { run, ...rest } = waiting(i)
            return Mailbox.send(
              Scheduler,
              schedulerId,
              { _tag: "Enqueue", run, ...rest },
              { msgId: `enq:${run}` },
            )
          },
          { concurrency: 64, discard: true },
        )
        const sent = performance.now() - started
        while ((yield* offered) < N) yield* Effect.sleep("20 millis")
        return { sent, ms: performance.now() - started }
      }).pipe(Effect.provide(client), Effect.scoped),
    )
    console.log(
      `scheduler actor, ${HOSTS} hosts: ${N} placements in ${Math.round(result.ms)} ms = ${Math.round((N / result.ms) * 1_000).toLocaleString("en")}/s (sends done at ${Math.round(result.sent)} ms)`,
    )
  } finally {
    await Effect.runPromise(worker.stop)
    await server.stop()
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e)
    process.exit(1)
  },
)

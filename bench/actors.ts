/**
 * Actor runtime benchmark (prints figures; not a test). Against one local nats-server:
 *
 * - baseline: a bare JetStream loop (publish with msg id, one pull consumer, ack each);
 * - the runtime with 1 and then 2 workers (in this process, each with its own connection), one
 *   actor type over 256 ids, every message a state write (compare-and-set) plus the per-message log
 *   line (rendered as JSON, discarded).
 *
 * Throughput: N messages sent as fast as acknowledged (64 in flight) while being handled; the rate
 * is N over the time from the first send to the last handled. The sender runs in this process too.
 * Latency: messages sent at a steady 500/s; send → handled, p50/p99.
 *
 * Run: node --import tsx bench/actors.ts [N]
 */
import { AckPolicy, DeliverPolicy } from "@nats-io/jetstream"
import { Context, Effect, Exit, Layer, Logger, Schema, Scope } from "effect"
import * as Actor from "../actors/runtime/Actor.ts"
import * as Mailbox from "../actors/runtime/Mailbox.ts"
import { ActorSettings } from "../actors/runtime/Settings.ts"
import * as Worker from "../actors/runtime/Worker.ts"
import { jsonLogger } from "../core/Log.ts"
import * as Nats from "../core/Nats.ts"
import * as Storage from "../core/Storage.ts"
import { startNatsServer } from "../test/harness/NatsServer.ts"

const N = Number(process.argv[2] ?? 20_000)
const IDS = 256
const PACED = 1_500
const PACE_PER_S = 500

let handled = 0
let latencies: Array<number> = []
let measuring = false

const Counter = Actor.make({
  name: "counter",
  state: Schema.Struct({ count: Schema.Number }),
  initial: { count: 0 },
  message: Schema.Union(Schema.TaggedStruct("Inc", { sentAt: Schema.Number })),
  handler: (state, message) =>
    Effect.sync(() => {
      handled++
      if (measuring) latencies.push(performance.timeOrigin + performance.now() - message.sentAt)
      return { state: { count: state.count + 1 } }
    }),
})

const now = () => performance.timeOrigin + performance.now()
const pct = (xs: Array<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN
}
const fmt = (label: string, rate: number, lat: Array<number>) =>
  console.log(
    `${label.padEnd(28)} ${rate.toFixed(0).padStart(7)} msg/s   p50 ${pct(lat, 50).toFixed(2)} ms   p99 ${pct(lat, 99).toFixed(2)} ms`,
  )
const waitUntil = (cond: () => boolean) =>
  Effect.gen(function* () {
    while (!cond()) yield* Effect.sleep("5 millis")
  })

const paced = <E, R>(send: (i: number) => Effect.Effect<void, E, R>) =>
  Effect.gen(function* () {
    const start = now()
    for (let i = 0; i < PACED; i++) {
      const due = start + (i * 1000) / PACE_PER_S
      const wait = due - now()
      if (wait > 0) yield* Effect.sleep(`${wait} millis`)
      yield* Effect.fork(send(i))
    }
  })

const baseline = (url: string) =>
  Effect.gen(function* () {
    const { js, jsm } = yield* Nats.Nats
    yield* Effect.promise(() =>
      jsm.streams.add({
        name: "BENCH",
        subjects: ["bench.>"],
        retention: "workqueue" as never,
        duplicate_window: 120e9,
      }),
    )
    yield* Effect.promise(() =>
      jsm.consumers.add("BENCH", {
        durable_name: "b",
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
        max_ack_pending: 1000,
      }),
    )
    const pub = (i: number, tag: string) =>
      Effect.promise(() =>
        js.publish(`bench.${i % IDS}`, JSON.stringify({ _tag: "Inc", sentAt: now() }), {
          msgID: `${tag}${i}`,
        }),
      )
    const consumer = yield* Effect.promise(() => js.consumers.get("BENCH", "b"))
    let received = 0
    const lat: Array<number> = []
    let measure = false
    const messages = yield* Effect.promise(() =>
      consumer.consume({
        callback: (m) => {
          const sentAt = (m.json() as { sentAt: number }).sentAt
          if (measure) lat.push(now() - sentAt)
          received++
          m.ack()
        },
      }),
    )
    const t0 = now()
    yield* Effect.forEach(
      Array.from({ length: N }, (_, i) => i),
      (i) => pub(i, "t"),
      { concurrency: 64, discard: true },
    )
    const sendRate = N / ((now() - t0) / 1000)
    yield* waitUntil(() => received >= N)
    const rate = N / ((now() - t0) / 1000)
    measure = true
    yield* paced((i) => Effect.asVoid(pub(i, "p")))
    yield* waitUntil(() => received >= N + PACED)
    yield* Effect.promise(() => messages.close())
    fmt("bare JetStream loop", rate, lat)
    console.log(`  (the sends themselves completed at ${sendRate.toFixed(0)} msg/s)`)
    void url
    return rate
  })

const actorRun = (url: string, workers: number) =>
  Effect.gen(function* () {
    const prefix = `bench${workers}`
    const settings = ActorSettings.layer({})
    const quiet = Logger.replace(
      Logger.defaultLogger,
      jsonLogger((line) => {
        // Rendered either way (its cost counts); only warnings and errors are shown.
        if (!line.includes('"level":"info"')) process.stderr.write(`${line}\n`)
      }),
    )
    const mailbox = yield* Mailbox.Mailbox
    handled = 0
    latencies = []
    const send = (i: number, tag: string) =>
      Effect.orDie(
        mailbox.send(Counter, `c${i % IDS}`, { _tag: "Inc", sentAt: now() }, { msgId: `${tag}${i}` }),
      )
    const scopes: Array<Scope.CloseableScope> = []
    const started: Array<Worker.WorkerService> = []
    for (let w = 0; w < workers; w++) {
      const scope = yield* Scope.make()
      scopes.push(scope)
      const layer = Worker.layer([Counter]).pipe(
        Layer.provide(Storage.layerPrefix(prefix)),
        Layer.provide(settings),
        Layer.provide(Nats.layerUrl(url, `bench-worker-${w}`)),
        Layer.provide(quiet),
      )
      started.push(Context.get(yield* Layer.buildWithScope(layer, scope), Worker.Worker))
    }
    // From the moment every worker holds its share of the partitions.
    while (true) {
      const owned = yield* Effect.forEach(started, (w) => w.owned)
      const total = owned.reduce((a, o) => a + o.length, 0)
      if (total === 32 && owned.every((o) => o.length >= Math.floor(32 / workers))) break
      yield* Effect.sleep("5 millis")
    }
    const t0 = now()
    yield* Effect.forEach(
      Array.from({ length: N }, (_, i) => i),
      (i) => send(i, "t"),
      { concurrency: 64, discard: true },
    )
    const sendRate = N / ((now() - t0) / 1000)
    yield* waitUntil(() => handled >= N)
    const rate = N / ((now() - t0) / 1000)
    measuring = true
    yield* paced((i) => send(i, "p"))
    yield* waitUntil(() => handled >= N + PACED)
    measuring = false
    fmt(`actors, ${workers} worker${workers > 1 ? "s" : ""}`, rate, latencies)
    console.log(`  (the sends themselves completed at ${sendRate.toFixed(0)} msg/s)`)
    for (const scope of scopes) yield* Scope.close(scope, Exit.void)
    return rate
  }).pipe(
    Effect.provide(
      Mailbox.layer.pipe(
        Layer.provideMerge(Storage.layerPrefix(`bench${workers}`)),
        Layer.provideMerge(ActorSettings.layer({})),
        Layer.provideMerge(Nats.layerUrl(url, "bench-client")),
      ),
    ),
  )

const server = await startNatsServer({ syncAlways: false })
try {
  console.log(
    `nats-server ${server.url} (sync_interval default), ${N} messages, ${IDS} actor ids, 32 partitions`,
  )
  const bare = await Effect.runPromise(
    baseline(server.url).pipe(Effect.provide(Nats.layerUrl(server.url, "bench-bare")), Effect.scoped),
  )
  const one = await Effect.runPromise(actorRun(server.url, 1))
  const two = await Effect.runPromise(actorRun(server.url, 2))
  console.log(
    `actors/bare: 1 worker ${((100 * one) / bare).toFixed(0)}%, 2 workers ${((100 * two) / bare).toFixed(0)}%`,
  )
} finally {
  await server.stop()
}
process.exit(0)

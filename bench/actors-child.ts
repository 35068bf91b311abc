/**
 * The processes of the actor benchmark (`bench/actors.ts` forks them; each talks to it over IPC):
 *
 *   sender <url> <prefix> <mode: bare|actor> <count> <ids> <tag>
 *       publishes `count` messages, 64 in flight (`bare`: `core/Stream.publish` to `bench.<id>`;
 *       `actor`: `Mailbox.send` to the `counter` actor), and answers `{ t0, t1, cpuUs }`; then, on
 *       `{ paced }`, sends that many more at 500/s and answers `{ pacedDone }`.
 *   consumer <url>
 *       the bare loop's consumer: one pull consumer on the BENCH stream, acking every message.
 *   worker <url> <prefix> <groupMax>
 *       an actor worker for `counter` (every message a state write and its log line, rendered and
 *       dropped below warnings).
 *
 * A consumer or worker reports `{ owned }` until told `{ go }`, then `{ handled, lastAt }` every
 * 20 ms; on `{ report }` it answers `{ latencies, cpuUs }`: send → handled of the paced messages
 * and its CPU since `go`. Times are epoch ms with sub-millisecond precision (`timeOrigin + now`), so
 * they compare across processes.
 */
import { Context, Effect, Layer, Logger, Schema } from "effect"
import * as Mailbox from "../core/actors/Mailbox.ts"
import { ActorSettings } from "../core/actors/Settings.ts"
import * as Worker from "../core/actors/Worker.ts"
import { jsonLogger } from "../core/Log.ts"
import * as Nats from "../core/Nats.ts"
import * as Storage from "../core/Storage.ts"
import * as JsStream from "../core/Stream.ts"
import * as Actor from "../schema/actors/Actor.ts"

export const now = () => performance.timeOrigin + performance.now()

/** One message body: when it was sent, and whether its latency counts (the paced phase). */
const Inc = Schema.TaggedStruct("Inc", { sentAt: Schema.Number, paced: Schema.Boolean })

let handled = 0
let lastAt = 0
const latencies: Array<number> = []
const record = (sentAt: number, paced: boolean) => {
  const at = now()
  handled++
  lastAt = at
  if (paced) latencies.push(at - sentAt)
}

/**
 * The benchmark's actor: counts. A message counts as handled when the runtime logs it, after its
 * state write and ack; the handler only notes when it was sent, by stream sequence.
 */
export const Counter = Actor.make({
  name: "counter",
  state: Schema.Struct({ count: Schema.Number }),
  initial: { count: 0 },
  message: Schema.Union(Inc),
  handler: (state, message, ctx) =>
    Effect.sync(() => {
      sent.set(ctx.seq, message)
      return { state: { count: state.count + 1 } }
    }),
})
const sent = new Map<number, { readonly sentAt: number; readonly paced: boolean }>()
const seqOf = /"msg":"handled".*"seq":(\d+),"outcome":"applied"/

type FromParent = { go: true } | { report: true } | { paced: number }
const send = (message: unknown) => process.send?.(message)
const onParent = (handler: (m: FromParent) => void) => process.on("message", (m) => handler(m as FromParent))

/** Until `go`, reports what it owns; after, its progress every 20 ms; answers `report`. */
const reportLoop = (owned: () => Promise<number>) => {
  let cpu0 = process.cpuUsage()
  let going = false
  const ownedTimer = setInterval(() => {
    if (!going) void owned().then((n) => send({ owned: n }))
  }, 20)
  onParent((m) => {
    if ("go" in m) {
      going = true
      clearInterval(ownedTimer)
      handled = 0
      cpu0 = process.cpuUsage()
      setInterval(() => send({ handled, lastAt }), 20)
    } else if ("report" in m) {
      const cpu = process.cpuUsage(cpu0)
      send({ latencies, cpuUs: cpu.user + cpu.system })
    }
  })
}

const quiet = Logger.replace(
  Logger.defaultLogger,
  jsonLogger((line) => {
    // Rendered either way (its cost counts); only warnings and errors are shown.
    if (!line.includes('"level":"info"')) return process.stderr.write(`${line}\n`)
    const seq = seqOf.exec(line)?.[1]
    const message = seq === undefined ? undefined : sent.get(Number(seq))
    if (message === undefined) return
    sent.delete(Number(seq))
    record(message.sentAt, message.paced)
  }),
)

const [role, url = "", ...rest] = process.argv.slice(2)

if (role === "sender") {
  const [prefix = "", mode = "", count = "0", ids = "1", tag = ""] = rest
  const n = Number(count)
  const idCount = Number(ids)
  await Effect.runPromise(
    Effect.gen(function* () {
      const mailbox = yield* Mailbox.Mailbox
      const one = (i: number, paced: boolean) => {
        const body = { _tag: "Inc" as const, sentAt: now(), paced }
        const msgId = `${tag}${paced ? "p" : "t"}${i}`
        return mode === "bare"
          ? Effect.asVoid(JsStream.publish(`bench.${i % idCount}`, JSON.stringify(body), { msgId }))
          : mailbox.send(Counter, `c${i % idCount}`, body, { msgId })
      }
      const cpu0 = process.cpuUsage()
      const t0 = now()
      yield* Effect.forEach(
        Array.from({ length: n }, (_, i) => i),
        (i) => one(i, false),
        { concurrency: 64, discard: true },
      )
      const cpu = process.cpuUsage(cpu0)
      send({ t0, t1: now(), cpuUs: cpu.user + cpu.system })
      const paced = yield* Effect.async<number>((resume) => {
        onParent((m) => {
          if ("paced" in m) resume(Effect.succeed(m.paced))
        })
      })
      const start = now()
      const fibers = []
      for (let i = 0; i < paced; i++) {
        const wait = start + (i * 1000) / 500 - now()
        if (wait > 0) yield* Effect.sleep(`${wait} millis`)
        fibers.push(yield* Effect.fork(one(i, true)))
      }
      for (const f of fibers) yield* f.await
      send({ pacedDone: true })
    }).pipe(
      Effect.provide(
        Mailbox.layer.pipe(
          Layer.provideMerge(Storage.layerPrefix(prefix)),
          Layer.provideMerge(ActorSettings.layer({})),
          Layer.provideMerge(Nats.layerUrl(url, "bench-sender")),
        ),
      ),
    ),
  )
} else if (role === "consumer") {
  await Effect.runPromise(
    Effect.gen(function* () {
      const { js } = yield* Nats.Nats
      const consumer = yield* Effect.promise(() => js.consumers.get("BENCH", "b"))
      yield* Effect.promise(() =>
        consumer.consume({
          callback: (m) => {
            const body = m.json() as { sentAt: number; paced: boolean }
            record(body.sentAt, body.paced)
            m.ack()
          },
        }),
      )
      reportLoop(async () => 1)
      yield* Effect.never
    }).pipe(Effect.provide(Nats.layerUrl(url, "bench-consumer"))),
  )
} else if (role === "worker") {
  const [prefix = "", groupMax = "64"] = rest
  await Effect.runPromise(
    Effect.gen(function* () {
      const worker = Context.get(
        yield* Layer.build(
          Worker.layer([Counter]).pipe(
            Layer.provide(Storage.layerPrefix(prefix)),
            Layer.provide(ActorSettings.layer({ groupMax: Number(groupMax) })),
            Layer.provide(Nats.layerUrl(url, "bench-worker")),
            Layer.provide(quiet),
          ),
        ),
        Worker.Worker,
      )
      reportLoop(() => Effect.runPromise(Effect.map(worker.owned, (o) => o.length)))
      yield* Effect.never
    }).pipe(Effect.scoped),
  )
}

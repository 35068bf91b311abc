/**
 * Actor runtime benchmark (prints figures; not a test). One local nats-server; every role is its
 * own process, as in a deployment (`bench/actors-child.ts`): a sender (a client: 64 sends in
 * flight), and either
 *
 * - baseline: a bare JetStream loop (the sender publishes with a msg id through `core/Stream`,
 *   one pull consumer process acks each message), or
 * - the runtime: 1 or 2 worker processes for one actor type over 256 ids; every message a handler
 *   run, a state write (compare-and-set) and its log line (rendered as JSON, dropped).
 *
 * Throughput: N messages sent as fast as acknowledged; the rate is N over the time from the first
 * send to the last handled, the CPU the consumer's (or workers') own per message. The runtime row
 * with `group max 1` writes state once per message (no group commit) for comparison.
 * Latency: messages sent at a steady 500/s; send → handled, p50/p99.
 *
 * Run: node --import tsx bench/actors.ts [N]
 */
import { type ChildProcess, fork } from "node:child_process"
import { join } from "node:path"
import { AckPolicy, DeliverPolicy } from "@nats-io/jetstream"
import { Effect } from "effect"
import * as Nats from "../core/Nats.ts"
import { root } from "../deploy/tools.mjs"
import { startNatsServer } from "../test/harness/NatsServer.ts"

const N = Number(process.argv[2] ?? 20_000)
const IDS = 256
const PACED = 1_500
const PARTITIONS = 32

const pct = (xs: ReadonlyArray<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN
}

interface Child {
  readonly process: ChildProcess
  /** The next message `test` accepts. */
  readonly next: <A>(test: (m: Record<string, unknown>) => A | undefined) => Promise<A>
  /** The latest message with `key`. */
  readonly latest: (key: string) => Record<string, unknown> | undefined
  readonly send: (m: unknown) => void
}

const start = (...args: Array<string>): Child => {
  const child = fork(join(root, "bench", "actors-child.ts"), args, {
    execArgv: ["--import", "tsx"],
    cwd: root,
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  })
  const latest = new Map<string, Record<string, unknown>>()
  const waiters = new Set<(m: Record<string, unknown>) => void>()
  child.on("message", (raw) => {
    const m = raw as Record<string, unknown>
    for (const key of Object.keys(m)) latest.set(key, m)
    for (const w of [...waiters]) w(m)
  })
  return {
    process: child,
    next: (test) =>
      new Promise((resolve, reject) => {
        const w = (m: Record<string, unknown>) => {
          const value = test(m)
          if (value === undefined) return
          waiters.delete(w)
          resolve(value)
        }
        waiters.add(w)
        child.once("exit", (code) => reject(new Error(`${args[0]} exited with ${code}`)))
      }),
    latest: (key) => latest.get(key),
    send: (m) => child.send(m as never),
  }
}

const stop = (child: Child) =>
  new Promise<void>((resolve) => {
    if (child.process.exitCode !== null) return resolve()
    child.process.once("exit", () => resolve())
    child.process.kill("SIGTERM")
  })

/** Sum of `handled` over `consumers` once it reaches `count`, with the latest handled time. */
const handledAll = async (consumers: ReadonlyArray<Child>, count: number) => {
  while (true) {
    const seen = consumers.map((c) => c.latest("handled"))
    const total = seen.reduce((a, m) => a + Number(m?.handled ?? 0), 0)
    if (total >= count) return Math.max(...seen.map((m) => Number(m?.lastAt ?? 0)))
    await new Promise((r) => setTimeout(r, 10))
  }
}

interface Row {
  readonly label: string
  readonly rate: number
  readonly cpuPerMessageUs: number
  readonly senderRate: number
  readonly latencies: ReadonlyArray<number>
}

/** One measured run: consumers (already holding their partitions), a sender, throughput then pacing. */
const measure = async (
  label: string,
  consumers: ReadonlyArray<Child>,
  sender: (tag: string) => Child,
): Promise<Row> => {
  for (const c of consumers) c.send({ go: true })
  const s = sender(label.replace(/\W/g, ""))
  const sent = await s.next((m) => ("t0" in m ? m : undefined))
  const t0 = Number(sent.t0)
  const last = await handledAll(consumers, N)
  const rate = N / ((last - t0) / 1000)
  const senderRate = N / ((Number(sent.t1) - t0) / 1000)
  s.send({ paced: PACED })
  await s.next((m) => ("pacedDone" in m ? true : undefined))
  await handledAll(consumers, N + PACED)
  const reports = await Promise.all(
    consumers.map((c) => {
      const answer = c.next((m) => ("latencies" in m ? m : undefined))
      c.send({ report: true })
      return answer
    }),
  )
  await stop(s)
  const latencies = reports.flatMap((r) => r.latencies as Array<number>)
  // CPU of the consumers over the whole run (throughput and paced phase) per message handled.
  const cpu = reports.reduce((a, r) => a + Number(r.cpuUs), 0)
  return { label, rate, senderRate, latencies, cpuPerMessageUs: cpu / (N + PACED) }
}

const print = (row: Row) =>
  console.log(
    `${row.label.padEnd(34)} ${row.rate.toFixed(0).padStart(7)} msg/s   p50 ${pct(row.latencies, 50).toFixed(2)} ms   p99 ${pct(row.latencies, 99).toFixed(2)} ms   ${row.cpuPerMessageUs.toFixed(0).padStart(4)} µs CPU/msg   (sender ${row.senderRate.toFixed(0)} msg/s)`,
  )

const bare = async (url: string) => {
  await Effect.runPromise(
    Effect.gen(function* () {
      const { jsm } = yield* Nats.Nats
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
    }).pipe(Effect.provide(Nats.layerUrl(url, "bench-setup")), Effect.scoped),
  )
  const consumer = start("consumer", url)
  await consumer.next((m) => ("owned" in m ? true : undefined))
  const row = await measure("bare JetStream loop", [consumer], (tag) =>
    start("sender", url, "bench-bare", "bare", String(N), String(IDS), tag),
  )
  await stop(consumer)
  return row
}

const actors = async (url: string, workers: number, groupMax: number) => {
  const prefix = `bench${workers}g${groupMax}`
  const children = Array.from({ length: workers }, () => start("worker", url, prefix, String(groupMax)))
  // From the moment every worker holds its share of the partitions.
  while (true) {
    const owned = children.map((c) => Number(c.latest("owned")?.owned ?? 0))
    const total = owned.reduce((a, b) => a + b, 0)
    if (total === PARTITIONS && owned.every((o) => o >= Math.floor(PARTITIONS / workers))) break
    await new Promise((r) => setTimeout(r, 20))
  }
  const label = `actors, ${workers} worker${workers > 1 ? "s" : ""}${groupMax === 1 ? ", group max 1" : ""}`
  const row = await measure(label, children, (tag) =>
    start("sender", url, prefix, "actor", String(N), String(IDS), tag),
  )
  await Promise.all(children.map(stop))
  return row
}

const server = await startNatsServer({ syncAlways: false })
try {
  console.log(
    `nats-server ${server.url} (sync_interval default), ${N} messages, ${IDS} actor ids, ${PARTITIONS} partitions, one process per role`,
  )
  const base = await bare(server.url)
  print(base)
  const rows = [
    await actors(server.url, 1, 64),
    await actors(server.url, 2, 64),
    await actors(server.url, 1, 1),
  ]
  for (const row of rows) print(row)
  console.log(
    `actors/bare: ${rows.map((r) => `${r.label.replace("actors, ", "")} ${((100 * r.rate) / base.rate).toFixed(0)}%`).join(", ")}`,
  )
} finally {
  await server.stop()
}
process.exit(0)

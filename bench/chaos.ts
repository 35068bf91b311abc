/**
 * Faults while runs are going (issues 16 and 24): rounds of `runs` agentless runs at once, each
 * `commands` commands (`bash` appending a line each, a copy of the lines to the output, then
 * `finish`), driven by the careful client of `test/harness/Chaos.ts` (the spec's retry rule with an
 * `Idempotency-Key`; a connection error or a 503 moves it to another gateway). The fault is injected
 * once a third of all commands have ended, and the process (or server) comes back 3 s later (the
 * SIGSTOP lasts 15 s).
 *
 * Two shapes:
 * - single (the default): for each fault a fresh stack with a process per role on one nats-server
 *   (fsyncing as deployed), as issue 16 measured it.
 * - `cluster`: one stack on a 3-node JetStream cluster with every store R3 and two gateways, two
 *   actor workers and three host agents, each its own process (`clusterStack`); the faults hit it
 *   one round after another (a node SIGKILLed and restarted on its store, the first gateway, the
 *   first actor worker, the first host agent, a node SIGSTOPped 15 s).
 *
 * Printed per fault: runs that succeeded, runs lost (failed, with their causes), 500s a client saw,
 * commands applied more than once, commands that ended failed (a restarted host agent ends the
 * ones it had in flight so), appended lines missing, doubled or unknown in the outputs, whether each
 * output matched its sha256 and held its lines, whether each run's billed minutes equal its started
 * minutes, the round's wall time, and what was left on the host. Prints figures; asserts nothing.
 *
 *   node --import tsx bench/chaos.ts [cluster] [runs=30] [commands=18] [faults=all|none,actor,gateway,host,nats,SIGSTOP]
 */
import {
  type Client,
  client,
  clusterStack,
  type Fault,
  type RunOutcome,
  round,
} from "../test/harness/Chaos.ts"
import { createAccount, publish, type Stack, startStack } from "../test/harness/Stack.ts"

const args = process.argv.slice(2)
const cluster = args[0] === "cluster"
if (cluster) args.shift()
const runs = Number(args[0] ?? 30)
const commands = Math.max(3, Number(args[1] ?? 18))
const filter = args[2]

/** The faults of the single shape, on the stack of their round. */
const single: Record<string, (s: Stack) => Fault> = {
  none: () => ({ inject: async () => {}, heal: async () => {}, downMs: 0 }),
  "kill -9 actor worker": (s) => ({ inject: s.killActors, heal: s.startActors, downMs: 3_000 }),
  "kill -9 gateway": (s) => ({ inject: s.killGateway, heal: s.startGateway, downMs: 3_000 }),
  "kill -9 host agent": (s) => ({ inject: s.killHost, heal: s.startHost, downMs: 3_000 }),
  "kill -9 nats-server": (s) => ({ inject: s.killNats, heal: s.restartNats, downMs: 3_000 }),
  "SIGSTOP nats-server 15 s": (s) => ({
    inject: async () => {
      process.kill(s.natsPid, "SIGSTOP")
    },
    heal: async () => {
      process.kill(s.natsPid, "SIGCONT")
    },
    downMs: 15_000,
  }),
}

/** The faults of the cluster shape, on its one stack. */
const clustered: Record<string, (c: Awaited<ReturnType<typeof clusterStack>>) => Fault> = {
  none: single.none as () => Fault,
  "kill -9 nats-server node": (c) => ({
    inject: c.cluster.nodes[0]!.kill,
    heal: c.cluster.nodes[0]!.restart,
    downMs: 3_000,
  }),
  "kill -9 gateway": (c) => ({ inject: c.stack.killGateway, heal: c.stack.startGateway, downMs: 3_000 }),
  "kill -9 actor worker": (c) => ({ inject: c.stack.killActors, heal: c.stack.startActors, downMs: 3_000 }),
  "kill -9 host agent": (c) => ({ inject: c.stack.killHost, heal: c.stack.startHost, downMs: 3_000 }),
  "SIGSTOP nats-server node 15 s": (c) => ({
    inject: async () => {
      process.kill(c.cluster.nodes[1]!.pid, "SIGSTOP")
    },
    heal: async () => {
      process.kill(c.cluster.nodes[1]!.pid, "SIGCONT")
    },
    downMs: 15_000,
  }),
}

const names = Object.keys(cluster ? clustered : single)
/** The faults named (by any part of their name, comma-separated), or all. */
const wanted =
  filter === undefined || filter === "all"
    ? names
    : names.filter((f) => filter.split(",").some((w) => f.includes(w)))
const appends = commands - 2

const notes: Array<string> = []
/** One table row (and its notes) from a round's outcomes. */
const row = (fault: string, c: Client, outcomes: ReadonlyArray<RunOutcome>, wallMs: number) => {
  const ok = outcomes.filter((o) => o.state === "succeeded").length
  const causes = new Map<string, number>()
  for (const o of outcomes.filter((o) => o.state !== "succeeded"))
    causes.set(o.failure ?? o.state, (causes.get(o.failure ?? o.state) ?? 0) + 1)
  const lost = outcomes.flatMap((o) => (o.detail === undefined || o.state === "succeeded" ? [] : [o.detail]))
  for (const d of new Set(lost)) notes.push(`${fault}: lost: ${d}`)
  for (const w of c.seen.where) notes.push(`${fault}: 500 for ${w}`)
  const odd = [...c.seen.statuses].filter(([s]) => s === 0 || s >= 400)
  if (odd.length > 0)
    notes.push(
      `${fault}: answers other than 2xx: ${odd.map(([s, n]) => `${n}×${s === 0 ? "no connection" : s}`).join(", ")}`,
    )
  for (const o of outcomes) for (const p of o.problems) notes.push(`${fault}: ${o.run}: ${p}`)
  for (const a of outcomes.flatMap((o) => o.startedAgain ?? [])) notes.push(`${fault}: started again: ${a}`)
  const late = outcomes.filter((o) => o.ledgerLagMs > 0)
  if (late.length > 0)
    notes.push(
      `${fault}: the ledger held the started minutes of ${late.length} runs only up to ${Math.ceil(Math.max(...late.map((o) => o.ledgerLagMs)) / 1000)} s after their end was read`,
    )
  const sum = (f: (o: RunOutcome) => number) => outcomes.reduce((n, o) => n + f(o), 0)
  const outputs = outcomes.filter((o) => o.outputOk !== undefined)
  console.log(
    `| ${fault} | ${ok} | ${outcomes.length - ok} | ${[...causes].map(([k, n]) => `${n} ${k}`).join(", ") || "—"} | ${c.seen.fiveHundreds} | ${sum((o) => Math.max(0, o.extra))} | ${sum((o) => o.failedCommands)} | ${sum((o) => o.linesWrong)} | ${outputs.filter((o) => o.outputOk).length}/${outputs.length} | ${outcomes.every((o) => o.billed === o.startedMinutes) ? "yes" : "no"} | ${c.seen.retried} | ${(wallMs / 1000).toFixed(1)} s |`,
  )
}

console.log(
  `rounds of ${runs} runs at once, ${commands} commands each, a process per role, ${cluster ? "a 3-node cluster (R3), 2 gateways, 2 actor workers, 3 host agents" : "one nats-server"}`,
)
console.log(
  "| Fault | Runs ok | Runs lost | Lost as | 500s seen | Commands applied twice | Commands failed | Lines wrong | Outputs intact | Ledger = started minutes | Requests retried | Round |",
)
console.log("|---|---|---|---|---|---|---|---|---|---|---|---|")
if (cluster) {
  const minuteMs = 5_000
  const c = await clusterStack({
    hostVcpus: Math.ceil(runs / 3),
    hostMemoryMib: Math.ceil(runs / 3) * 2048,
    minuteMs,
    queueTimeoutMs: 600_000,
  })
  try {
    for (const fault of wanted) {
      // An account per round: its owner's token (for the ledger) lives 10 minutes.
      const acct = await createAccount(c.stack, { creditUsd: 1000, memoryMib: runs * 2048 })
      const fn = await publish(c.stack, acct, { timeout_minutes: 30 })
      const seen = client(c.urls)
      const plan = { function: fn.function, appends, minuteMs, runs: c.stack.runs }
      const r = await round(seen, acct, plan, runs, clustered[fault]!(c))
      row(fault, seen, r.outcomes, r.wallMs)
    }
  } finally {
    const left = await c.close()
    if (left.length > 0) notes.push(`left on the hosts: ${left.join(", ")}`)
  }
} else {
  for (const fault of wanted) {
    const stack = await startStack({
      processes: true,
      natsSyncAlways: true,
      hostVcpus: runs,
      hostMemoryMib: runs * 2048,
    })
    try {
      const acct = await createAccount(stack, { creditUsd: 1000 })
      const fn = await publish(stack, acct, { timeout_minutes: 30 })
      const seen = client([stack.url])
      const plan = { function: fn.function, appends, minuteMs: 60_000, runs: stack.runs }
      const r = await round(seen, acct, plan, runs, single[fault]!(stack))
      row(fault, seen, r.outcomes, r.wallMs)
    } finally {
      const left = await stack.close()
      if (left.length > 0) notes.push(`${fault}: left on the host: ${left.join(", ")}`)
    }
  }
}
for (const note of notes) console.log(`  ${note}`)

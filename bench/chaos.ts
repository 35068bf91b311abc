/**
 * Faults while runs are going (issue 16's table): for each fault, a fresh stack with a process per
 * role (`test/harness/Stack.ts`, namespace driver, nats-server fsyncing as deployed) runs a round of
 * `runs` agentless runs at once, `commands` commands each (`bash`, the last writing the output,
 * then `finish`), driven by a client that follows the spec's retry rule with an `Idempotency-Key`
 * (retry `internal`, `conflict`, 503 and 429 after `Retry-After` or a short backoff; connection
 * errors too). The fault is injected once a third of all commands have ended, and the process (or server)
 * comes back 3 s later (the SIGSTOP lasts 15 s).
 *
 * Printed per fault: runs that succeeded, runs lost (failed, with their causes), 500s a client saw,
 * commands that ended failed (a restarted host agent ends the ones it had in flight so),
 * commands applied more than once, whether each run's billed minutes equal its started minutes, the
 * round's wall time, and what was left on the host. Prints figures; asserts nothing.
 *
 *   node --import tsx bench/chaos.ts [runs=30] [commands=18] [faults=all|none,actor,gateway,host,nats,SIGSTOP]
 */
import { randomUUID } from "node:crypto"
import {
  type Answer,
  call,
  createAccount,
  publish,
  type Stack,
  startStack,
  type TestAccount,
} from "../test/harness/Stack.ts"

const runs = Number(process.argv[2] ?? 30)
const commands = Math.max(2, Number(process.argv[3] ?? 18))
const faults = {
  none: { inject: async () => {}, heal: async () => {}, downMs: 0 },
  "kill -9 actor worker": {
    inject: (s: Stack) => s.killActors(),
    heal: (s: Stack) => s.startActors(),
    downMs: 3_000,
  },
  "kill -9 gateway": {
    inject: (s: Stack) => s.killGateway(),
    heal: (s: Stack) => s.startGateway(),
    downMs: 3_000,
  },
  "kill -9 host agent": {
    inject: (s: Stack) => s.killHost(),
    heal: (s: Stack) => s.startHost(),
    downMs: 3_000,
  },
  "kill -9 nats-server": {
    inject: (s: Stack) => s.killNats(),
    heal: (s: Stack) => s.restartNats(),
    downMs: 3_000,
  },
  "SIGSTOP nats-server 15 s": {
    inject: async (s: Stack) => {
      process.kill(s.natsPid, "SIGSTOP")
    },
    heal: async (s: Stack) => {
      process.kill(s.natsPid, "SIGCONT")
    },
    downMs: 15_000,
  },
} as const
type Fault = keyof typeof faults
const names = Object.keys(faults) as Array<Fault>
const filter = process.argv[4]
/** The faults named (by any part of their name, comma-separated), or all. */
const wanted =
  filter === undefined || filter === "all"
    ? names
    : names.filter((f) => filter.split(",").some((w) => f.includes(w)))

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

interface Seen {
  fiveHundreds: number
  /** What answered 500: method, route (ids left out) and the answer. */
  readonly where: Set<string>
  statuses: Map<number, number>
}

/** One request as a careful client sends it: retried on the spec's retryable answers, keyed. */
const ask = async (
  stack: Stack,
  seen: Seen,
  method: string,
  path: string,
  headers: Record<string, string>,
  body?: unknown,
): Promise<Answer> => {
  const key: Record<string, string> = method === "POST" ? { "idempotency-key": randomUUID() } : {}
  const deadline = Date.now() + 300_000
  for (let attempt = 0; ; attempt++) {
    const answer = await call(stack, method, path, { ...headers, ...key }, body).catch(
      (): Answer => ({ status: 0, body: undefined, text: "", headers: {} }),
    )
    seen.statuses.set(answer.status, (seen.statuses.get(answer.status) ?? 0) + 1)
    if (answer.status === 500) {
      seen.fiveHundreds += 1
      seen.where.add(
        `${method} ${path.replace(/(run|cmd|fnc)_[0-9a-z]+/g, "{$1}").replace(/\?.*$/, "")} ${answer.text.slice(0, 120)}`,
      )
    }
    const code = answer.body?.code
    // The spec's retryable codes, 503 while the store is away, and a rate limit after its wait.
    const retry =
      answer.status === 0 ||
      answer.status >= 500 ||
      answer.status === 429 ||
      code === "internal" ||
      code === "conflict"
    if (!retry || Date.now() > deadline) return answer
    const hint = Number(answer.headers["retry-after"])
    await sleep(Number.isFinite(hint) && hint > 0 ? hint * 1000 : Math.min(2_000, 100 * 2 ** attempt))
  }
}

/** Reads until `done` holds (long polls, retried like `ask`). */
const until = async (
  stack: Stack,
  seen: Seen,
  path: string,
  headers: Record<string, string>,
  done: (body: Answer["body"]) => boolean,
): Promise<Answer["body"]> => {
  const deadline = Date.now() + 900_000
  for (;;) {
    const answer = await ask(stack, seen, "GET", path, headers)
    if (answer.status === 200 && done(answer.body)) return answer.body
    if (Date.now() > deadline) throw new Error(`${path} never reached its end: ${answer.text}`)
    if (!path.includes("wait=")) await sleep(200)
  }
}

interface RunOutcome {
  readonly state: string
  readonly failure?: string
  readonly detail?: string
  /** Commands the run holds beyond those the caller made (a retried request applied twice). */
  readonly extra: number
  /** Commands that ended `failed` (a host agent restart ends the ones it had so). */
  readonly failedCommands: number
  readonly billedOk: boolean
}

const oneRun = async (
  stack: Stack,
  acct: TestAccount,
  fn: string,
  seen: Seen,
  ended: () => void,
): Promise<RunOutcome> => {
  const h = acct.admin as Record<string, string>
  const started = await ask(stack, seen, "POST", `/v1/functions/${fn}/runs`, h, { prompt: "go" })
  if (started.status !== 201)
    return { state: `not started (${started.status})`, extra: 0, failedCommands: 0, billedOk: true }
  const run = started.body.id as string
  stack.runs.add(run)
  // Each command is sent once; a caller gets an answer for each, so when the write or the finish
  // did not do its work (a restarted host agent fails the commands it had in flight) the caller
  // sends both again, as a user would, up to three times.
  let accepted = false
  const made = new Set<string>()
  for (let i = 1, again = 0; i <= commands; i++) {
    const [kind, args] =
      i === commands
        ? ["finish", { state: "succeeded" }]
        : i === commands - 1
          ? ["bash", { command: "echo ok > /workspace/out/result.txt" }]
          : ["bash", { command: `echo ${i}` }]
    const sent = await ask(stack, seen, "POST", `/v1/runs/${run}/commands`, h, { kind, arguments: args })
    if (sent.status !== 201) break // the run ended (run_ended) or the command was refused
    made.add(sent.body.id)
    const answer = await until(stack, seen, `/v1/runs/${run}/commands/${sent.body.id}?wait=25`, h, (c) =>
      ["succeeded", "failed", "cancelled"].includes(c?.state),
    )
    ended()
    if (kind === "finish") accepted = answer.state === "succeeded" && answer.result?.accepted === true
    if (kind === "finish" && !accepted && again < 3) {
      again++
      i = commands - 2
    }
  }
  if (!accepted) console.log(`  ${run}: its finish was never accepted`)
  const final = await until(
    stack,
    seen,
    `/v1/runs/${run}`,
    h,
    (r) => r?.state === "succeeded" || r?.state === "failed",
  )
  const list = await until(stack, seen, `/v1/runs/${run}/commands`, h, () => true)
  const usage = await until(stack, seen, "/v1/usage", acct.owner as Record<string, string>, () => true)
  const entries = (usage?.entries ?? []).filter((e: { run?: string }) => e.run === run)
  const billed = entries.reduce(
    (n: number, e: { from_minute: number; through_minute: number }) =>
      n + e.through_minute - e.from_minute + 1,
    0,
  )
  const ran = Date.parse(final.ended_at) - Date.parse(final.started_at ?? final.ended_at)
  const startedMinutes = final.started_at === undefined ? 0 : Math.max(1, Math.ceil(ran / 60_000))
  return {
    state: final.state,
    ...(final.failure === undefined ? {} : { failure: final.failure }),
    ...(final.detail === undefined ? {} : { detail: final.detail }),
    extra: list.commands.length - made.size,
    failedCommands: list.commands.filter((c: { state: string }) => c.state === "failed").length,
    billedOk: billed === startedMinutes,
  }
}

const round = async (fault: Fault) => {
  const stack = await startStack({
    processes: true,
    natsSyncAlways: true,
    hostVcpus: runs,
    hostMemoryMib: runs * 2048,
  })
  const seen: Seen = { fiveHundreds: 0, where: new Set(), statuses: new Map() }
  let leftovers: ReadonlyArray<string> = []
  try {
    const acct = await createAccount(stack, { creditUsd: 1000 })
    const fn = await publish(stack, acct, { timeout_minutes: 30 })
    const { inject, heal, downMs } = faults[fault]
    let done = 0
    let injected: Promise<void> | undefined
    const at = Math.floor((runs * commands) / 3)
    const began = Date.now()
    const outcomes = await Promise.all(
      Array.from({ length: runs }, () =>
        oneRun(stack, acct, fn.function, seen, () => {
          done += 1
          if (done === at && fault !== "none")
            injected = (async () => {
              await inject(stack)
              await sleep(downMs)
              await heal(stack)
            })()
        }),
      ),
    )
    await injected
    const wall = Date.now() - began
    const ok = outcomes.filter((o) => o.state === "succeeded").length
    const causes = new Map<string, number>()
    for (const o of outcomes.filter((o) => o.state !== "succeeded"))
      causes.set(o.failure ?? o.state, (causes.get(o.failure ?? o.state) ?? 0) + 1)
    const twice = outcomes.filter((o) => o.extra > 0).length
    const details = [
      ...new Set(
        outcomes.flatMap((o) => (o.detail === undefined || o.state === "succeeded" ? [] : [o.detail])),
      ),
    ]
    const billed = outcomes.every((o) => o.billedOk)
    const failedCommands = outcomes.reduce((n, o) => n + o.failedCommands, 0)
    return { ok, lost: runs - ok, causes, details, twice, failedCommands, billed, wall, seen, stack }
  } finally {
    leftovers = await stack.close()
    if (leftovers.length > 0) console.log(`  ${fault}: left on the host: ${leftovers.join(", ")}`)
  }
}

console.log(`rounds of ${runs} runs at once, ${commands} commands each, a process per role`)
console.log(
  "| Fault | Runs ok | Runs lost | Lost as | 500s seen | Commands applied twice | Commands failed | Ledger = started minutes | Round |",
)
console.log("|---|---|---|---|---|---|---|---|---|")
const notes: Array<string> = []
for (const fault of wanted) {
  const r = await round(fault)
  for (const d of r.details) notes.push(`${fault}: lost: ${d}`)
  for (const w of r.seen.where) notes.push(`${fault}: 500 for ${w}`)
  const causes = [...r.causes].map(([c, n]) => `${n} ${c}`).join(", ") || "—"
  console.log(
    `| ${fault} | ${r.ok} | ${r.lost} | ${causes} | ${r.seen.fiveHundreds} | ${r.twice} | ${r.failedCommands} | ${r.billed ? "yes" : "no"} | ${(r.wall / 1000).toFixed(1)} s |`,
  )
}
for (const note of notes) console.log(`  ${note}`)

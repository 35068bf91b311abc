/**
 * A careful client for runs under faults, shared by `bench/chaos.ts` (figures) and
 * `test/chaos.cluster.heavy.test.ts` (assertions): it follows the spec's retry rule and checks,
 * per run, everything a fault could have broken.
 *
 * - `ask` sends one request as the spec asks a client to: a POST carries an `Idempotency-Key`, and
 *   the request is sent again on a connection error, a 503, a 429 (after its `Retry-After`) and the
 *   retryable codes `internal` and `conflict`. A connection error or a 503 moves it to the next of
 *   the client's gateways (a killed gateway's clients go to another). Every 500 is counted with its
 *   route: a fault may make a client wait, never answer it 500.
 * - `oneRun` starts a run, appends one line per `bash` command to `/workspace/lines`, copies the
 *   file to the output and finishes; then it reads back the run, its commands, its output and the
 *   account's ledger, and says what is wrong, if anything (`RunOutcome`).
 */
import { spawnSync } from "node:child_process"
import { createHash, randomBytes, randomUUID } from "node:crypto"
import { Effect, Option, Schedule, Schema } from "effect"
import * as Kv from "../../core/Kv.ts"
import { Storage } from "../../core/Storage.ts"
import { derivedId } from "../../host-agent/registry/HostSettings.ts"
import { clusterLeases, type NatsCluster, startNatsCluster } from "./NatsCluster.ts"
import { freePort } from "./Ports.ts"
import {
  type Answer,
  call,
  type ExtraRole,
  type Headers,
  request,
  type Stack,
  type StackOptions,
  startStack,
  type TestAccount,
} from "./Stack.ts"

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** What the clients of one round saw. */
export interface Seen {
  fiveHundreds: number
  /** What answered 500: method, route (ids left out) and the answer. */
  readonly where: Set<string>
  /** Answers by status (0: a connection error). */
  readonly statuses: Map<number, number>
  /** Requests sent again (a retryable answer or a connection error). */
  retried: number
}

/** A client over one or more gateways (their base URLs), with what it saw. */
export interface Client {
  readonly urls: ReadonlyArray<string>
  readonly seen: Seen
  /** The gateway the next request starts on (requests go round the gateways). */
  next: number
}

/** A fresh client over `urls`. */
export const client = (urls: ReadonlyArray<string>): Client => ({
  urls,
  seen: { fiveHundreds: 0, where: new Set(), statuses: new Map(), retried: 0 },
  next: 0,
})

/** A route with its ids and query left out, as `Seen.where` lists it. */
const route = (path: string) => path.replace(/(run|cmd|fnc)_[0-9a-z]+/g, "{$1}").replace(/\?.*$/, "")

/**
 * One request as a careful client sends it: keyed when it is a POST (the same key on every
 * attempt, so a retried write is applied once), sent again on the spec's retryable answers for up to
 * `deadlineMs`, and moved to the next gateway on a connection error or a 503. Answers the last answer.
 */
export const ask = async (
  c: Client,
  method: string,
  path: string,
  headers: Headers,
  body?: unknown,
  deadlineMs = 300_000,
): Promise<Answer> => {
  const key: Headers = method === "POST" ? { "idempotency-key": randomUUID() } : {}
  const deadline = Date.now() + deadlineMs
  let gateway = c.next++ % c.urls.length
  for (let attempt = 0; ; attempt++) {
    const answer = await call({ url: c.urls[gateway]! }, method, path, { ...headers, ...key }, body).catch(
      (e: unknown): Answer => ({ status: 0, body: undefined, text: String(e), headers: {} }),
    )
    c.seen.statuses.set(answer.status, (c.seen.statuses.get(answer.status) ?? 0) + 1)
    if (answer.status === 500) {
      c.seen.fiveHundreds += 1
      c.seen.where.add(`${method} ${route(path)} ${answer.text.slice(0, 120)}`)
    }
    const code = answer.body?.code
    const retry =
      answer.status === 0 ||
      answer.status >= 500 ||
      answer.status === 429 ||
      code === "internal" ||
      code === "conflict"
    if (!retry || Date.now() > deadline) return answer
    c.seen.retried += 1
    if (answer.status === 0 || answer.status === 503) gateway = (gateway + 1) % c.urls.length
    const hint = Number(answer.headers["retry-after"])
    await sleep(Number.isFinite(hint) && hint > 0 ? hint * 1000 : Math.min(2_000, 100 * 2 ** attempt))
  }
}

/**
 * Reads `path` (retried like `ask`) until `done` holds of its 200 body; throws at once on a refusal
 * (a 4xx `ask` does not retry, such as an expired token's 401), and after `deadlineMs`.
 */
export const until = async (
  c: Client,
  path: string,
  headers: Headers,
  done: (body: Answer["body"]) => boolean,
  deadlineMs = 900_000,
): Promise<Answer["body"]> => {
  const deadline = Date.now() + deadlineMs
  for (;;) {
    const answer = await ask(c, "GET", path, headers)
    if (answer.status === 200 && done(answer.body)) return answer.body
    if (answer.status >= 400 && answer.status < 500)
      throw new Error(`GET ${path}: ${answer.status} ${answer.text.slice(0, 200)}`)
    if (Date.now() > deadline) throw new Error(`${path} never reached its end: ${answer.text}`)
    if (!path.includes("wait=")) await sleep(200)
  }
}

/** What became of one run, and what is wrong with it (`problems` empty: nothing). */
export interface RunOutcome {
  readonly run?: string
  /** `succeeded`, `failed`, or `not started (status)`. */
  readonly state: string
  readonly failure?: string
  readonly detail?: string
  /** Commands the run holds beyond those the client made (a retried request applied twice). */
  readonly extra: number
  /** Commands that ended `failed` (a restarted host agent ends the ones it had in flight so). */
  readonly failedCommands: number
  /** Appended lines missing, doubled or unknown in the output's `result.txt` (succeeded runs). */
  readonly linesWrong: number
  /** Whether the output downloaded matches its sha256 and holds the lines; undefined: no output. */
  readonly outputOk?: boolean
  /** Minutes the ledger billed the run, and the run's started minutes. */
  readonly billed: number
  readonly startedMinutes: number
  /** Runs started before this one that failed `infrastructure` before they started, with why. */
  readonly startedAgain?: ReadonlyArray<string>
  /** How long after the run's end was read the ledger first held its started minutes (0: at once). */
  readonly ledgerLagMs: number
  /** Each thing found wrong, in words (extra commands, lines, output, ledger). */
  readonly problems: ReadonlyArray<string>
}

/** The commands' terminal states. */
const ended = (c: Answer["body"]) => ["succeeded", "failed", "cancelled"].includes(c?.state)

/** The file `path` of a `.tar.gz` archive, or undefined when it has none. */
export const fileIn = (archive: Buffer, path: string): string | undefined => {
  const listed = spawnSync("tar", ["-tzf", "-"], { input: archive }).stdout.toString("utf8").split("\n")
  const entry = listed.find((e) => e === path || e.endsWith(`/${path}`))
  if (entry === undefined) return undefined
  const r = spawnSync("tar", ["-xzOf", "-", entry], { input: archive })
  return r.status === 0 ? r.stdout.toString("utf8") : undefined
}

/** The run's output archive, fetched by the link of a fresh read of the run (retried). */
const download = async (c: Client, run: string, headers: Headers): Promise<Answer["body"]> => {
  for (let attempt = 0; ; attempt++) {
    const record = await until(c, `/v1/runs/${run}`, headers, () => true)
    const got = await request(record.output.url).catch(() => undefined)
    if (got?.status === 200 || attempt >= 10) return { record, data: got?.data }
    await sleep(1_000)
  }
}

/** What a run does and how it is checked (`oneRun`). */
export interface RunPlan {
  readonly function: string
  /** `bash` commands appending a line each. */
  readonly appends: number
  /** The stack's `HANGAR_RUN_MINUTE_MS` (the ledger is checked against it). */
  readonly minuteMs: number
  /** Each run started is added here (the stack's `runs`: what `close` looks for on the host). */
  readonly runs: Set<string>
  /** Called as each command the client waited for ends (a round injects its fault on a count). */
  readonly onCommandEnded?: () => void
}

/**
 * One run driven to its end: `appends` commands `echo line-i >> /workspace/lines`, a copy of the file
 * to `/workspace/out/result.txt`, then `finish` succeeded. Each command is sent once; when the copy
 * or the finish did not do its work (a restarted host agent fails the commands it had in flight),
 * the client sends both again, up to three times, as a user would. Then the checks: the run ended;
 * its commands are those the client made (none applied twice); in its output, each append that
 * ended succeeded is one line, each that ended failed at most one ("whether it ran is not known"),
 * nothing else and nothing twice; the archive matches its sha256; the ledger's entries for the run
 * add up to its started minutes.
 *
 * A run that failed `infrastructure` before it started (its creation was not confirmed in time,
 * e.g. while a partition's consumer came back) is started again, as the spec tells a caller, up to
 * twice; each such run is checked too, and its failure kept in `startedAgain`.
 */
export const oneRun = async (c: Client, acct: TestAccount, plan: RunPlan): Promise<RunOutcome> => {
  const startedAgain: Array<string> = []
  for (;;) {
    const started = await ask(c, "POST", `/v1/functions/${plan.function}/runs`, acct.admin, { prompt: "go" })
    if (started.status !== 201)
      return {
        state: `not started (${started.status})`,
        extra: 0,
        failedCommands: 0,
        linesWrong: 0,
        billed: 0,
        startedMinutes: 0,
        ledgerLagMs: 0,
        startedAgain,
        problems: [`not started: ${started.status} ${started.text.slice(0, 200)}`],
      }
    const run = started.body.id as string
    plan.runs.add(run)
    const outcome = await settle(c, acct, run, plan, await drive(c, acct, run, plan))
    if (!neverStarted(outcome) || startedAgain.length >= 2 || outcome.problems.length > 0)
      return { ...outcome, startedAgain }
    startedAgain.push(`${run}: ${outcome.detail}`)
  }
}

/** Whether the run failed `infrastructure` before it started (the spec's "start it again"). */
export const neverStarted = (o: Pick<RunOutcome, "state" | "failure" | "startedMinutes">): boolean =>
  o.state === "failed" && o.failure === "infrastructure" && o.startedMinutes === 0

/** What the client did to a run: the commands it made, each append's end state, whether its finish was accepted. */
export interface Sent {
  readonly made: ReadonlySet<string>
  /** Append `i`'s end state. */
  readonly appends: ReadonlyMap<number, string>
  readonly accepted: boolean
}

/** Nothing sent (a run only watched to its end). */
export const nothingSent: Sent = { made: new Set(), appends: new Map(), accepted: false }

/** The commands of `oneRun` sent to `run` and waited for, until the run takes no more. */
export const drive = async (c: Client, acct: TestAccount, run: string, plan: RunPlan): Promise<Sent> => {
  const h = acct.admin
  const made = new Set<string>()
  /** Sends a command and waits for its end; undefined when the run took no more commands. */
  const command = async (kind: string, args: unknown): Promise<Answer["body"] | undefined> => {
    const sent = await ask(c, "POST", `/v1/runs/${run}/commands`, h, { kind, arguments: args })
    if (sent.status !== 201) return undefined
    made.add(sent.body.id)
    const answer = await until(c, `/v1/runs/${run}/commands/${sent.body.id}?wait=25`, h, ended)
    plan.onCommandEnded?.()
    return answer
  }
  const appends = new Map<number, string>()
  let open = true
  for (let i = 0; i < plan.appends && open; i++) {
    const answer = await command("bash", { command: `echo line-${i} >> /workspace/lines` })
    if (answer === undefined) open = false
    else appends.set(i, answer.state)
  }
  let accepted = false
  for (let again = 0; open && !accepted && again < 4; again++) {
    const copied = await command("bash", { command: "cp /workspace/lines /workspace/out/result.txt" })
    if (copied === undefined) open = false
    else if (copied.state === "succeeded") {
      const finished = await command("finish", { state: "succeeded" })
      if (finished === undefined) open = false
      else accepted = finished.state === "succeeded" && finished.result?.accepted === true
    }
  }
  return { made, appends, accepted }
}

/** Waits for `run` to end and checks it against what was `sent` (`oneRun`'s checks). */
export const settle = async (
  c: Client,
  acct: TestAccount,
  run: string,
  plan: Pick<RunPlan, "minuteMs">,
  { made, appends, accepted }: Sent,
): Promise<RunOutcome> => {
  const h = acct.admin
  const problems: Array<string> = []
  const final = await until(c, `/v1/runs/${run}`, h, (r) => r?.state === "succeeded" || r?.state === "failed")
  if (final.state === "succeeded" && !accepted) problems.push("succeeded without an accepted finish")
  const list = await until(c, `/v1/runs/${run}/commands`, h, () => true)
  const extra = list.commands.length - made.size
  if (extra !== 0) problems.push(`${extra} commands beyond the ${made.size} made`)

  let linesWrong = 0
  let outputOk: boolean | undefined
  if (final.state === "succeeded") {
    const { record, data } = await download(c, run, h)
    const sha = data === undefined ? undefined : createHash("sha256").update(data).digest("hex")
    const text = data === undefined ? undefined : fileIn(data, "result.txt")
    outputOk = sha === record.output.sha256 && text !== undefined
    if (!outputOk) problems.push(`output: sha256 ${sha} for ${record.output.sha256}, result.txt ${text}`)
    const counts = new Map<string, number>()
    for (const line of (text ?? "").split("\n").filter((l) => l !== ""))
      counts.set(line, (counts.get(line) ?? 0) + 1)
    for (const [line, n] of counts) {
      const i = Number(/^line-(\d+)$/.exec(line)?.[1] ?? Number.NaN)
      const state = appends.get(i)
      const most = state === undefined ? 0 : 1
      if (n > most) {
        linesWrong++
        problems.push(`${line} ${n} times (its command ${state ?? "never made"})`)
      }
    }
    for (const [i, state] of appends)
      if (state === "succeeded" && !counts.has(`line-${i}`)) {
        linesWrong++
        problems.push(`line-${i} missing though its command succeeded`)
      }
  }

  // The last minute is billed as the run ends; read the ledger until it holds the run's minutes.
  const ran = Date.parse(final.ended_at) - Date.parse(final.started_at ?? final.ended_at)
  const startedMinutes = final.started_at === undefined ? 0 : Math.max(1, Math.ceil(ran / plan.minuteMs))
  let billed = -1
  let entries: ReadonlyArray<{ from_minute: number; through_minute: number }> = []
  const waited = Date.now()
  let lagged = false
  for (let read = 0; billed !== startedMinutes && Date.now() - waited < 120_000; read++) {
    if (read > 0) await sleep(2_000)
    lagged = read > 0
    const usage = await until(c, "/v1/usage", acct.owner, () => true)
    entries = (usage?.entries ?? []).filter((e: { run?: string }) => e.run === run)
    billed = entries.reduce((n, e) => n + e.through_minute - e.from_minute + 1, 0)
  }
  if (billed !== startedMinutes)
    problems.push(
      `billed ${billed} minutes of ${startedMinutes} started (${final.started_at} to ${final.ended_at}); the ledger's entries: ${entries.map((e) => `${e.from_minute}-${e.through_minute}`).join(", ")}`,
    )
  return {
    run,
    state: final.state,
    ...(final.failure === undefined ? {} : { failure: final.failure }),
    ...(final.detail === undefined ? {} : { detail: final.detail }),
    extra,
    failedCommands: list.commands.filter((x: { state: string }) => x.state === "failed").length,
    linesWrong,
    ...(outputOk === undefined ? {} : { outputOk }),
    billed,
    startedMinutes,
    ledgerLagMs: billed === startedMinutes && lagged ? Date.now() - waited : 0,
    problems,
  }
}

/** A fault: what breaks, what mends it, and how long the system is left without it. */
export interface Fault {
  readonly inject: () => Promise<void>
  readonly heal: () => Promise<void>
  readonly downMs: number
}

/**
 * `runs` runs of `plan` at once; once a third of all their commands have ended, `fault` is
 * injected, and healed `downMs` later. Answers each run's outcome, the round's wall time, and
 * whether the fault was injected (the runs reached the count).
 */
export const round = async (
  c: Client,
  acct: TestAccount,
  plan: Omit<RunPlan, "onCommandEnded">,
  runs: number,
  fault?: Fault,
): Promise<{
  readonly outcomes: ReadonlyArray<RunOutcome>
  readonly wallMs: number
  readonly injected: boolean
}> => {
  const at = Math.max(1, Math.floor((runs * (plan.appends + 2)) / 3))
  let done = 0
  let injected: Promise<void> | undefined
  const onCommandEnded = () => {
    done += 1
    if (done === at && fault !== undefined)
      injected = (async () => {
        await fault.inject()
        await sleep(fault.downMs)
        await fault.heal()
      })()
  }
  const began = Date.now()
  const outcomes = await Promise.all(
    Array.from({ length: runs }, () => oneRun(c, acct, { ...plan, onCommandEnded })),
  )
  await injected
  return { outcomes, wallMs: Date.now() - began, injected: injected !== undefined }
}

/** The distributed shape on a 3-node cluster (`clusterStack`). */
export interface ClusterStack {
  readonly cluster: NatsCluster
  /** The stack's own roles (one of each) plus the extras below, every role its own process. */
  readonly stack: Stack
  /** Both gateways' base URLs, the stack's first. */
  readonly urls: ReadonlyArray<string>
  readonly secondGateway: ExtraRole
  readonly secondActors: ExtraRole
  /** The two extra host agents, and their host ids. */
  readonly hosts: ReadonlyArray<{ readonly id: string; readonly role: ExtraRole }>
  /** Starts a host agent with host id `id` (the life after a killed one). */
  readonly startHost: (id: string) => Promise<ExtraRole>
  /** Closes the stack, then the cluster; answers what the machines left behind. */
  readonly close: () => Promise<ReadonlyArray<string>>
}

/**
 * A 3-node cluster and on it every store R3 and every role as a process: two gateways, two actor
 * workers, three host agents with their own host ids. Answers once the second worker holds half
 * of every mailbox partition (a partition being moved answers nothing meanwhile).
 */
export const clusterStack = async (options: StackOptions = {}): Promise<ClusterStack> => {
  const cluster = await startNatsCluster(3)
  let stack: Stack | undefined
  try {
    stack = await startStack({
      ...options,
      processes: true,
      natsUrl: cluster.url,
      settings: { ...clusterLeases, ...options.settings, NATS_REPLICAS: 3 },
    })
    const s = stack
    const port = await freePort()
    const second = `http://127.0.0.1:${port}`
    const startHost = (id: string) => s.startExtra("host", { HOST_ID: id })
    const ids = [1, 2].map((i) => derivedId(randomBytes(16).toString("hex"), `${s.dir}/${i}`))
    const [secondGateway, secondActors, ...hostRoles] = await Promise.all([
      s.startExtra("gateway", { HTTP_ADDR: `127.0.0.1:${port}`, PUBLIC_URL: second }),
      s.startExtra("actors"),
      ...ids.map(startHost),
    ])
    await s.run(
      Effect.gen(function* () {
        const { names } = yield* Storage
        const leases = yield* Kv.make(names.kv.leases.name, Schema.Struct({ owner: Schema.String }))
        const split = Effect.gen(function* () {
          const owners = new Map<string, number>()
          for (const key of yield* leases.keys("p.>")) {
            const lease = yield* leases.get(key)
            if (Option.isSome(lease)) {
              const owner = lease.value.value.owner
              owners.set(owner, (owners.get(owner) ?? 0) + 1)
            }
          }
          const counts = [...owners.values()]
          return counts.length === 2 && counts[0] === counts[1]
        })
        yield* split.pipe(
          Effect.repeat({ until: (even) => even, schedule: Schedule.spaced("500 millis") }),
          Effect.timeoutFail({
            duration: "120 seconds",
            onTimeout: () => new Error("partitions never split"),
          }),
        )
      }),
    )
    return {
      cluster,
      stack: s,
      urls: [s.url, second],
      secondGateway: secondGateway!,
      secondActors: secondActors!,
      hosts: ids.map((id, i) => ({ id, role: hostRoles[i]! })),
      startHost,
      close: async () => {
        const left = await s.close()
        await cluster.stop()
        return left
      },
    }
  } catch (e) {
    await stack?.close()
    await cluster.stop()
    throw e
  }
}

/**
 * Run figures through HTTP on the whole stack (`test/harness/Stack.ts`, namespace driver, all roles
 * in this process on one connection as `npm start` runs them, production actor leases; the caller
 * is its own process, `bench/runs-client.ts`): from
 * `POST /v1/functions/{id}/runs` to the first `bash true` result (the command is sent right after
 * the start, while the run is queued, and its end is awaited with `GET …/commands/{cid}?wait=25`),
 * p50/p95 over `runs` runs one after another, and over half as many started 500 ms apart (the
 * host caught up between them: warm machines made again); from a finish (`succeeded`, the output
 * file the manifest names written) to its answer, the folder checked, listed, packed and stored, over
 * a third as many runs, paced the same; then the command round trip (`POST` a `bash true` on
 * a running run and await its end) p50/p99; beside the bare driver's exec round trip (`bash true`
 * over an open guest session on a machine made directly with the driver), measured in blocks
 * between the blocks of commands, so both come from the same minutes (this machine's speed drifts
 * by up to 1.7× over a run); and the same again with each command sent in one request
 * (`POST …/commands?wait=25`, which answers the ended command), with its own baseline blocks.
 * The first topology is measured again with warm machines (`host-agent/runs/WarmPool.ts`: two of
 * the run's size kept booted, so a run starts on one made before it asked), beside the cold rows.
 * Goals on this machine: start → first result p50 < 1.5 s (issue 25: ≤ 100 ms warm); command round
 * trip p50 < 15 ms and under 2× the bare exec in one process (3× with a process per role). In one
 * process it also prints the server's CPU per run while runs go one after another, beside the wall
 * time a run took: a start there waits mostly for the one thread's other work; and the same split
 * by the caller's steps (the start up to its first result, the finish's answer, the run seen
 * ended), with the time the process's main thread waited for a CPU in each; and where the host's
 * cores went per run one after another (the main thread, the process's other threads, nats-server,
 * the host tools, the caller, the rest, idle). Prints figures; asserts nothing.
 *
 *   node --import tsx bench/runs.ts [runs=50] [commands=200] [blocks=8] [topologies=one,roles,warm]
 */
import { fork } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import { readFile, writeFile } from "node:fs/promises"
import { Session } from "node:inspector/promises"
import { basename, join } from "node:path"
import { Effect } from "effect"
import { root } from "../deploy/tools.mjs"
import { testGuest } from "../host-agent/guest/testing.ts"
import { readText, statFields } from "../host-agent/machines/HostFiles.ts"
import * as Cgroups from "../host-agent/machines/namespace/Cgroups.ts"
import { helperInterpreter } from "../host-agent/machines/namespace/exec.ts"
import { NamespaceDriverSettings } from "../host-agent/machines/namespace/NamespaceDriver.ts"
import { createAccount, publish, type Stack, startStack, type TestAccount } from "../test/harness/Stack.ts"

const runs = Number(process.argv[2] ?? 50)
const commands = Number(process.argv[3] ?? 200)
/** Blocks of commands, with a block of bare execs measured after each. */
const blocks = Math.max(1, Math.min(commands, Number(process.argv[4] ?? 8)))
/** Which topologies to measure: `one` (npm start), `roles` (a process per role), `warm`. */
const only = new Set((process.argv[5] ?? "one,roles,warm").split(","))
/**
 * `BENCH_CPU_PROFILE=<folder>`: this process's CPU profile of each block of commands (the
 * server's, when its roles run here), written there as `two-<n>.cpuprofile` (two requests each)
 * and `one-<n>.cpuprofile` (one request each), and of the runs
 * one after another as `runs-<n>.cpuprofile` (open in Chrome's DevTools;
 * `bench/profile-summary.ts` sums it by package and file).
 */
const profileDir = process.env.BENCH_CPU_PROFILE
const profiling = profileDir === undefined ? undefined : new Session()
let profiled = 0
const keepProfile =
  (what: "one" | "two" | "runs") =>
  async ({ profile }: { profile: unknown }) => {
    const file = join(profileDir ?? "", `${what}-${++profiled}.cpuprofile`)
    await writeFile(file, JSON.stringify(profile))
    console.log(
      `CPU profile of ${what === "runs" ? "the runs one after another" : `a block of ${what}-request commands`}: ${file}`,
    )
  }
if (profiling) {
  profiling.connect()
  await profiling.post("Profiler.enable")
  await profiling.post("Profiler.setSamplingInterval", { interval: 100 })
}

const pct = (xs: Array<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] as number | undefined
}
const ms = (n: number | undefined) => (n === undefined ? "none" : `${n.toFixed(2)} ms`)
/** The ratio of two p50s, or "none" when a side has no figures. */
const ratio = (xs: Array<number>, baseline: Array<number>) => {
  const [a, b] = [pct(xs, 50), pct(baseline, 50)]
  return a === undefined || b === undefined ? "none" : (a / b).toFixed(2)
}

/** A guest session on a machine made directly with the driver: the bare exec baseline. */
interface Bare {
  /** `n` round trips of `bash true` over the open session, one after another. */
  readonly block: (n: number) => Promise<Array<number>>
  /** As `block`, each after 20 ms idle (as a caller or an agent sends them). */
  readonly paced: (n: number) => Promise<Array<number>>
  readonly close: () => Promise<void>
}

const bareMachine = async (): Promise<Bare> => {
  const { guest, close } = await testGuest("benchruns")
  const times = (n: number, pause: boolean) =>
    Effect.runPromise(
      Effect.gen(function* () {
        const rtt: Array<number> = []
        for (let j = 0; j < n; j++) {
          if (pause) yield* Effect.sleep("20 millis")
          const t = performance.now()
          yield* guest.bash({ command: "true" })
          rtt.push(performance.now() - t)
        }
        return rtt
      }),
    )
  // Warm: the session opens its first command wrapper.
  await times(1, false)
  return {
    block: (n) => times(n, false),
    paced: (n) => times(n, true),
    close: async () => {
      const left = await close()
      if (left.length > 0) console.log(`the baseline machine left behind: ${left.join(", ")}`)
    },
  }
}

/** Linux's clock tick for `/proc` CPU times (`USER_HZ`). */
const TICK_MS = 10

/**
 * Where the host's CPU has gone so far, in ms: this process's main thread on a CPU and waiting
 * for one (`/proc/thread-self/schedstat`, read on the main thread), the whole process, each child
 * process by its name with the children it waited for (nats-server; `python3`, the tool runner with
 * its tools; `node`, the caller), and the host's busy and idle time. Clock-tick counts: summed over
 * many runs before they are divided. A read costs the main thread about 0.2 ms, counted in the
 * server's CPU of the step it ends (four a run one after another).
 */
interface Cores {
  readonly at: number
  readonly mainOn: number
  readonly mainWaiting: number
  readonly process: number
  readonly children: ReadonlyMap<string, number>
  readonly busy: number
  readonly idle: number
}

const ticksOf = (stat: string) => {
  const f = statFields(stat).map(Number)
  // utime, stime, cutime, cstime (fields 14–17 of proc(5)).
  return ((f[11] ?? 0) + (f[12] ?? 0) + (f[13] ?? 0) + (f[14] ?? 0)) * TICK_MS
}

const cores = (): Cores => {
  // A kernel without scheduler statistics shows no wait (0).
  const [on = 0, waiting = 0] = (readText("/proc/thread-self/schedstat") ?? "").split(" ").map(Number)
  const used = process.cpuUsage()
  const children = new Map<string, number>()
  // A thread or a child that ended meanwhile is left out.
  for (const task of readdirSync(`/proc/${process.pid}/task`)) {
    const pids = (readText(`/proc/${process.pid}/task/${task}/children`) ?? "").trim().split(" ")
    for (const pid of pids.filter((p) => p !== "")) {
      const stat = readText(`/proc/${pid}/stat`)
      if (stat === undefined) continue
      const name = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"))
      children.set(name, (children.get(name) ?? 0) + ticksOf(stat))
    }
  }
  const [user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0] = readFileSync(
    "/proc/stat",
    "utf8",
  )
    .split("\n")[0]!
    .split(/\s+/)
    .slice(1)
    .map(Number)
  return {
    at: performance.now(),
    mainOn: on / 1e6,
    mainWaiting: waiting / 1e6,
    process: (used.user + used.system) / 1000,
    children,
    busy: (user + nice + system + irq + softirq) * TICK_MS,
    idle: (idle + iowait) * TICK_MS,
  }
}

/** What the host's cores did between two `cores()`, per run, as a line of the bench's output. */
const coresLine = (from: Cores, to: Cores, n: number) => {
  const d = (f: (c: Cores) => number) => (f(to) - f(from)) / n
  const child = (name: string) => ((to.children.get(name) ?? 0) - (from.children.get(name) ?? 0)) / n
  const [main, nats, tools, caller] = [
    d((c) => c.mainOn),
    child("nats-server"),
    child(basename(helperInterpreter[0])),
    child("node"),
  ]
  const others = d((c) => c.process) - main
  const rest = d((c) => c.busy) - d((c) => c.process) - nats - tools - caller
  const f = (x: number) => x.toFixed(0)
  return `  the host's cores per run one after another (${f(d((c) => c.at))} ms of wall time): this process's main thread ${f(main)} ms on a CPU and ${f(d((c) => c.mainWaiting))} ms waiting for one; its other threads ${f(others)} ms; nats-server ${f(nats)} ms; host tools ${f(tools)} ms; the caller ${f(caller)} ms; the rest (machines, kernel) ${f(rest)} ms; idle ${f(d((c) => c.idle))} ms`
}

interface Figures {
  readonly first: Array<number>
  /** As `first`, with a run started every `pacedMs`. */
  readonly paced: Array<number>
  readonly pacedMs: number
  /** From a finish (`succeeded`, one output file) to its answer: the output checked and packed. */
  readonly succeeded: Array<number>
  readonly rtt: Array<number>
  /** The bare exec round trips, measured between the blocks of `rtt`. */
  readonly bare: Array<number>
  /** The server's CPU per command when its roles run in this process. */
  readonly cpuMs: number | undefined
  /** As `rtt`, `bare` and `cpuMs`, with each command sent in one request (`POST …/commands?wait=25`). */
  readonly one: {
    readonly rtt: Array<number>
    readonly bare: Array<number>
    readonly cpuMs: number | undefined
  }
  /** The host's log lines while the runs one after another started (their machines' takes). */
  readonly firstLines: ReadonlyArray<string>
  /**
   * The server's CPU and the wall time per step of the caller's (from the step before to it), in
   * the order they came, when its roles run in this process; summed over a run one after another
   * (its start, first result and finish, its machine's removal, the pool's refill), how near one
   * thread's whole time a run takes.
   */
  readonly perStep: ReadonlyArray<{
    readonly step: string
    readonly cpuMs: number
    readonly wallMs: number
    /** The main thread's time waiting for a CPU. */
    readonly waitingMs: number
  }>
  /** Where the host's CPU went over the runs one after another (`coresLine`), in one process. */
  readonly cores: string | undefined
}

/**
 * The caller's figures, with the bare exec measured in blocks between its blocks of commands (the
 * machine's speed drifts over minutes; the ratio compares figures taken in the same minutes).
 */
const client = (stack: Stack, who: TestAccount, fn: string, bare: Bare) =>
  new Promise<Figures>((resolve, reject) => {
    const child = fork(
      join(root, "bench", "runs-client.ts"),
      [stack.url, JSON.stringify(who.admin), fn, String(runs), String(commands), String(blocks)],
      { execArgv: ["--import", "tsx"], cwd: root, stdio: ["ignore", "inherit", "inherit", "ipc"] },
    )
    const bareRtt: Array<number> = []
    const bareOne: Array<number> = []
    // The log lines of the runs one after another: from the first start to the paced phase.
    let linesFrom: number | undefined
    let firstLines: ReadonlyArray<string> = []
    // This process's CPU is the server's only when the roles run here; counted inside the blocks.
    let cpu0 = process.cpuUsage()
    // CPU and wall time up to each step of the runs one after another, from the step before.
    const steps = new Map<string, { cpuUs: number; wallMs: number; waitingMs: number; n: number }>()
    let lastStep: { readonly cpu: NodeJS.CpuUsage; readonly at: number; readonly cores: Cores } | undefined
    // The host's CPU from the first run one after another to the paced phase.
    let coresFrom: Cores | undefined
    let coresOf: string | undefined
    let runsSeenEnded = 0
    let cpuUs = 0
    let cpuOneUs = 0
    child.on("message", (raw) => {
      const m = raw as {
        step?: string
        started?: string
        phase?: string
        block?: string
        size?: number
        first?: Array<number>
        rttOne?: Array<number>
        paced?: Array<number>
        pacedMs?: number
        succeeded?: Array<number>
        rtt?: Array<number>
      }
      if (m.step !== undefined && !stack.processes) {
        const [cpu, at, now] = [process.cpuUsage(), performance.now(), cores()]
        coresFrom ??= now
        if (m.step === "ended") runsSeenEnded++
        if (lastStep !== undefined && m.step !== "start") {
          const used = process.cpuUsage(lastStep.cpu)
          const s = steps.get(m.step) ?? { cpuUs: 0, wallMs: 0, waitingMs: 0, n: 0 }
          steps.set(m.step, {
            cpuUs: s.cpuUs + used.user + used.system,
            wallMs: s.wallMs + at - lastStep.at,
            waitingMs: s.waitingMs + now.mainWaiting - lastStep.cores.mainWaiting,
            n: s.n + 1,
          })
        }
        lastStep = { cpu, at, cores: now }
      }
      if (m.started !== undefined) {
        stack.runs.add(m.started)
        // The runs one after another are profiled from the first start to the paced phase.
        if (linesFrom === undefined && profiling && !stack.processes) void profiling.post("Profiler.start")
        linesFrom ??= stack.lines.length
      }
      if (m.phase === "paced") {
        firstLines = stack.lines.slice(linesFrom ?? 0).map((l) => l.line)
        // Up to the last run seen ended (the paced phase begins right after it).
        if (coresFrom !== undefined && lastStep !== undefined && runsSeenEnded > 0)
          coresOf = coresLine(coresFrom, lastStep.cores, runsSeenEnded)
        if (profiling && !stack.processes) void profiling.post("Profiler.stop").then(keepProfile("runs"))
      }
      if (m.block === "start") {
        if (profiling) void profiling.post("Profiler.start")
        cpu0 = process.cpuUsage()
      }
      if (m.block === "end") {
        const used = process.cpuUsage(cpu0)
        if (profiling)
          void profiling.post("Profiler.stop").then(keepProfile(m.phase === "one" ? "one" : "two"))
        if (m.phase === "one") cpuOneUs += used.user + used.system
        else cpuUs += used.user + used.system
        // As many bare execs as the block had commands.
        bare.block(m.size ?? 0).then(
          (xs) => {
            ;(m.phase === "one" ? bareOne : bareRtt).push(...xs)
            child.send("go")
          },
          (e) => {
            child.kill()
            reject(e)
          },
        )
      }
      if (m.first !== undefined && m.rtt !== undefined)
        resolve({
          first: m.first,
          paced: m.paced ?? [],
          pacedMs: m.pacedMs ?? 0,
          succeeded: m.succeeded ?? [],
          rtt: m.rtt,
          bare: bareRtt,
          cpuMs: stack.processes ? undefined : cpuUs / 1000 / commands,
          one: {
            rtt: m.rttOne ?? [],
            bare: bareOne,
            cpuMs: stack.processes ? undefined : cpuOneUs / 1000 / commands,
          },
          firstLines,
          perStep: [...steps].map(([step, s]) => ({
            step,
            cpuMs: s.cpuUs / 1000 / s.n,
            wallMs: s.wallMs / s.n,
            waitingMs: s.waitingMs / s.n,
          })),
          cores: coresOf,
        })
    })
    child.on("exit", (code) => reject(new Error(`the client exited with ${code}`)))
  })

/**
 * What the warm machines ready now cost while idle: memory held, and CPU over 5 s (their cgroups),
 * from 2 s after they were ready.
 */
const idleCost = async (stack: Stack) => {
  const ids = [
    ...new Set(
      stack.lines.flatMap((l) =>
        l.line.includes('"msg":"warm machine ready"')
          ? [/"machine":"(warm_[0-9a-f]+)"/.exec(l.line)?.[1] ?? ""]
          : [],
      ),
    ),
  ]
  const root = NamespaceDriverSettings.defaults.cgroupRoot
  const read = async (controller: string, file: string) => {
    let total = 0
    for (const id of ids)
      total += Number(
        (await readFile(join(Cgroups.groupOf(root, controller, id), file), "utf8").catch(() => "0")).trim(),
      )
    return total
  }
  // Idle: the last of their start is over first (2–10 ms of CPU a machine in the first second
  // after it is ready, at the background weight; then only the session's keepalive, 0.15 ms every
  // 15 s).
  await new Promise((r) => setTimeout(r, 2_000))
  const cpu0 = await read("cpuacct", "cpuacct.usage")
  await new Promise((r) => setTimeout(r, 5_000))
  const cpuMs = ((await read("cpuacct", "cpuacct.usage")) - cpu0) / 1e6
  const memory = await read("memory", "memory.usage_in_bytes")
  return `  ${ids.length} warm machines idle: ${(memory / 2 ** 20).toFixed(1)} MiB of memory in all, ${cpuMs.toFixed(1)} ms of CPU over 5 s`
}

/**
 * The caller's figures against a stack in one process (`npm start`) or with a process per role,
 * with `warm` warm machines of the runs' size (room for them and a run: 4 vCPUs) or none.
 */
const measure = async (processes: boolean, bare: Bare, warm = 0) => {
  // Production actor leases (the test stack's short ones renew a lease every 300 ms).
  const stack = await startStack({
    hostVcpus: warm > 0 ? 4 : 2,
    processes,
    // One process: the roles share one connection, as `npm start` runs them.
    sharedConnection: !processes,
    warmMachines: warm,
    settings: {
      ACTOR_LEASE_MS: 10_000,
      ACTOR_RENEW_MS: 3_333,
      ACTOR_ACK_WAIT_MS: 30_000,
      WARM_SIZE: "s",
    },
  })
  try {
    // The pool full before the first run.
    const deadline = Date.now() + 60_000
    while (stack.lines.filter((l) => l.line.includes('"msg":"warm machine ready"')).length < warm) {
      if (Date.now() > deadline) throw new Error("the warm machines were never ready")
      await new Promise((r) => setTimeout(r, 50))
    }
    if (warm > 0) console.log(await idleCost(stack))
    const who = await createAccount(stack, { creditUsd: 100 })
    const fn = await publish(stack, who, { timeout_minutes: 60 })
    return await client(stack, who, String(fn.function), bare)
  } finally {
    const left = await stack.close()
    if (left.length > 0) console.log(`left behind on the host (removed): ${left.join(", ")}`)
  }
}

const main = async () => {
  const bare = await bareMachine()
  try {
    const topologies: Array<readonly [string, Figures]> = []
    if (only.has("one")) topologies.push(["one process (npm start)", await measure(false, bare)])
    if (only.has("roles")) topologies.push(["a process per role", await measure(true, bare)])
    if (only.has("warm"))
      topologies.push(["one process (npm start), 2 warm machines", await measure(false, bare, 2)])
    const paced = await bare.paced(Math.min(commands, 50))
    for (const [
      name,
      {
        first,
        paced,
        pacedMs,
        succeeded,
        rtt,
        bare: baseline,
        cpuMs,
        one,
        firstLines,
        perStep,
        cores: coresOf,
      },
    ] of topologies) {
      console.log(`${name}:`)
      console.log(
        `  POST runs → first bash true result (${runs} runs): p50 ${ms(pct(first, 50))}, p95 ${ms(pct(first, 95))} (goal p50 < 1500 ms)`,
      )
      // With warm machines: which of those runs found one ready, and which waited for one being
      // made (the pool makes two at once; one after another, runs come faster than that).
      const takes = firstLines.filter((l) => l.includes('"msg":"warm machine taken"'))
      if (takes.length > 0) {
        const waited = takes.flatMap((l) => {
          const w = /"waited_ms":(\d+)/.exec(l)?.[1]
          return w === undefined ? [] : [Number(w)]
        })
        console.log(
          `  of those runs, on a warm machine ready: ${takes.length - waited.length}; on one being made, waited for: ${waited.length}${waited.length > 0 ? ` (p50 ${ms(pct(waited, 50))})` : ""}; on a machine of their own: ${runs - takes.length}`,
        )
      }
      const named: Record<string, string> = {
        first: "start to first result",
        finish: "then the finish answered",
        ended: "then the run seen ended",
      }
      const oneAfterAnother = perStep.filter((s) => s.step in named)
      if (oneAfterAnother.length > 0) {
        const sum = (f: (s: (typeof perStep)[number]) => number) =>
          oneAfterAnother.reduce((n, s) => n + f(s), 0)
        console.log(
          `  server CPU per run, one after another (start, first result, finish, its machine's removal, the pool's refill): ${ms(sum((s) => s.cpuMs))} in ${ms(sum((s) => s.wallMs))} of wall time`,
        )
        console.log(
          `  the same by the caller's steps: ${oneAfterAnother.map((s) => `${named[s.step]} ${ms(s.cpuMs)} in ${ms(s.wallMs)} (the main thread waiting for a CPU ${ms(s.waitingMs)})`).join("; ")}`,
        )
        if (coresOf !== undefined) console.log(coresOf)
      }
      const pacedStart = perStep.find((s) => s.step === "paced first")
      console.log(
        `  same, a run started every ${pacedMs} ms (${paced.length} runs): p50 ${ms(pct(paced, 50))}, p95 ${ms(pct(paced, 95))}${pacedStart === undefined ? "" : `; server CPU from start to first result ${ms(pacedStart.cpuMs)} in ${ms(pacedStart.wallMs)}`}`,
      )
      console.log(
        `  a run that succeeds, finish (its output written: one file) → answered, the output checked and packed (${succeeded.length} runs): p50 ${ms(pct(succeeded, 50))}, p95 ${ms(pct(succeeded, 95))}`,
      )
      console.log(
        `  command round trip, bash true on a running run (${commands}): p50 ${ms(pct(rtt, 50))}, p99 ${ms(pct(rtt, 99))} (goal p50 < 15 ms)${cpuMs === undefined ? "" : `; server CPU ${cpuMs.toFixed(2)} ms per command`}`,
      )
      console.log(
        `  bare driver exec, bash true over an open session, between its blocks (${baseline.length}): p50 ${ms(pct(baseline, 50))}, p99 ${ms(pct(baseline, 99))}`,
      )
      console.log(
        `  ratio command/bare exec p50: ${ratio(rtt, baseline)} (goal < 2 in one process, < 3 with a process per role)`,
      )
      console.log(
        `  command round trip in one request (POST …/commands?wait=25), bash true (${one.rtt.length}): p50 ${ms(pct(one.rtt, 50))}, p99 ${ms(pct(one.rtt, 99))}${one.cpuMs === undefined ? "" : `; server CPU ${one.cpuMs.toFixed(2)} ms per command`}`,
      )
      console.log(
        `  bare driver exec, between its blocks (${one.bare.length}): p50 ${ms(pct(one.bare, 50))}; ratio one-request command/bare exec p50: ${ratio(one.rtt, one.bare)}`,
      )
    }
    console.log(
      `bare driver exec after 20 ms idle (${paced.length}): p50 ${ms(pct(paced, 50))}, p99 ${ms(pct(paced, 99))}`,
    )
  } finally {
    await bare.close()
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e)
    process.exit(1)
  },
)

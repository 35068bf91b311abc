/**
 * Run figures through HTTP on the whole stack (`test/harness/Stack.ts`, namespace driver, all roles
 * in this process on one connection as `npm start` runs them, production actor leases; the caller
 * is its own process, `bench/runs-client.ts`): from
 * `POST /v1/functions/{id}/runs` to the first `bash true` result (the command is sent right after
 * the start, while the run is queued, and its end is awaited with `GET …/commands/{cid}?wait=25`),
 * p50/p95 over `runs` runs one after another; then the command round trip (`POST` a `bash true` on
 * a running run and await its end) p50/p99; beside the bare driver's exec round trip (`bash true`
 * over an open guest session on a machine made directly with the driver), measured in the same run.
 * Goals on this machine: start → first result p50 < 1.5 s; command round trip p50 < 15 ms and
 * under 3× the bare exec. Prints figures; asserts nothing.
 *
 *   node --import tsx bench/runs.ts [runs=50] [commands=200]
 */
import { fork } from "node:child_process"
import { join } from "node:path"
import { Effect } from "effect"
import { root } from "../deploy/tools.mjs"
import { ensureTestBase } from "../host-agent/bases/Bases.ts"
import { connect } from "../host-agent/guest/GuestSession.ts"
import { scopedOn } from "../host-agent/machines/MachineDriver.ts"
import { make, NamespaceDriverSettings } from "../host-agent/machines/namespace/NamespaceDriver.ts"
import { newKeys, testId } from "../host-agent/machines/namespace/testing.ts"
import { createAccount, publish, type Stack, startStack, type TestAccount } from "../test/harness/Stack.ts"

const runs = Number(process.argv[2] ?? 50)
const commands = Number(process.argv[3] ?? 200)

const pct = (xs: Array<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] as number
}
const ms = (n: number) => `${n.toFixed(2)} ms`

/** The caller's figures, and the server's CPU per command over the round-trip phase. */
const client = (stack: Stack, who: TestAccount, fn: string) =>
  new Promise<{ first: Array<number>; rtt: Array<number>; cpuMs: number | undefined }>((resolve, reject) => {
    const child = fork(
      join(root, "bench", "runs-client.ts"),
      [stack.url, JSON.stringify(who.admin), fn, String(runs), String(commands)],
      { execArgv: ["--import", "tsx"], cwd: root, stdio: ["ignore", "inherit", "inherit", "ipc"] },
    )
    let cpu0 = process.cpuUsage()
    // This process's CPU is the server's only when the roles run here.
    let cpuMs: number | undefined
    child.on("message", (raw) => {
      const m = raw as { started?: string; commands?: string; first?: Array<number>; rtt?: Array<number> }
      if (m.started !== undefined) stack.runs.add(m.started)
      if (m.commands === "start") cpu0 = process.cpuUsage()
      if (m.commands === "end") {
        const used = process.cpuUsage(cpu0)
        if (!stack.processes) cpuMs = (used.user + used.system) / 1000 / commands
      }
      if (m.first !== undefined && m.rtt !== undefined) resolve({ first: m.first, rtt: m.rtt, cpuMs })
    })
    child.on("exit", (code) => reject(new Error(`the client exited with ${code}`)))
  })

const bareExec = Effect.scoped(
  Effect.gen(function* () {
    const base = yield* Effect.promise(() => ensureTestBase())
    const keys = newKeys()
    const machine = yield* scopedOn(make(NamespaceDriverSettings.defaults), {
      id: testId("benchruns"),
      size: "s",
      base: base.rootfs,
      authorizedKey: keys.client.public,
      hostKey: keys.host.private,
    })
    const guest = yield* connect({ ...machine.ssh, privateKey: keys.client.private })
    yield* guest.bash({ command: "true" })
    const rtt: Array<number> = []
    for (let j = 0; j < commands; j++) {
      const t = performance.now()
      yield* guest.bash({ command: "true" })
      rtt.push(performance.now() - t)
    }
    // As a caller or an agent sends them: after a pause (a quiet machine is where moving a process
    // into its cgroup used to cost 10–20 ms; the session now does that ahead of the command).
    const paced: Array<number> = []
    for (let j = 0; j < Math.min(commands, 50); j++) {
      yield* Effect.sleep("20 millis")
      const t = performance.now()
      yield* guest.bash({ command: "true" })
      paced.push(performance.now() - t)
    }
    return { rtt, paced }
  }),
)

/** The caller's figures against a stack in one process (`npm start`) or with a process per role. */
const measure = async (processes: boolean) => {
  // Production actor leases (the test stack's short ones renew a lease every 300 ms).
  const stack = await startStack({
    hostVcpus: 2,
    processes,
    // One process: the roles share one connection, as `npm start` runs them.
    sharedConnection: !processes,
    settings: { ACTOR_LEASE_MS: 10_000, ACTOR_RENEW_MS: 3_333, ACTOR_ACK_WAIT_MS: 30_000 },
  })
  try {
    const who = await createAccount(stack, { creditUsd: 100 })
    const fn = await publish(stack, who, { timeout_minutes: 60 })
    return await client(stack, who, String(fn.function))
  } finally {
    const left = await stack.close()
    if (left.length > 0) console.log(`left behind on the host (removed): ${left.join(", ")}`)
  }
}

const main = async () => {
  const topologies = [
    ["one process (npm start)", await measure(false)],
    ["a process per role", await measure(true)],
  ] as const
  const { rtt: bare, paced } = await Effect.runPromise(bareExec)
  for (const [name, { first, rtt, cpuMs }] of topologies) {
    console.log(`${name}:`)
    console.log(
      `  POST runs → first bash true result (${runs} runs): p50 ${ms(pct(first, 50))}, p95 ${ms(pct(first, 95))} (goal p50 < 1500 ms)`,
    )
    console.log(
      `  command round trip, bash true on a running run (${commands}): p50 ${ms(pct(rtt, 50))}, p99 ${ms(pct(rtt, 99))} (goal p50 < 15 ms)${cpuMs === undefined ? "" : `; server CPU ${cpuMs.toFixed(2)} ms per command`}`,
    )
    console.log(`  ratio command/bare exec p50: ${(pct(rtt, 50) / pct(bare, 50)).toFixed(2)} (goal < 3)`)
  }
  console.log(
    `bare driver exec, bash true over an open session (${commands}): p50 ${ms(pct(bare, 50))}, p99 ${ms(pct(bare, 99))}`,
  )
  console.log(
    `bare driver exec after 20 ms idle (${paced.length}): p50 ${ms(pct(paced, 50))}, p99 ${ms(pct(paced, 99))}`,
  )
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e)
    process.exit(1)
  },
)

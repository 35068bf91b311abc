/**
 * Run figures through HTTP on the whole stack (`test/harness/Stack.ts`, namespace driver): from
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
import { Effect } from "effect"
import { ensureTestBase } from "../host-agent/bases/Bases.ts"
import { connect } from "../host-agent/guest/GuestSession.ts"
import { scopedOn } from "../host-agent/machines/MachineDriver.ts"
import { make, NamespaceDriverSettings } from "../host-agent/machines/namespace/NamespaceDriver.ts"
import { newKeys, testId } from "../host-agent/machines/namespace/testing.ts"
import {
  createAccount,
  type Json,
  publish,
  type Stack,
  startStack,
  type TestAccount,
} from "../test/harness/Stack.ts"

const runs = Number(process.argv[2] ?? 50)
const commands = Number(process.argv[3] ?? 200)

const pct = (xs: Array<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] as number
}
const ms = (n: number) => `${n.toFixed(2)} ms`

// Keep-alive fetch (a client's usual connection reuse); the gateway is never restarted here.
const api = async (
  stack: Stack,
  who: TestAccount,
  method: string,
  path: string,
  body?: unknown,
): Promise<Json> => {
  const res = await fetch(`${stack.url}${path}`, {
    method,
    headers: { ...who.admin, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  const text = await res.text()
  if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${text}`)
  return JSON.parse(text)
}

/** Sends `bash true` and waits for its end; answers the ended record. */
const bashTrue = async (stack: Stack, who: TestAccount, run: string) => {
  const sent = await api(stack, who, "POST", `/v1/runs/${run}/commands`, {
    kind: "bash",
    arguments: { command: "true" },
  })
  for (;;) {
    const c = await api(stack, who, "GET", `/v1/runs/${run}/commands/${sent.id}?wait=25`)
    if (c.state === "succeeded" || c.state === "failed" || c.state === "cancelled") {
      if (c.state !== "succeeded") {
        const r = await api(stack, who, "GET", `/v1/runs/${run}`)
        throw new Error(`bash true ended ${c.state}: ${JSON.stringify(c)}; the run: ${JSON.stringify(r)}`)
      }
      return c
    }
  }
}

/** Waits for the run to end (the next start should find the room free). */
const ended = async (stack: Stack, who: TestAccount, run: string) => {
  for (;;) {
    const r = await api(stack, who, "GET", `/v1/runs/${run}`)
    if (r.state === "succeeded" || r.state === "failed") return r
    await new Promise((ok) => setTimeout(ok, 20))
  }
}

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

const main = async () => {
  const stack = await startStack({ hostVcpus: 2 })
  let left: ReadonlyArray<string> = []
  try {
    const who = await createAccount(stack, { creditUsd: 100 })
    const fn = await publish(stack, who, { timeout_minutes: 60 })
    const first: Array<number> = []
    for (let i = 0; i < runs; i++) {
      const t0 = performance.now()
      const run = await api(stack, who, "POST", `/v1/functions/${fn.function}/runs`, { prompt: "bench" })
      stack.runs.add(run.id)
      await bashTrue(stack, who, run.id)
      first.push(performance.now() - t0)
      await api(stack, who, "POST", `/v1/runs/${run.id}/commands`, {
        kind: "finish",
        arguments: { state: "failed" },
      })
      await ended(stack, who, run.id)
    }

    const run = await api(stack, who, "POST", `/v1/functions/${fn.function}/runs`, { prompt: "bench" })
    stack.runs.add(run.id)
    await bashTrue(stack, who, run.id)
    const rtt: Array<number> = []
    for (let j = 0; j < commands; j++) {
      const t = performance.now()
      await bashTrue(stack, who, run.id)
      rtt.push(performance.now() - t)
    }
    await api(stack, who, "POST", `/v1/runs/${run.id}/commands`, {
      kind: "finish",
      arguments: { state: "failed" },
    })
    await ended(stack, who, run.id)

    const { rtt: bare, paced } = await Effect.runPromise(bareExec)
    console.log(
      `POST runs → first bash true result (${runs} runs): p50 ${ms(pct(first, 50))}, p95 ${ms(pct(first, 95))} (goal p50 < 1500 ms)`,
    )
    console.log(
      `command round trip, bash true on a running run (${commands}): p50 ${ms(pct(rtt, 50))}, p99 ${ms(pct(rtt, 99))} (goal p50 < 15 ms)`,
    )
    console.log(
      `bare driver exec, bash true over an open session (${commands}): p50 ${ms(pct(bare, 50))}, p99 ${ms(pct(bare, 99))}`,
    )
    console.log(
      `bare driver exec after 20 ms idle (${paced.length}): p50 ${ms(pct(paced, 50))}, p99 ${ms(pct(paced, 99))}`,
    )
    console.log(`ratio command/bare exec p50: ${(pct(rtt, 50) / pct(bare, 50)).toFixed(2)} (goal < 3)`)
  } finally {
    left = await stack.close()
  }
  if (left.length > 0) console.log(`left behind on the host (removed): ${left.join(", ")}`)
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e)
    process.exit(1)
  },
)

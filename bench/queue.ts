/**
 * A full host's queue: a host with room for one `s` machine (a 1-vCPU budget, no warm machines),
 * `runs` runs started at once through HTTP, each finished as failed at once; how long each run
 * after the first takes to end after the one before it (the host's turnover: the end, the room
 * given back, the next offered, its machine made, its finish). Beside it, measured in the same
 * run: one machine made and removed by the driver alone, one after another (what a run's machine
 * costs at least). Prints figures; asserts nothing.
 *
 *   node --import tsx bench/queue.ts [runs=8] [machines=5]
 */
import { Effect } from "effect"
import { ensureTestBase } from "../host-agent/bases/Bases.ts"
import { make } from "../host-agent/machines/namespace/NamespaceDriver.ts"
import { newKeys, testDriverSettings, testId } from "../host-agent/machines/namespace/testing.ts"
import { createAccount, publish, startStack } from "../test/harness/Stack.ts"

const runs = Math.max(2, Number(process.argv[2] ?? 8))
const machines = Math.max(1, Number(process.argv[3] ?? 5))

const pct = (xs: Array<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] as number
}

/** The driver alone: a machine made, then removed, `n` times; milliseconds each. */
const bare = async (n: number) => {
  const base = await ensureTestBase()
  const driver = make(testDriverSettings)
  const each: Array<number> = []
  for (let i = 0; i < n; i++) {
    const id = testId("queue")
    const keys = newKeys()
    const t = performance.now()
    await Effect.runPromise(
      driver.create({
        id,
        size: "s",
        base: base.rootfs,
        authorizedKey: keys.client.public,
        hostKey: keys.host.private,
      }),
    )
    await Effect.runPromise(driver.destroy(id))
    each.push(performance.now() - t)
  }
  return each
}

const queue = async () => {
  // Production actor leases (the test stack's short ones renew a lease every 300 ms).
  const stack = await startStack({
    hostVcpus: 1,
    sharedConnection: true,
    warmMachines: 0,
    settings: { ACTOR_LEASE_MS: 10_000, ACTOR_RENEW_MS: 3_333, ACTOR_ACK_WAIT_MS: 30_000 },
  })
  try {
    const who = await createAccount(stack, { creditUsd: 100 })
    const fn = await publish(stack, who, { timeout_minutes: 60 })
    const api = async (method: string, path: string, body?: unknown) => {
      const answer = await fetch(`${stack.url}${path}`, {
        method,
        headers: { ...who.admin, ...(body === undefined ? {} : { "content-type": "application/json" }) },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      })
      const text = await answer.text()
      if (answer.status >= 300) throw new Error(`${method} ${path}: ${answer.status} ${text}`)
      return JSON.parse(text) as { readonly id: string; readonly state: string }
    }
    const ids: Array<string> = []
    for (let i = 0; i < runs; i++) {
      const run = await api("POST", `/v1/functions/${fn.function}/runs`, { prompt: "queued" })
      stack.runs.add(run.id)
      ids.push(run.id)
    }
    // Each finishes as soon as its machine is ready (the finish waits queued until then).
    for (const id of ids)
      await api("POST", `/v1/runs/${id}/commands`, { kind: "finish", arguments: { state: "failed" } })
    const ends: Array<number> = []
    for (const id of ids) {
      for (;;) {
        const run = await api("GET", `/v1/runs/${id}`)
        if (run.state === "succeeded" || run.state === "failed") break
        await new Promise((ok) => setTimeout(ok, 5))
      }
      ends.push(performance.now())
    }
    return ends.slice(1).map((end, i) => end - (ends[i] as number))
  } finally {
    const left = await stack.close()
    if (left.length > 0) console.log(`left behind on the host (removed): ${left.join(", ")}`)
  }
}

const turnover = await queue()
const baseline = await bare(machines)
console.log(
  `full host (room for one s machine), ${runs} runs queued at once: each after the one before it ended ${pct(turnover, 50).toFixed(0)} ms later at p50, ${pct(turnover, 90).toFixed(0)} ms at p90`,
)
console.log(
  `the driver alone, an s machine made and removed (${machines}, one after another): p50 ${pct(baseline, 50).toFixed(0)} ms`,
)
process.exit(0)

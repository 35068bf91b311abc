/**
 * Faults on the distributed shape (issue 24): a 3-node JetStream cluster with every store R3, and
 * every role its own process, several of each (`clusterStack`: two gateways, two actor workers,
 * three host agents). For each fault, a round of runs on fresh runs, driven by the careful client of
 * `test/harness/Chaos.ts`: a nats-server node SIGKILLed and restarted on its store, a gateway
 * SIGKILLed (its clients go to the other) and restarted, an actor worker and a host agent SIGKILLed
 * and restarted, a node SIGSTOPped for 15 s. After each every run succeeds, each command's effect
 * is there once (a command a restarted host agent ended `failed` at most once), outputs match
 * their sha256, the ledger bills each run its started minutes exactly, and no client saw a 500.
 * Last, a host agent SIGKILLed for good: its runs fail `infrastructure`, billed only their started
 * minutes, and the runs queued behind go to the other hosts.
 */
import { Effect, Option, Schema } from "effect"
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest"
import * as Kv from "../core/Kv.ts"
import { Storage } from "../core/Storage.ts"
import {
  ask,
  type Client,
  type ClusterStack,
  client,
  clusterStack,
  drive,
  type Fault,
  nothingSent,
  type RunOutcome,
  round,
  settle,
  until,
} from "./harness/Chaos.ts"
import { createAccountPatiently, type Json, problems, publish, type TestAccount } from "./harness/Stack.ts"

const minuteMs = 5_000
/** Runs per round: the three hosts' room (two size `s` runs each). */
const runs = 6
const appends = 6

/** Everything wrong with a round, in words (empty: nothing). */
const wrong = (c: Client, outcomes: ReadonlyArray<RunOutcome>) => [
  ...outcomes.flatMap((o) => [
    ...(o.state === "succeeded" ? [] : [`${o.run}: ${o.state} ${o.failure ?? ""} ${o.detail ?? ""}`]),
    ...o.problems.map((p) => `${o.run}: ${p}`),
  ]),
  ...[...c.seen.where].map((w) => `500 for ${w}`),
]

describe("faults on a 3-node cluster with every role its own process", () => {
  let c: ClusterStack
  let acct: TestAccount
  let fn: string

  beforeAll(async () => {
    c = await clusterStack({ hostVcpus: 2, hostMemoryMib: 4096, minuteMs, queueTimeoutMs: 600_000 })
  }, 300_000)

  // An account per case: its owner's token (for the ledger) lives 10 minutes. Made again when its
  // credit was not confirmed in time (the account actors' partitions may still be catching up
  // after the previous case's fault).
  beforeEach(async () => {
    acct = await createAccountPatiently(c.stack, { creditUsd: 100, memoryMib: 64 * 1024 })
    // 30 minutes are 150 s here (5 s minutes): after a node is killed and restarted the cluster
    // took over 100 s to settle in a full suite's load, and a run passed its timeout. What this
    // file checks is that nothing is lost or applied twice, not how fast the cluster recovers.
    fn = (await publish(c.stack, acct, { timeout_minutes: 240 })).function
  }, 240_000)

  afterAll(async () => {
    if (c === undefined) return
    const left = await c.close()
    if (left.length > 0) throw new Error(`machines left behind: ${left.join(", ")}`)
  }, 240_000)

  const faults: ReadonlyArray<readonly [string, () => Fault]> = [
    [
      "a nats-server node SIGKILLed, then restarted on its store",
      () => ({ inject: c.cluster.nodes[0]!.kill, heal: c.cluster.nodes[0]!.restart, downMs: 3_000 }),
    ],
    [
      "a gateway SIGKILLed (its clients go to the other), then restarted",
      () => ({ inject: c.stack.killGateway, heal: c.stack.startGateway, downMs: 3_000 }),
    ],
    [
      "an actor worker SIGKILLed, then restarted",
      () => ({ inject: c.stack.killActors, heal: c.stack.startActors, downMs: 3_000 }),
    ],
    [
      "a host agent SIGKILLed, then restarted",
      () => ({ inject: c.stack.killHost, heal: c.stack.startHost, downMs: 3_000 }),
    ],
    [
      "a nats-server node SIGSTOPped for 15 s",
      () => ({
        inject: async () => {
          process.kill(c.cluster.nodes[1]!.pid, "SIGSTOP")
        },
        heal: async () => {
          process.kill(c.cluster.nodes[1]!.pid, "SIGCONT")
        },
        downMs: 15_000,
      }),
    ],
  ]

  for (const [name, fault] of faults)
    it(`${name}: every run succeeds, each command's effect once, outputs intact, ledger = started minutes, no 500`, async () => {
      const cl = client(c.urls)
      const plan = { function: fn, appends, minuteMs, runs: c.stack.runs }
      const { outcomes, injected, wallMs } = await round(cl, acct, plan, runs, fault())
      const failed = outcomes.reduce((n, o) => n + o.failedCommands, 0)
      const lag = Math.max(...outcomes.map((o) => o.ledgerLagMs))
      // The one failure a fault may cause: a start not confirmed in time (the run is failed
      // `infrastructure` before it starts, and the client starts another, as the spec says).
      const again = outcomes.flatMap((o) => o.startedAgain ?? [])
      for (const a of again) expect(a).toMatch(/: the run could not be created in time; start it again$/)
      console.log(
        `${name}: ${outcomes.length} runs (${again.length} started again), ${failed} commands failed, ${cl.seen.retried} requests retried (${[...cl.seen.statuses].map(([s, n]) => `${n}×${s}`).join(" ")}), ledger complete ${(lag / 1000).toFixed(0)} s after a run's end was read at the latest, ${(wallMs / 1000).toFixed(1)} s`,
      )
      expect(injected).toBe(true)
      expect(wrong(cl, outcomes), problems(c.stack)).toEqual([])
      expect(outcomes.map((o) => o.state)).toEqual(Array(runs).fill("succeeded"))
      expect(outcomes.every((o) => o.outputOk === true && o.linesWrong === 0 && o.extra === 0)).toBe(true)
      expect(outcomes.every((o) => o.billed === o.startedMinutes)).toBe(true)
      expect(cl.seen.fiveHundreds).toBe(0)
    }, 600_000)

  it("a host agent SIGKILLed and not restarted: its runs fail infrastructure billed their started minutes, the runs queued behind go to the other hosts", async () => {
    const cl = client(c.urls)
    const plan = { function: fn, appends: 2, minuteMs, runs: c.stack.runs }
    const hostOf = (run: string) =>
      c.stack.run(
        Effect.gen(function* () {
          const { names } = yield* Storage
          const kv = yield* Kv.make(
            names.kv.runs.name,
            Schema.Struct({ host: Schema.optional(Schema.String) }),
          )
          const entry = yield* kv.get(`${acct.id}.${run}`)
          return Option.isSome(entry) ? entry.value.value.host : undefined
        }),
      )
    // Two more runs than the hosts have room for: six run, two wait.
    const start = async () => {
      const answer = await ask(cl, "POST", `/v1/functions/${fn}/runs`, acct.admin, { prompt: "go" })
      expect(answer.status, answer.text).toBe(201)
      c.stack.runs.add(answer.body.id)
      return answer.body.id as string
    }
    const started: Array<string> = []
    for (let i = 0; i < runs + 2; i++) started.push(await start())
    const states = () =>
      Promise.all(started.map((run) => until(cl, `/v1/runs/${run}`, acct.admin, () => true)))
    let now: ReadonlyArray<Json> = await states()
    for (;;) {
      let again = false
      for (const [i, r] of now.entries())
        if (r.state === "failed" && r.started_at === undefined) {
          // A start not confirmed in time (see above): started again, as the spec says.
          expect(r.detail).toBe("the run could not be created in time; start it again")
          started[i] = await start()
          again = true
        } else expect(["queued", "running"], JSON.stringify(r)).toContain(r.state)
      // Until six run and the two others wait (none failed before it started).
      if (!again && now.filter((r) => r.state === "running").length >= runs) break
      await new Promise((r) => setTimeout(r, 500))
      now = await states()
    }
    const queued = started.filter((_, i) => now[i].state === "queued")
    expect(queued.length).toBe(2)
    const dead = c.hosts[0]!
    const hosts = await Promise.all(started.map(hostOf))
    const onDead = started.filter((_, i) => hosts[i] === dead.id)
    expect(onDead.length).toBeGreaterThan(0)
    await dead.role.kill()

    const outcomes = await Promise.all(
      started.map(async (run) =>
        onDead.includes(run)
          ? settle(cl, acct, run, plan, nothingSent)
          : settle(cl, acct, run, plan, await drive(cl, acct, run, plan)),
      ),
    )
    for (const [i, run] of started.entries()) {
      const o = outcomes[i]!
      if (onDead.includes(run)) {
        // The scheduler judged the host gone (its heartbeat stale, and still so 5 s later).
        expect(o, problems(c.stack)).toMatchObject({ state: "failed", failure: "infrastructure" })
        expect(o.startedMinutes).toBeGreaterThan(0)
        expect(o.billed).toBe(o.startedMinutes)
        expect(o.problems).toEqual([])
      } else {
        expect(o.state, `${run}: ${o.detail}\n${problems(c.stack)}`).toBe("succeeded")
        expect(o.problems).toEqual([])
      }
    }
    for (const run of queued) expect(await hostOf(run)).not.toBe(dead.id)
    expect([...cl.seen.where]).toEqual([])

    // The next life of the host id removes what the dead one left (`close` finds nothing), and the
    // scheduler holds none of the failed runs' room against it: a full round uses it again.
    await c.startHost(dead.id)
    const again = client(c.urls)
    const next = await round(again, acct, { ...plan, appends: 1 }, runs)
    expect(wrong(again, next.outcomes), problems(c.stack)).toEqual([])
    const used = await Promise.all(next.outcomes.map((o) => hostOf(o.run!)))
    expect(used).toContain(dead.id)
  }, 600_000)
})

/**
 * The slow end-to-end run cases, through HTTP on the whole stack (`test/harness/Stack.ts`):
 *
 * - 20 runs on a host with room for 2 (2 vCPUs, size `s`) all succeed, start in creation order,
 *   never more than 2 at once, each with its own output (no run lost or mixed up);
 * - a gateway restart and an actor worker kill while runs work lose nothing: every run and
 *   command ends as it should, and every run's compute entries cover its minutes exactly once;
 * - a webhook receiver (HTTPS on loopback with a self-signed certificate, allowed by the test-only
 *   settings) that fails twice then succeeds gets the run's event three times under one id, each
 *   attempt signed (checked with node:crypto's Ed25519, not with our signing code);
 * - a queue timeout: a run that finds no room fails `infrastructure` after the (short) wait;
 * - a host agent SIGKILLed and started again adopts its runs' machines (the runs go on, the
 *   commands it had end failed, their processes killed); a machine that died meanwhile is removed
 *   and its run failed at once; a host agent that never comes back has its runs failed once the
 *   host is judged gone, and the next one sweeps what it left;
 * - a nats-server frozen or killed while a command ends, or while a ready machine is kept (the host
 *   agent's first read of the account's key), loses nothing: the run goes on once it is back.
 */
import { spawnSync } from "node:child_process"
import { createPublicKey, verify } from "node:crypto"
import { mkdtemp, readFile, rm, stat } from "node:fs/promises"
import { createServer, type Server } from "node:https"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { NamespaceDriverSettings } from "../host-agent/machines/namespace/NamespaceDriver.ts"
import { leftovers } from "../host-agent/machines/namespace/testing.ts"
import { minutePriceUsdNanos, sizes } from "../schema/Limits.ts"
import {
  call,
  closeStack,
  command,
  createAccount,
  type Json,
  leftoversOnceGone,
  machineIdOf,
  problems,
  publish,
  request,
  runLog,
  type Stack,
  sendCommandAnswer,
  startRun,
  startStack,
  type TestAccount,
  waitCommand,
  waitCommandRunning,
  waitRun,
} from "./harness/Stack.ts"
import { selfSigned } from "./harness/Tls.ts"

interface Delivery {
  readonly id: string
  readonly timestamp: string
  readonly signature: string
  readonly body: string
  readonly status: number
}

/** An HTTPS receiver that answers 500 to the first two attempts of each event id, then 200. */
const receiver = async (tls: { key: Buffer; cert: Buffer }) => {
  const deliveries: Array<Delivery> = []
  const seen = new Map<string, number>()
  const server: Server = createServer(tls, (req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      const id = String(req.headers["webhook-id"])
      const n = (seen.get(id) ?? 0) + 1
      seen.set(id, n)
      const status = n <= 2 ? 500 : 200
      deliveries.push({
        id,
        timestamp: String(req.headers["webhook-timestamp"]),
        signature: String(req.headers["webhook-signature"]),
        body: Buffer.concat(chunks).toString("utf8"),
        status,
      })
      res.writeHead(status).end()
    })
  })
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok))
  const address = server.address()
  const port = typeof address === "object" && address !== null ? address.port : 0
  return {
    url: `https://127.0.0.1:${port}/hook`,
    deliveries,
    close: () => new Promise<void>((ok) => server.close(() => ok())),
  }
}

/** The run's compute entries in `GET /v1/usage`, oldest first. */
const computeEntries = async (stack: Stack, who: TestAccount, run: string): Promise<Array<Json>> => {
  const usage = await call(stack, "GET", "/v1/usage", who.owner)
  expect(usage.status).toBe(200)
  return usage.body.entries
    .filter((e: Json) => e.kind === "compute" && e.run === run)
    .sort((a: Json, b: Json) => a.from_minute - b.from_minute)
}

/** Minutes 1..n once each, amounts matching; answers n. */
const expectWholeMinutes = (entries: ReadonlyArray<Json>): number => {
  const price = minutePriceUsdNanos(sizes.s.memoryMib)
  let next = 1
  for (const e of entries) {
    expect(e.from_minute).toBe(next)
    expect(e.amount_usd_nanos).toBe(-(e.through_minute - e.from_minute + 1) * price)
    next = e.through_minute + 1
  }
  return next - 1
}

/**
 * Four runs with work sent while queued; the gateway is restarted while the first runs and the
 * actor worker killed (no drain, leases left to expire) while the second does: every run and
 * command still succeeds, and each run is billed its whole minutes once.
 */
const restartsLoseNothing = async (stack: Stack, acct: TestAccount, minuteMs: number) => {
  const fn = await publish(stack, acct, { timeout_minutes: 600 })
  const runs: Array<string> = []
  for (let i = 0; i < 4; i++) runs.push((await startRun(stack, acct, fn.function, { prompt: `r${i}` })).id)
  const commands = new Map<string, Array<string>>()
  for (const [i, run] of runs.entries()) {
    const ids: Array<string> = []
    for (const [kind, args] of [
      ["bash", { command: "sleep 3" }],
      ["write", { file_path: "out/result.txt", content: `r${i}` }],
      ["finish", { state: "succeeded" }],
    ] as const) {
      const sent = await sendCommandAnswer(stack, acct, run, kind, args)
      expect(sent.status, sent.text).toBe(201)
      ids.push(sent.body.id)
    }
    commands.set(run, ids)
  }
  await waitRun(stack, acct, runs[0]!, { until: (r) => r.state === "running" })
  await stack.stopGateway()
  await stack.startGateway()
  // Run 1 may already be over when the gateway is back (a role in its own process restarts
  // slower): the kill still comes while runs 2 and 3 wait for the room it frees.
  await waitRun(stack, acct, runs[1]!, { until: (r) => r.state !== "queued" })
  await stack.killActors()
  await stack.startActors()
  for (const run of runs) {
    const ended = await waitRun(stack, acct, run, { timeoutMs: 180_000 })
    expect(ended.state, `${JSON.stringify(ended)}\n${problems(stack)}`).toBe("succeeded")
    for (const id of commands.get(run)!) {
      const c = await waitCommand(stack, acct, run, id)
      expect(c.state, JSON.stringify(c)).toBe("succeeded")
    }
    const started = Math.max(
      1,
      Math.ceil((Date.parse(ended.ended_at) - Date.parse(ended.started_at)) / minuteMs),
    )
    // The last minute's charge may still be on its way to the account actor (its partition moved
    // with the killed worker): the ledger is read until it holds the run's minutes, never past.
    const deadline = Date.now() + 60_000
    let minutes = expectWholeMinutes(await computeEntries(stack, acct, run))
    while (minutes < started && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 250))
      minutes = expectWholeMinutes(await computeEntries(stack, acct, run))
    }
    expect(minutes).toBe(started)
  }
}

describe("a host with room for two", () => {
  const minuteMs = 2_000
  let stack: Stack
  let acct: TestAccount
  let dir: string
  let hook: Awaited<ReturnType<typeof receiver>>

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "hangar-runs-heavy-"))
    const tls = await selfSigned(dir)
    hook = await receiver(tls)
    stack = await startStack({
      hostVcpus: 2,
      minuteMs: minuteMs,
      queueTimeoutMs: 600_000,
      webhookAllowPrivate: true,
      webhookCaFile: tls.certFile,
      webhookDelaysMs: [0, 300, 300],
    })
    acct = await createAccount(stack, { creditUsd: 100, memoryMib: 64 * 1024 })
  }, 120_000)

  afterAll(async () => {
    await hook?.close()
    if (dir) await rm(dir, { recursive: true, force: true })
    await closeStack(stack)
  }, 120_000)

  it("20 runs complete, started in creation order, at most 2 at once, none lost", async () => {
    const fn = await publish(stack, acct, { timeout_minutes: 600 })
    const runs: Array<string> = []
    for (let i = 0; i < 20; i++)
      runs.push((await startRun(stack, acct, fn.function, { prompt: `run ${i}` })).id)
    // Each run's work is sent while it is queued: it runs when its machine is ready.
    for (const [i, run] of runs.entries()) {
      for (const [kind, args] of [
        ["bash", { command: `mkdir -p out && echo ${i} > out/result.txt` }],
        ["finish", { state: "succeeded" }],
      ] as const) {
        const sent = await sendCommandAnswer(stack, acct, run, kind, args)
        expect(sent.status, sent.text).toBe(201)
      }
    }
    const ended: Array<Json> = []
    for (const run of runs) ended.push(await waitRun(stack, acct, run, { timeoutMs: 300_000 }))
    for (const [i, r] of ended.entries()) {
      expect(r.state, `run ${i}: ${JSON.stringify(r)}\n${problems(stack)}`).toBe("succeeded")
      expect(r.prompt).toBe(`run ${i}`)
      const archive = await request(r.output.url)
      expect(archive.status).toBe(200)
      const listing = spawnSync("tar", ["-xzO", "-f", "-"], { input: archive.data })
      expect(listing.stdout.toString("utf8")).toBe(`${i}\n`)
    }
    const starts = ended.map((r) => Date.parse(r.started_at))
    expect(starts).toEqual([...starts].sort((a, b) => a - b))
    // Never more than two at work at once.
    for (const r of ended) {
      const at = Date.parse(r.started_at)
      const working = ended.filter((o) => Date.parse(o.started_at) <= at && Date.parse(o.ended_at) > at)
      expect(working.length).toBeLessThanOrEqual(2)
    }
  }, 400_000)

  it(
    "a gateway restart and an actor worker kill during runs lose nothing",
    () => restartsLoseNothing(stack, acct, minuteMs),
    400_000,
  )

  it("a receiver failing twice then answering 200 gets the run's event three times under one id, signed", async () => {
    const fn = await publish(stack, acct)
    const run = (await startRun(stack, acct, fn.function, { webhook: hook.url })).id
    await command(stack, acct, run, "finish", { state: "failed", detail: "stop here" })
    const ended = await waitRun(stack, acct, run)
    expect(ended.state).toBe("failed")
    const events = async () =>
      hook.deliveries.filter((d) => {
        const body = JSON.parse(d.body)
        return body.type === "run.failed" && body.data?.id === run
      })
    const deadline = Date.now() + 60_000
    while ((await events()).length < 3 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100))
    const got = await events()
    expect(
      got.map((d) => d.status),
      problems(stack),
    ).toEqual([500, 500, 200])
    expect(new Set(got.map((d) => d.id)).size).toBe(1)
    expect(new Set(got.map((d) => d.body)).size).toBe(1)
    const body = JSON.parse(got[0]!.body)
    expect(body.data).toMatchObject({ id: run, state: "failed", failure: "no_submission" })

    // Each attempt verifies with the account's published key (raw Ed25519 public key in base64).
    const keys = await call(stack, "GET", "/v1/webhooks/public-key", acct.owner)
    expect(keys.status).toBe(200)
    const raw = Buffer.from(String(keys.body.keys[0]).slice("whpk_".length), "base64")
    const publicKey = createPublicKey({
      key: { kty: "OKP", crv: "Ed25519", x: raw.toString("base64url") },
      format: "jwk",
    })
    for (const d of got) {
      const [version, signature] = d.signature.split(",")
      expect(version).toBe("v1a")
      const content = Buffer.from(`${d.id}.${d.timestamp}.${d.body}`, "utf8")
      expect(verify(null, content, publicKey, Buffer.from(signature!, "base64"))).toBe(true)
    }
  }, 120_000)
})

describe("a host with no room", () => {
  let stack: Stack
  let acct: TestAccount

  beforeAll(async () => {
    // The log route's wait for a last part made an hour: a read that waited for one from a run no
    // host took would outlast the test.
    stack = await startStack({
      hostVcpus: 1,
      queueTimeoutMs: 3_000,
      settings: { RUN_LOG_WAIT_MS: 3_600_000 },
    })
    acct = await createAccount(stack, { creditUsd: 10 })
  }, 120_000)

  afterAll(() => closeStack(stack), 120_000)

  it("a run that finds no room within the queue timeout fails infrastructure and is not billed", async () => {
    const fn = await publish(stack, acct, { timeout_minutes: 600 })
    const holder = (await startRun(stack, acct, fn.function)).id
    await waitRun(stack, acct, holder, { until: (r) => r.state === "running" })
    const waiting = (await startRun(stack, acct, fn.function)).id
    const ended = await waitRun(stack, acct, waiting, { timeoutMs: 60_000 })
    expect(ended, problems(stack)).toMatchObject({ state: "failed", failure: "infrastructure" })
    expect(ended.started_at).toBeUndefined()
    expect(ended.detail).toBeTruthy()
    // No machine, no log: answered at once, empty.
    expect(await runLog(stack, acct, waiting)).toEqual([])
    await command(stack, acct, holder, "finish", { state: "failed" })
    await waitRun(stack, acct, holder)
    const usage = await call(stack, "GET", "/v1/usage", acct.owner)
    expect(usage.body.entries.filter((e: Json) => e.run === waiting)).toEqual([])
  }, 120_000)
})

describe("every role in its own process (hangar serve <role>)", () => {
  const minuteMs = 2_000
  let stack: Stack
  let acct: TestAccount

  beforeAll(async () => {
    // Log parts every second: the adoption test waits for the earlier life's first part.
    stack = await startStack({
      hostVcpus: 2,
      minuteMs: minuteMs,
      queueTimeoutMs: 600_000,
      processes: true,
      logFlushMs: 1_000,
    })
    acct = await createAccount(stack, { creditUsd: 100, memoryMib: 64 * 1024 })
  }, 120_000)

  afterAll(() => closeStack(stack), 120_000)

  it(
    "a gateway restart and an actor worker process SIGKILLed during runs lose nothing",
    () => restartsLoseNothing(stack, acct, minuteMs),
    400_000,
  )

  // Billed for the minutes it ran, no more.
  const billedMinutes = async (run: string) => {
    const usage = await call(stack, "GET", "/v1/usage", acct.owner)
    const entries = usage.body.entries.filter((e: Json) => e.run === run)
    return entries.reduce((n: number, e: Json) => n + e.through_minute - e.from_minute + 1, 0)
  }
  const ranMinutes = (ended: Json) =>
    Math.max(1, Math.ceil((Date.parse(ended.ended_at) - Date.parse(ended.started_at)) / minuteMs))
  const logOf = (run: string) => runLog(stack, acct, run)
  // A run of its own, with a file written and a command left sleeping in it.
  const busyRun = async (fn: Json) => {
    const run = (await startRun(stack, acct, fn.function)).id
    expect((await command(stack, acct, run, "bash", { command: "echo kept > /workspace/state" })).state).toBe(
      "succeeded",
    )
    const sleeper = await sendCommandAnswer(stack, acct, run, "bash", { command: "sleep 600" })
    expect(sleeper.status).toBe(201)
    await waitCommandRunning(stack, acct, run, sleeper.body.id)
    return { run, sleeper: sleeper.body.id as string }
  }

  it("a host agent SIGKILLed and started again adopts its runs' machines: the runs go on, the commands it had end failed", async () => {
    const fn = await publish(stack, acct, { timeout_minutes: 600 })
    const { run, sleeper } = await busyRun(fn)
    // Lines not yet stored as a part go with a killed process; wait until a stored part holds the
    // `ready` line (the first part, written a flush after the log began, may hold only `machine`).
    const deadline = Date.now() + 30_000
    while (!(await logOf(run)).some((l) => l.kind === "ready")) {
      if (Date.now() > deadline) throw new Error("no stored log part holds the ready line")
      await new Promise((r) => setTimeout(r, 100))
    }
    await stack.killHost()
    // Killed outright: the machine outlives its agent.
    expect(await leftovers(machineIdOf(run))).not.toEqual([])
    // A command sent while no host agent is there: it comes after the restart and ends failed too
    // (whether the earlier life took it is not known).
    const meanwhile = await sendCommandAnswer(stack, acct, run, "bash", { command: "echo meanwhile" })
    expect(meanwhile.status).toBe(201)
    await stack.startHost()
    for (const id of [sleeper, meanwhile.body.id]) {
      const ended = await waitCommand(stack, acct, run, id)
      expect(ended, problems(stack)).toMatchObject({
        state: "failed",
        error: expect.stringContaining("host agent restarted"),
      })
    }
    // The same machine: the file is there, the earlier life's sleep is not.
    const after = await command(stack, acct, run, "bash", {
      command:
        "cat /workspace/state; for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -cx sleep || true",
    })
    expect(after.result.output).toBe("kept\n0\n")
    expect((await call(stack, "GET", `/v1/runs/${run}`, acct.owner)).body.state).toBe("running")
    await command(stack, acct, run, "bash", { command: "echo done > /workspace/out/result.txt" })
    expect((await command(stack, acct, run, "finish", { state: "succeeded" })).result).toEqual({
      accepted: true,
    })
    const ended = await waitRun(stack, acct, run, { timeoutMs: 60_000 })
    expect(ended, problems(stack)).toMatchObject({ state: "succeeded", output: { file_count: 1 } })
    // The log goes on after the earlier life's parts (none is written over): its lines and the adoption.
    const lines = (await logOf(run)).map((l) => l.kind)
    expect(lines).toEqual(expect.arrayContaining(["machine", "ready", "adopted", "finish", "end"]))
    expect(lines.indexOf("ready")).toBeLessThan(lines.indexOf("adopted"))
    expect(await leftoversOnceGone(run)).toEqual([])
    expect(await billedMinutes(run)).toBe(ranMinutes(ended))
  }, 180_000)

  it("a host agent SIGKILLed while a run's machine is set up: the next one starts the run over on a new machine", async () => {
    // Setup writes a mark and takes a while: the kill comes while it runs, before the run is ready.
    const fn = await publish(stack, acct, {
      timeout_minutes: 600,
      setup: ["echo set-up >> /workspace/setups; sleep 2"],
    })
    const run = (await startRun(stack, acct, fn.function)).id
    const started = await waitRun(stack, acct, run, { until: (r) => r.state === "running" })
    expect(started.state).toBe("running")
    const deadline = Date.now() + 30_000
    while ((await leftovers(machineIdOf(run))).length === 0 && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 20))
    await stack.killHost()
    await stack.startHost()
    // A new machine: setup ran once on it (the first machine's mark went with that machine).
    const after = await command(stack, acct, run, "bash", { command: "cat /workspace/setups" })
    expect(after, problems(stack)).toMatchObject({ state: "succeeded", result: { output: "set-up\n" } })
    await command(stack, acct, run, "bash", { command: "echo done > /workspace/out/result.txt" })
    expect((await command(stack, acct, run, "finish", { state: "succeeded" })).result).toEqual({
      accepted: true,
    })
    const ended = await waitRun(stack, acct, run, { timeoutMs: 60_000 })
    expect(ended, problems(stack)).toMatchObject({ state: "succeeded" })
    const machines = (await logOf(run)).filter((l) => l.kind === "machine")
    expect(machines.at(-1)).toMatchObject({ started_over: true })
    expect(await leftoversOnceGone(run)).toEqual([])
    expect(await billedMinutes(run)).toBe(ranMinutes(ended))
  }, 180_000)

  it("a machine that died with its host agent is removed by the next one, and its run failed at once", async () => {
    const fn = await publish(stack, acct, { timeout_minutes: 600 })
    const { run, sleeper } = await busyRun(fn)
    await stack.killHost()
    // The machine's first process (its sshd) goes too: nothing is left to adopt.
    const keptFile = join(NamespaceDriverSettings.defaults.machinesDir, machineIdOf(run), "kept.json")
    // What a later life needs is kept for root alone, the login key sealed.
    expect((await stat(keptFile)).mode & 0o777).toBe(0o600)
    const text = await readFile(keptFile, "utf8")
    expect(text).not.toContain("PRIVATE KEY")
    const kept = JSON.parse(text)
    process.kill(Number(kept.machine.handle.pid), "SIGKILL")
    await stack.startHost()
    const ended = await waitRun(stack, acct, run, { timeoutMs: 60_000 })
    expect(ended, problems(stack)).toMatchObject({
      state: "failed",
      failure: "infrastructure",
      detail: expect.stringContaining("host agent restarted"),
    })
    expect((await waitCommand(stack, acct, run, sleeper)).state).toBe("cancelled")
    expect(await leftoversOnceGone(run)).toEqual([])
    expect(await billedMinutes(run)).toBe(ranMinutes(ended))
    // The host takes new runs again.
    const next = (await startRun(stack, acct, fn.function)).id
    expect((await command(stack, acct, next, "bash", { command: "echo again" })).result.output).toBe(
      "again\n",
    )
    await command(stack, acct, next, "finish", { state: "failed" })
  }, 180_000)

  it("a host agent that does not come back: its runs fail infrastructure, and the next one on the host sweeps what it left", async () => {
    const fn = await publish(stack, acct, { timeout_minutes: 600 })
    const { run } = await busyRun(fn)
    await stack.killHost()
    // Failed once the host is judged gone (no heartbeat for the stale window), not at the run's time-out.
    const ended = await waitRun(stack, acct, run, { timeoutMs: 90_000 })
    expect(ended, problems(stack)).toMatchObject({ state: "failed", failure: "infrastructure" })
    // Its log never gets its machine's end: read, it answers what there is (after the route's wait).
    expect((await logOf(run)).map((l) => l.kind)).not.toContain("end")
    expect(await billedMinutes(run)).toBe(ranMinutes(ended))
    expect(await leftovers(machineIdOf(run))).not.toEqual([])
    await stack.startHost()
    expect(await leftoversOnceGone(run)).toEqual([])
  }, 180_000)
})

describe("a nats-server that stands still, or is killed and started again, while a command ends or a machine is kept", () => {
  let stack: Stack
  let acct: TestAccount

  beforeAll(async () => {
    stack = await startStack({ natsSyncAlways: true })
    acct = await createAccount(stack, { creditUsd: 100 })
  }, 120_000)

  afterAll(() => closeStack(stack), 120_000)

  it("the command's end is written once the server answers again, and the run goes on", async () => {
    const fn = await publish(stack, acct, { timeout_minutes: 60 })
    const run = (await startRun(stack, acct, fn.function)).id
    expect((await command(stack, acct, run, "bash", { command: "echo up" })).state).toBe("succeeded")
    // No output: its end is the first write after it starts, made while the server stands still.
    const sent = await sendCommandAnswer(stack, acct, run, "bash", { command: "sleep 2; exit 4" })
    expect(sent.status).toBe(201)
    await waitCommandRunning(stack, acct, run, sent.body.id)
    // Frozen (SIGSTOP) while the command runs, for longer than a write waits (5 s): the write of its
    // end times out on the host agent. (A stopped server still takes the write from its socket once
    // it runs again, so this shows a freeze loses nothing; it cannot tell whether the write was
    // retried — a write lost with a killed server's connection is what the retry is for.)
    process.kill(stack.natsPid, "SIGSTOP")
    try {
      await new Promise((r) => setTimeout(r, 9_000))
    } finally {
      process.kill(stack.natsPid, "SIGCONT")
    }
    const ended = await waitCommand(stack, acct, run, sent.body.id, 60_000)
    expect(ended, problems(stack)).toMatchObject({
      state: "succeeded",
      result: { exit_code: 4, output: "" },
    })
    expect((await command(stack, acct, run, "bash", { command: "echo after" })).result.output).toBe("after\n")
    const run_ = (await call(stack, "GET", `/v1/runs/${run}`, acct.admin)).body
    expect(run_.state).toBe("running")
    await command(stack, acct, run, "finish", { state: "failed" })
  }, 180_000)

  it("a machine kept while the server stands still (the host agent's first read of the account's key) is ready once it answers again", async () => {
    // An account of its own: the host agent has not read its data key yet. Keeping a ready machine
    // seals its login key for the account, so that read comes when setup ends, in the freeze.
    const fresh = await createAccount(stack, { creditUsd: 100 })
    const fn = await publish(stack, fresh, { timeout_minutes: 60, setup: ["sleep 4"] })
    const run = (await startRun(stack, fresh, fn.function)).id
    expect((await waitRun(stack, fresh, run, { until: (r) => r.state === "running" })).state).toBe("running")
    await new Promise((r) => setTimeout(r, 1_500))
    process.kill(stack.natsPid, "SIGSTOP")
    try {
      await new Promise((r) => setTimeout(r, 9_000))
    } finally {
      process.kill(stack.natsPid, "SIGCONT")
    }
    const up = await command(stack, fresh, run, "bash", { command: "echo up" })
    expect(up, problems(stack)).toMatchObject({ state: "succeeded", result: { output: "up\n" } })
    expect((await call(stack, "GET", `/v1/runs/${run}`, fresh.admin)).body.state).toBe("running")
    await command(stack, fresh, run, "finish", { state: "failed" })
  }, 180_000)

  it("killed outright: the gateway answers 503 with Retry-After meanwhile, and once it is back the command's end is written and the run goes on", async () => {
    const fn = await publish(stack, acct, { timeout_minutes: 60 })
    const run = (await startRun(stack, acct, fn.function)).id
    expect((await command(stack, acct, run, "bash", { command: "echo up" })).state).toBe("succeeded")
    const sent = await sendCommandAnswer(stack, acct, run, "bash", { command: "sleep 2; exit 5" })
    expect(sent.status).toBe(201)
    await waitCommandRunning(stack, acct, run, sent.body.id)
    await stack.killNats()
    try {
      // The command ends while the server is gone: its end is written on the host agent's retry.
      await new Promise((r) => setTimeout(r, 3_000))
      const health = await call(stack, "GET", "/v1/health", {})
      expect(health.status).toBe(503)
      expect(health.body).toEqual({ status: "unavailable" })
      for (const [method, path, body] of [
        ["GET", `/v1/runs/${run}`, undefined],
        ["GET", `/v1/runs/${run}/commands/${sent.body.id}`, undefined],
        ["POST", `/v1/runs/${run}/commands`, { kind: "bash", arguments: { command: "true" } }],
      ] as const) {
        const answer = await call(stack, method, path, acct.admin, body)
        expect(answer.status, `${method} ${path}`).toBe(503)
        expect(answer.body.code).toBe("internal")
        expect(answer.headers["retry-after"]).toBe("2")
      }
    } finally {
      await stack.restartNats()
    }
    const ended = await waitCommand(stack, acct, run, sent.body.id, 60_000)
    expect(ended, problems(stack)).toMatchObject({
      state: "succeeded",
      result: { exit_code: 5, output: "" },
    })
    // Back: the gateway answers again, and the run takes commands.
    const health = await waitFor(async () => (await call(stack, "GET", "/v1/health", {})).status, 200)
    expect(health).toBe(200)
    expect((await command(stack, acct, run, "bash", { command: "echo after" })).result.output).toBe("after\n")
    expect((await call(stack, "GET", `/v1/runs/${run}`, acct.admin)).body.state).toBe("running")
    await command(stack, acct, run, "finish", { state: "failed" })
    // Nothing was answered 500 the whole time (the log has a line per request: the 503s are there).
    const statuses = (status: number) =>
      stack.lines.filter((l) => l.role === "gateway" && l.line.includes(`"status":${status},`))
    expect(statuses(503).length).toBeGreaterThanOrEqual(4)
    expect(statuses(500)).toEqual([])
  }, 180_000)
})

/** Polls `f` until it answers `want` (at most 60 s); answers the last value. */
const waitFor = async <A>(f: () => Promise<A>, want: A): Promise<A> => {
  const deadline = Date.now() + 60_000
  let last = await f()
  while (last !== want && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100))
    last = await f()
  }
  return last
}

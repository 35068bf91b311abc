/**
 * The one-process mode as `npm start` runs it: `hangar serve all` as a child process with its data
 * in a temporary folder. It starts nats-server, creates the storage, serves the API, refuses a
 * second start on the same data, and stops everything on SIGINT.
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import { existsSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { root } from "../deploy/tools.mjs"
import { type Base, ensureTestBase } from "../host-agent/bases/Bases.ts"
import { leftovers } from "../host-agent/machines/namespace/testing.ts"
import { machineIdOf } from "./harness/Stack.ts"

interface Started {
  readonly child: ChildProcess
  readonly lines: Array<Record<string, unknown>>
  readonly stderr: () => string
  readonly stdout: () => string
}

const bin = join(root, "cli", "bin.cjs")

// `detached`: the process leads its own process group, as a terminal's foreground job does, so the
// test can signal the whole group the way Ctrl-C does.
const start = (dataDir: string, detached = false): Started => {
  const child = spawn(process.execPath, [bin, "serve", "all"], {
    detached,
    env: {
      ...process.env,
      HANGAR_DATA_DIR: dataDir,
      HANGAR_NATS_PORT: "-1",
      HANGAR_HTTP_ADDR: "127.0.0.1:0",
    },
    stdio: ["ignore", "pipe", "pipe"],
  })
  const lines: Array<Record<string, unknown>> = []
  let text = ""
  child.stderr!.on("data", (chunk: Buffer) => {
    text += chunk.toString("utf8")
    for (const line of chunk.toString("utf8").split("\n")) {
      if (line.startsWith("{")) {
        try {
          lines.push(JSON.parse(line))
        } catch {
          // a line split across chunks; the full text is still in `text`
        }
      }
    }
  })
  let out = ""
  child.stdout!.on("data", (chunk: Buffer) => {
    out += chunk.toString("utf8")
  })
  return { child, lines, stderr: () => text, stdout: () => out }
}

const waitFor = async <A>(what: string, probe: () => A | undefined, started: Started): Promise<A> => {
  for (let i = 0; i < 600; i++) {
    const found = probe()
    if (found !== undefined) return found
    if (started.child.exitCode !== null) throw new Error(`exited before ${what}: ${started.stderr()}`)
    await new Promise((r) => setTimeout(r, 50))
  }
  throw new Error(`no ${what}: ${started.stderr()}`)
}

const exited = (child: ChildProcess): Promise<number | null> =>
  child.exitCode !== null
    ? Promise.resolve(child.exitCode)
    : new Promise((resolve) => child.once("exit", (code) => resolve(code)))

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

describe("hangar serve all", () => {
  let dataDir: string
  let first: Started
  let api: string
  let natsUrl: string
  let natsPid: number
  let base: Base
  let token: string
  let account: string

  beforeAll(async () => {
    // The host agent offers the bases on this host's disk; the run below uses the test base.
    base = await ensureTestBase()
    dataDir = await mkdtemp(join(tmpdir(), "hangar-serve-"))
    first = start(dataDir, true)
    const nats = await waitFor(
      "nats-server",
      () => first.lines.find((l) => l.msg === "local nats-server started"),
      first,
    )
    natsUrl = String(nats.url)
    natsPid = Number(nats.pid)
    const listening = await waitFor(
      "gateway",
      () => first.lines.find((l) => l.msg === "gateway listening"),
      first,
    )
    api = String(listening.url)
    await waitFor("start", () => first.lines.find((l) => l.msg === "hangar is up (Ctrl-C stops it)"), first)
  })

  afterAll(async () => {
    if (first?.child.exitCode === null) {
      first.child.kill("SIGKILL")
      await exited(first.child)
    }
    if (natsPid && alive(natsPid)) process.kill(natsPid, "SIGKILL")
    await rm(dataDir, { recursive: true, force: true })
  })

  it("answers GET /v1/health with 200", async () => {
    const res = await fetch(`${api}/v1/health`)
    expect(res.status).toBe(200)
    expect(await res.json()).toEqual({ status: "ok" })
    expect(res.headers.get("x-request-id")).toMatch(/\S+/)
  })

  it("creates a first account and prints how to get its owner's token, which works", async () => {
    const created = first.lines.find((l) => l.msg === "first account created")
    expect(created?.owner).toBe("owner@hangar.local")
    account = String(created?.account)
    expect(first.stdout()).toContain(`first account ${account}, owned by owner@hangar.local`)
    expect(first.stdout()).toContain("npx hangar admin token --email owner@hangar.local")
    const minted = spawnSync(process.execPath, [bin, "admin", "token", "--email", "owner@hangar.local"], {
      env: { ...process.env, HANGAR_DATA_DIR: dataDir, HANGAR_NATS_URL: natsUrl },
      encoding: "utf8",
    })
    expect(minted.status).toBe(0)
    token = (JSON.parse(minted.stdout) as { token: string }).token
    const res = await fetch(`${api}/v1/account`, {
      headers: { authorization: `Bearer ${token}`, "service-account": account },
    })
    expect(res.status).toBe(200)
    // With credit to start a run at once ($10, a visible adjustment).
    expect(await res.json()).toMatchObject({
      id: account,
      name: "local",
      role: "owner",
      balance: { balance_usd_nanos: 10_000_000_000 },
    })
    expect(first.stdout()).toContain("with $10 of credit to start with")
  })

  it("answers other routes with the spec's not_found envelope", async () => {
    const res = await fetch(`${api}/v1/no-such-route`)
    expect(res.status).toBe(404)
    expect(await res.json()).toEqual({ error: expect.any(String), code: "not_found" })
  })

  it("created the storage map on its nats-server, with the data under the data folder", async () => {
    const nc = await connect({ servers: natsUrl })
    try {
      const jsm = await jetstreamManager(nc)
      const names: Array<string> = []
      for await (const info of jsm.streams.list()) names.push(info.config.name)
      expect(names).toEqual(
        expect.arrayContaining(["MAILBOX", "OUTPUT", "LEDGER", "EVENTS", "KV_runs", "OBJ_inputs"]),
      )
    } finally {
      await nc.close()
    }
    expect(existsSync(join(dataDir, "nats", "jetstream"))).toBe(true)
  })

  it("a second start on the same data says so and exits non-zero, leaving the first running", async () => {
    const second = start(dataDir)
    const code = await exited(second.child)
    expect(code).not.toBe(0)
    expect(second.stderr()).toMatch(/already running/i)
    const res = await fetch(`${api}/v1/health`)
    expect(res.status).toBe(200)
  })

  it("Ctrl-C (SIGINT to the whole process group) with a run on a machine stops every part at once and leaves nothing", async () => {
    const headers = {
      authorization: `Bearer ${token}`,
      "service-account": account,
      "content-type": "application/json",
    }
    const env = { ...process.env, HANGAR_DATA_DIR: dataDir, HANGAR_NATS_URL: natsUrl }
    expect(
      spawnSync(process.execPath, [bin, "admin", "credit", "--account", account, "--usd", "5"], { env })
        .status,
    ).toBe(0)
    const fn = await fetch(`${api}/v1/functions`, {
      method: "POST",
      headers,
      body: JSON.stringify({
        name: "ctrl-c",
        system_prompt: "x",
        provider: "none",
        base: base.name,
        size: "s",
        output_manifest: [{ path: "r.txt" }],
      }),
    })
    expect(fn.status).toBe(201)
    const fnId = ((await fn.json()) as { function: string }).function
    const started = await fetch(`${api}/v1/functions/${fnId}/runs`, {
      method: "POST",
      headers,
      body: JSON.stringify({ prompt: "go" }),
    })
    expect(started.status).toBe(201)
    const run = ((await started.json()) as { id: string }).id
    // Running, with a machine and a command still going.
    for (let i = 0; ; i++) {
      const r = (await (await fetch(`${api}/v1/runs/${run}`, { headers })).json()) as { state: string }
      if (r.state === "running") break
      if (i > 600) throw new Error(`run never ran: ${JSON.stringify(r)}`)
      await new Promise((res) => setTimeout(res, 50))
    }
    const cmd = await fetch(`${api}/v1/runs/${run}/commands`, {
      method: "POST",
      headers,
      body: JSON.stringify({ kind: "bash", arguments: { command: "sleep 600" } }),
    })
    expect(cmd.status).toBeLessThan(300)
    expect(await leftovers(machineIdOf(run))).not.toEqual([])

    const t0 = performance.now()
    process.kill(-first.child.pid!, "SIGINT")
    expect(await exited(first.child)).toBe(0)
    const seconds = (performance.now() - t0) / 1000
    console.log(`Ctrl-C to exit: ${seconds.toFixed(2)} s`)
    // nats-server was outside the group: still serving while the roles shut down, then stopped.
    expect(first.stderr()).not.toMatch(/partition release failed|timed out/i)
    expect(alive(natsPid)).toBe(false)
    expect(existsSync(join(dataDir, "hangar.lock"))).toBe(false)
    await expect(fetch(`${api}/v1/health`)).rejects.toThrow()
    expect(await leftovers(machineIdOf(run))).toEqual([])
  })
})

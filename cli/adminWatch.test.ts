/**
 * `hangar admin watch` as an operator runs it (`node cli/bin.cjs`, stdout a pipe: JSON lines)
 * against a real nats-server: it prints the events of the account it follows, live, and ends after
 * `--count`; bad arguments exit 2 with nothing on stdout.
 */
import { execFile, spawn } from "node:child_process"
import { join } from "node:path"
import { promisify } from "node:util"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { hostRecord, removeHost, writeHost } from "../actors/run/testing.ts"
import { clientLayer } from "../core/actors/testing/Harness.ts"
import { makeId } from "../core/Ids.ts"
import * as OperatorEvents from "../core/OperatorEvents.ts"
import { type StartedNatsServer, startNatsServer } from "../test/harness/NatsServer.ts"
import { uniquePrefix } from "../test/harness/names.ts"

const bin = join(import.meta.dirname, "bin.cjs")
let nats: StartedNatsServer
let prefix: string
let env: NodeJS.ProcessEnv

beforeAll(async () => {
  nats = await startNatsServer()
  prefix = uniquePrefix()
  env = { ...process.env, HANGAR_NATS_URL: nats.url, HANGAR_STORAGE_PREFIX: prefix }
}, 60_000)
afterAll(() => nats?.stop())

const publishQueued = (account: string, run: string) =>
  Effect.runPromise(
    OperatorEvents.publish({
      type: "run.state",
      v: 1,
      at: new Date().toISOString(),
      account,
      run,
      state: "queued",
    }).pipe(Effect.provide(clientLayer(nats.url, prefix)), Effect.scoped),
  )

describe("hangar admin watch", () => {
  it("prints the followed account's events as JSON lines, live, and ends after --count", async () => {
    const [mine, other] = [makeId("acc"), makeId("acc")]
    const child = spawn(process.execPath, [bin, "admin", "watch", "--account", mine, "--count", "2"], {
      env,
      stdio: ["ignore", "pipe", "pipe"],
    })
    let stdout = ""
    child.stdout.setEncoding("utf8").on("data", (c: string) => {
      stdout += c
    })
    const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)))
    let done = false
    void exited.then(() => {
      done = true
    })
    // Published until it has both (it subscribes once it has started).
    const deadline = Date.now() + 60_000
    while (!done && Date.now() < deadline) {
      await publishQueued(other, makeId("run"))
      await publishQueued(mine, makeId("run"))
      await new Promise((r) => setTimeout(r, 100))
    }
    expect(await exited).toBe(0)
    const lines = stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l))
    expect(lines).toHaveLength(2)
    for (const e of lines)
      expect(e).toMatchObject({ type: "run.state", v: 1, account: mine, state: "queued" })
  }, 90_000)

  it("--hosts prints each host as it is, then its changes, then its removal", async () => {
    const host = `watch-${makeId("acc").slice(-8)}`
    const inStore = <A, E>(fx: Effect.Effect<A, E, never>) => Effect.runPromise(fx)
    const client = clientLayer(nats.url, prefix)
    await inStore(
      writeHost(hostRecord(host, { vcpus: 14, memory_mib: 8192 })).pipe(
        Effect.provide(client),
        Effect.scoped,
      ),
    )
    const child = spawn(process.execPath, [bin, "admin", "watch", "--hosts", "--count", "3"], {
      env,
      stdio: ["ignore", "pipe", "pipe"],
    })
    let stdout = ""
    let lines = 0
    const seen = (n: number) =>
      new Promise<void>((resolve) => {
        const check = () => {
          if (lines >= n) resolve()
          else setTimeout(check, 50)
        }
        check()
      })
    child.stdout.setEncoding("utf8").on("data", (c: string) => {
      stdout += c
      lines = stdout.split("\n").length - 1
    })
    const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)))
    await seen(1)
    await inStore(
      writeHost({ ...hostRecord(host, { vcpus: 14, memory_mib: 8192 }), free_vcpus: 12 }).pipe(
        Effect.provide(client),
        Effect.scoped,
      ),
    )
    await seen(2)
    await inStore(removeHost(host).pipe(Effect.provide(client), Effect.scoped))
    expect(await exited).toBe(0)
    const printed = stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l))
    expect(printed).toEqual([
      expect.objectContaining({ type: "host", host, live: true, vcpus: 14, free_vcpus: 14, machines: 0 }),
      expect.objectContaining({ type: "host", host, free_vcpus: 12 }),
      { type: "host.removed", host },
    ])
  }, 90_000)

  it("refuses a bad account, run or count (2), nothing on stdout", async () => {
    for (const args of [
      ["--account", "nope"],
      ["--run", "acc_x"],
      ["--count", "0"],
      ["--count", "1000001"],
      ["--count", "1.5"],
      ["--follow", "x"],
      ["--hosts", "--account", "acc_x"],
      ["--hosts", "--count", "0"],
    ]) {
      const refused = await promisify(execFile)(process.execPath, [bin, "admin", "watch", ...args], {
        env,
        timeout: 60_000,
      }).then(
        () => ({ code: 0, stdout: "?" }),
        (e: { code: number; stdout: string }) => e,
      )
      expect(refused.code, args.join(" ")).toBe(2)
      expect(refused.stdout).toBe("")
    }
  }, 90_000)
})

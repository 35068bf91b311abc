/**
 * `hangar admin hosts | drain | undrain` as an operator runs them (`node cli/bin.cjs`) against a
 * real nats-server and a worker hosting the scheduler; hosts are records in KV `hosts`.
 */
import { execFile } from "node:child_process"
import { join } from "node:path"
import { promisify } from "node:util"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { hostRecord, machineOf, startRunWorker, writeHost } from "../actors/run/testing.ts"
import { clientLayer, type TestWorker } from "../core/actors/testing/Harness.ts"
import { makeId } from "../core/Ids.ts"
import type { RunId } from "../schema/Ids.ts"
import { type StartedNatsServer, startNatsServer } from "../test/harness/NatsServer.ts"
import { uniquePrefix } from "../test/harness/names.ts"

const run = promisify(execFile)
const bin = join(import.meta.dirname, "bin.cjs")

let nats: StartedNatsServer
let worker: TestWorker
let env: NodeJS.ProcessEnv
const machineRun = makeId("run") as RunId

const hangar = async (...args: Array<string>) => {
  try {
    const { stdout, stderr } = await run(process.execPath, [bin, "admin", ...args], { env, timeout: 60_000 })
    return { code: 0, stdout, stderr, json: JSON.parse(stdout) }
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string }
    return { code: err.code, stdout: err.stdout, stderr: err.stderr, json: undefined }
  }
}

beforeAll(async () => {
  nats = await startNatsServer()
  const prefix = uniquePrefix()
  env = { ...process.env, HANGAR_NATS_URL: nats.url, HANGAR_STORAGE_PREFIX: prefix }
  worker = await Effect.runPromise(startRunWorker(nats.url, prefix))
  await Effect.runPromise(
    Effect.all([
      writeHost(hostRecord("h-live", { vcpus: 4, memory_mib: 16_384 }, [machineOf(machineRun, "s")])),
      writeHost(hostRecord("h-stale", { vcpus: 2, memory_mib: 8_192 }, [], Date.now() - 30_000)),
    ]).pipe(Effect.provide(clientLayer(nats.url, prefix)), Effect.scoped),
  )
}, 60_000)

afterAll(async () => {
  if (worker) await Effect.runPromise(worker.stop)
  await nats?.stop()
})

describe("hangar admin hosts, drain, undrain", () => {
  it("hosts lists each host's room, machines, heartbeat age and drain state; drain and undrain change it", async () => {
    const listed = await hangar("hosts")
    expect(listed.code, listed.stderr).toBe(0)
    expect(listed.json.hosts).toEqual([
      expect.objectContaining({
        id: "h-live",
        live: true,
        draining: false,
        vcpus: 4,
        used_vcpus: 1,
        free_vcpus: 3,
        machines: 1,
        runs: [],
      }),
      expect.objectContaining({ id: "h-stale", live: false, draining: false, vcpus: 2, used_vcpus: 0 }),
    ])
    expect(listed.json.hosts[0].heartbeat_age_ms).toBeLessThan(30_000)
    expect(listed.json.hosts[1].heartbeat_age_ms).toBeGreaterThanOrEqual(30_000)

    const drained = await hangar("drain", "--host", "h-live")
    expect(drained.code, drained.stderr).toBe(0)
    expect(drained.json).toEqual({ host: "h-live", draining: true, runs: [] })
    expect((await hangar("drain", "--host", "h-live")).json).toEqual(drained.json)
    const after = await hangar("hosts")
    expect(after.json.hosts.map((h: { id: string; draining: boolean }) => [h.id, h.draining])).toEqual([
      ["h-live", true],
      ["h-stale", false],
    ])
    const undrained = await hangar("undrain", "--host", "h-live")
    expect(undrained.code).toBe(0)
    expect(undrained.json).toEqual({ host: "h-live", draining: false, runs: [] })
    expect((await hangar("hosts")).json.hosts[0].draining).toBe(false)
  }, 120_000)

  it("refuses a host it does not know (4), and a bad or missing host id or stray argument (2)", async () => {
    const unknown = await hangar("drain", "--host", "h-nowhere")
    expect(unknown.code).toBe(4)
    expect(unknown.stderr).toContain("host not found: h-nowhere")
    for (const args of [
      ["drain", "--host", "Not A Host"],
      ["drain", "--host", "x".repeat(65)],
      ["drain"],
      ["undrain", "--host", "a.b"],
      ["hosts", "--all", "yes"],
    ]) {
      const refused = await hangar(...args)
      expect(refused.code, args.join(" ")).toBe(2)
      expect(refused.stdout).toBe("")
    }
    // 64 characters is still a host id: known or not is the next question.
    expect((await hangar("drain", "--host", "h".repeat(64))).code).toBe(4)
  }, 120_000)
})

/**
 * Growing by adding hosts: runs wait while no host has room, and a host agent started beside the
 * running roles (its own process, host id, folders and address pool) takes them, with nothing else
 * restarted; its machines live in its own folder.
 */
import { randomBytes } from "node:crypto"
import { stat } from "node:fs/promises"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { derivedId } from "../host-agent/registry/HostSettings.ts"
import {
  command,
  createAccount,
  getRun,
  publish,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
  waitRun,
} from "./harness/Stack.ts"

describe("adding a host", () => {
  let stack: Stack
  let acct: TestAccount

  beforeAll(async () => {
    // One host with room for one size-s run.
    stack = await startStack({ processes: true, hostVcpus: 1, queueTimeoutMs: 600_000, tickMs: 500 })
    acct = await createAccount(stack, { creditUsd: 100 })
  }, 120_000)
  afterAll(async () => {
    if (stack !== undefined) expect(await stack.close()).toEqual([])
  }, 120_000)

  const finish = async (run: string) => {
    expect(
      (await command(stack, acct, run, "bash", { command: "echo ok > /workspace/out/result.txt" })).state,
    ).toBe("succeeded")
    expect((await command(stack, acct, run, "finish", { state: "succeeded" })).state).toBe("succeeded")
    expect(await waitRun(stack, acct, run)).toMatchObject({ state: "succeeded" })
  }

  it("runs queued while no host has room start on a host agent added meanwhile, nothing else restarted", async () => {
    const fn = await publish(stack, acct, { timeout_minutes: 30 })
    const holder = (await startRun(stack, acct, fn.function)).id
    expect(await waitRun(stack, acct, holder, { until: (r) => r.state !== "queued" })).toMatchObject({
      state: "running",
    })
    const queued = [
      (await startRun(stack, acct, fn.function)).id,
      (await startRun(stack, acct, fn.function)).id,
    ]
    // A few scheduler ticks with nowhere to go: still queued.
    await new Promise((r) => setTimeout(r, 1_500))
    for (const run of queued) expect((await getRun(stack, acct, run)).state).toBe("queued")
    const running = [...stack.running()].sort()

    const hostId = derivedId(randomBytes(16).toString("hex"), `${stack.dir}/added`)
    await stack.startExtra("host", { HOST_ID: hostId, HOST_VCPUS: "2" })
    const folder = join("/var/lib/hangar/test-hosts", `${stack.prefix}-1`)
    for (const run of queued) {
      expect(
        await waitRun(stack, acct, run, { until: (r) => r.state !== "queued", timeoutMs: 60_000 }),
      ).toMatchObject({ state: "running" })
      // Its machine is in the added host agent's own folder.
      expect((await command(stack, acct, run, "bash", { command: "true" })).state).toBe("succeeded")
      expect(
        await stat(join(folder, run)).then(
          () => true,
          () => false,
        ),
      ).toBe(true)
    }
    for (const run of [holder, ...queued]) await finish(run)
    // The roles that were running are the same processes (an extra host agent is not among them).
    expect([...stack.running()].sort()).toEqual(running)
  }, 240_000)
})

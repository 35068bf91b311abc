/**
 * Warm machines (`host-agent/runs/WarmPool.ts`) on the whole stack: a run of the warm size starts
 * on a machine booted before it asked, the pool makes a new one, no machine is ever used twice,
 * a run of another size starts on its own machine, a warm machine yields its room to a run that
 * needs it, and a host agent killed outright leaves its next life nothing it cannot clean up or
 * take over. `close` checks every warm machine the host agent made for leftovers.
 */

import { readFile } from "node:fs/promises"
import { join } from "node:path"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { NamespaceDriverSettings } from "../host-agent/machines/namespace/NamespaceDriver.ts"
import { leftovers } from "../host-agent/machines/namespace/testing.ts"
import {
  call,
  command,
  createAccount,
  type Json,
  problems,
  publish,
  runLog,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
  waitRun,
} from "./harness/Stack.ts"

/** The warm machines the host agent said are ready, taken and yielded, in order, by id. */
const warmEvents = (stack: Stack, message: string): Array<string> =>
  stack.lines.flatMap((l) =>
    l.line.includes(`"msg":"${message}"`) ? [/"machine":"(warm_[0-9a-f]+)"/.exec(l.line)?.[1] ?? "?"] : [],
  )

/** The warm machines ready and not yet taken or yielded, oldest first. */
const waiting = (stack: Stack): Array<string> => {
  const gone = new Set([
    ...warmEvents(stack, "warm machine taken"),
    ...warmEvents(stack, "warm machine yields its room"),
  ])
  return warmEvents(stack, "warm machine ready").filter((id) => !gone.has(id))
}

const until = async (what: string, done: () => boolean, ms = 120_000) => {
  const deadline = Date.now() + ms
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

describe("warm machines", () => {
  let stack: Stack
  let acct: TestAccount

  beforeAll(async () => {
    // Room for two size-m machines: one warm machine fits beside one m run, and an l run takes it all.
    // A process per role, so the host agent can be killed outright (its machines left behind).
    stack = await startStack({
      processes: true,
      warmMachines: 1,
      hostVcpus: 4,
      hostMemoryMib: 16_384,
      minuteMs: 5_000,
    })
    acct = await createAccount(stack, { creditUsd: 100, memoryMib: 64 * 1024 })
  }, 180_000)
  afterAll(async () => {
    if (stack !== undefined) expect(await stack.close()).toEqual([])
  }, 180_000)
  // A test that failed midway leaves its runs running: ended here, so their room does not keep the
  // next test's warm machine from being made.
  afterEach(async () => {
    const listed = await call(stack, "GET", "/v1/runs?state=active", acct.admin)
    expect(listed.status).toBe(200)
    for (const run of listed.body.runs as Array<Json>) {
      await command(stack, acct, String(run.id), "finish", { state: "failed" }).catch(() => undefined)
      await waitRun(stack, acct, String(run.id), { timeoutMs: 60_000 })
    }
  }, 180_000)

  const finish = async (run: string) => {
    await command(stack, acct, run, "bash", { command: "echo ok > /workspace/out/result.txt" })
    expect((await command(stack, acct, run, "finish", { state: "succeeded" })).state).toBe("succeeded")
    return waitRun(stack, acct, run, { timeoutMs: 60_000 })
  }
  const machineLine = async (run: string) =>
    (await runLog(stack, acct, run)).find((l: Json) => l.kind === "machine")

  it("a run of the warm size starts on the warm machine; the pool makes another; the next run gets that one, never the first", async () => {
    await until("a warm machine", () => warmEvents(stack, "warm machine ready").length >= 1)
    const fn = await publish(stack, acct, { size: "m", timeout_minutes: 30 })

    const first = (await startRun(stack, acct, fn.function)).id
    const wrote = await command(stack, acct, first, "bash", {
      command: "echo mine > /root/mark; nproc; cat /sys/fs/cgroup/memory.max 2>/dev/null || true",
    })
    expect(wrote, problems(stack)).toMatchObject({ state: "succeeded" })
    const taken = warmEvents(stack, "warm machine taken")
    expect(taken).toHaveLength(1)
    expect(taken[0]).toBe(warmEvents(stack, "warm machine ready")[0])
    // Another is made while the first run goes on (room for it: 4 vCPUs, 2 held by the run).
    await until("a second warm machine", () => warmEvents(stack, "warm machine ready").length >= 2)
    expect(await finish(first)).toMatchObject({ state: "succeeded" })
    expect(await machineLine(first)).toMatchObject({ kind: "machine", size: "m", warm: true })

    const second = (await startRun(stack, acct, fn.function)).id
    // A machine no one touched: the first run's file is not there.
    const looked = await command(stack, acct, second, "bash", { command: "cat /root/mark 2>&1; true" })
    expect(looked.result.output).toContain("No such file")
    const taken2 = warmEvents(stack, "warm machine taken")
    expect(taken2).toHaveLength(2)
    expect(taken2[1]).not.toBe(taken2[0])
    expect(taken2[1]).toBe(warmEvents(stack, "warm machine ready")[1])
    expect(await finish(second)).toMatchObject({ state: "succeeded" })
  }, 240_000)

  it("a run that comes while the pool's next machine is being made starts on that one, not on a machine of its own", async () => {
    await until("a warm machine ready", () => waiting(stack).length > 0)
    const fn = await publish(stack, acct, { size: "m", timeout_minutes: 30 })
    const takenBefore = warmEvents(stack, "warm machine taken").length
    const readyBefore = warmEvents(stack, "warm machine ready").length
    const first = (await startRun(stack, acct, fn.function)).id
    await until("the first run's take", () => warmEvents(stack, "warm machine taken").length > takenBefore)
    // The pool (of one) began its next machine as the first run took the ready one; the second run
    // comes while that machine is being made.
    const second = (await startRun(stack, acct, fn.function)).id
    const ran = await command(stack, acct, second, "bash", { command: "true" })
    expect(ran, problems(stack)).toMatchObject({ state: "succeeded" })
    // The second run took the machine the pool began for it, not one of its own. (Whether it
    // waited for it or found it ready depends on how long its placement took; that a take waits
    // for a machine being made is WarmPool.test.ts's to show, where the timing is held.)
    const made = warmEvents(stack, "warm machine ready")[readyBefore]
    expect(warmEvents(stack, "warm machine taken").slice(takenBefore)).toEqual([
      warmEvents(stack, "warm machine ready")[readyBefore - 1],
      made,
    ])
    expect(await finish(first)).toMatchObject({ state: "succeeded" })
    expect(await finish(second)).toMatchObject({ state: "succeeded" })
    expect(await machineLine(second)).toMatchObject({ kind: "machine", size: "m", warm: true })
  }, 240_000)

  it("a run of another size starts on its own machine while the warm one waits", async () => {
    await until("a warm machine ready", () => waiting(stack).length > 0)
    const takenBefore = warmEvents(stack, "warm machine taken").length
    const fn = await publish(stack, acct, { size: "s", timeout_minutes: 30 })
    const run = (await startRun(stack, acct, fn.function)).id
    expect(await finish(run), problems(stack)).toMatchObject({ state: "succeeded" })
    expect(warmEvents(stack, "warm machine taken")).toHaveLength(takenBefore)
    const line = await machineLine(run)
    expect(line).toMatchObject({ kind: "machine", size: "s" })
    expect(line.warm).toBeUndefined()
  }, 240_000)

  it("a warm machine yields its room to a run that needs all of it, and comes back once the run is done", async () => {
    await until("a warm machine ready", () => waiting(stack).length > 0)
    const yieldedBefore = warmEvents(stack, "warm machine yields its room").length
    const readyBefore = warmEvents(stack, "warm machine ready").length
    // Size l takes the host's 4 vCPUs: the run is placed at once, and the warm machine goes.
    const fn = await publish(stack, acct, { size: "l", timeout_minutes: 30 })
    const run = (await startRun(stack, acct, fn.function)).id
    const ran = await command(stack, acct, run, "bash", { command: "nproc" })
    expect(ran, problems(stack)).toMatchObject({ state: "succeeded" })
    expect(warmEvents(stack, "warm machine yields its room")).toHaveLength(yieldedBefore + 1)
    expect(warmEvents(stack, "warm machine ready")).toHaveLength(readyBefore)
    expect(await finish(run)).toMatchObject({ state: "succeeded" })
    await until("the pool to fill again", () => warmEvents(stack, "warm machine ready").length > readyBefore)
  }, 240_000)

  it("a host agent killed outright: the next life removes the warm machine that waited and takes over the run on a kept one", async () => {
    await until("a warm machine ready", () => waiting(stack).length > 0)
    const fn = await publish(stack, acct, { size: "m", timeout_minutes: 30 })
    const taken = warmEvents(stack, "warm machine taken").length
    const run = (await startRun(stack, acct, fn.function)).id
    expect(
      await command(stack, acct, run, "bash", { command: "echo before > /workspace/mark" }),
      problems(stack),
    ).toMatchObject({ state: "succeeded" })
    expect(warmEvents(stack, "warm machine taken")).toHaveLength(taken + 1)
    await until("a warm machine waiting beside the run", () => waiting(stack).length >= 1)
    const idle = waiting(stack)[0]!
    await stack.killHost()
    // Killed outright: both machines outlive their agent.
    expect(await leftovers(idle)).not.toEqual([])
    await stack.startHost()
    // A command sent before the adoption has gone through the unended ones ends failed (whether the
    // earlier life took it is not known): the first one here is waited out.
    const first = await command(stack, acct, run, "bash", { command: "true" })
    expect(["succeeded", "failed"]).toContain(first.state)
    // The warm machine that waited is gone; the run's goes on.
    expect(await leftovers(idle)).toEqual([])
    const after = await command(stack, acct, run, "bash", { command: "cat /workspace/mark" })
    expect(after, problems(stack)).toMatchObject({ state: "succeeded", result: { output: "before\n" } })
    expect(await finish(run)).toMatchObject({ state: "succeeded" })
    const kinds = (await runLog(stack, acct, run)).map((l: Json) => l.kind)
    // The earlier life's lines not yet stored as a part went with it (`HANGAR_RUN_LOG_FLUSH_MS`).
    expect(kinds).toEqual(expect.arrayContaining(["adopted", "end"]))
  }, 300_000)

  it("a kept warm machine that died with its host agent: the next life fails its run at once and leaves nothing", async () => {
    const fn = await publish(stack, acct, { size: "m", timeout_minutes: 30 })
    await until("a warm machine ready", () => waiting(stack).length > 0)
    const taken = warmEvents(stack, "warm machine taken").length
    const run = (await startRun(stack, acct, fn.function)).id
    expect(await command(stack, acct, run, "bash", { command: "true" })).toMatchObject({ state: "succeeded" })
    const machine = warmEvents(stack, "warm machine taken")[taken]!
    await stack.killHost()
    const kept = JSON.parse(
      await readFile(join(NamespaceDriverSettings.defaults.machinesDir, machine, "kept.json"), "utf8"),
    )
    expect(kept.machine.id).toBe(machine)
    process.kill(Number(kept.machine.handle.pid), "SIGKILL")
    await stack.startHost()
    const ended = await waitRun(stack, acct, run, { timeoutMs: 60_000 })
    expect(ended).toMatchObject({
      state: "failed",
      failure: "infrastructure",
      detail: expect.stringContaining("lost the run's machine"),
    })
    expect(await leftovers(machine)).toEqual([])
    expect(await leftovers(run)).toEqual([])
  }, 300_000)
})

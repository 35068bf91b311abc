/**
 * The warm pool on the qemu driver (TCG here, KVM where it boots guests): a machine is booted
 * ahead, its session opened, a run takes it and runs at once on it, the pool boots the next, and
 * closing the pool leaves no process or folder of any machine it made. Booted ahead, QEMU runs in
 * the background (niced) until a run takes the machine.
 */
import { join } from "node:path"
import { Effect, Option } from "effect"
import { afterAll, beforeAll, expect, it } from "vitest"
import { ensureTestBase } from "../bases/Bases.ts"
import { normalNice, readText, threadNices } from "../machines/HostFiles.ts"
import { backgroundNice } from "../machines/MachineDriver.ts"
import { make, QemuDriverSettings } from "../machines/qemu/QemuDriver.ts"
import { leftovers } from "../machines/qemu/testing.ts"
import { startWarmPool, type TestPool, testHostId } from "./testing.ts"

// TCG, so the test runs on any host (a boot takes ~20 s emulated).
const driver = make({ ...QemuDriverSettings.defaults, accel: "tcg", readyTimeoutMs: 240_000 })
const HOST = testHostId()
const run = <A, E>(e: Effect.Effect<A, E>) => Effect.runPromise(e)

/** The nice values of process `pid`'s threads (each thread's `stat`, 19th field), each once. */
const seen = new Set<string>()
let base: string
let pool: TestPool | undefined

const until = async (what: string, done: () => Promise<boolean>, ms = 300_000) => {
  const deadline = Date.now() + ms
  while (!(await done())) {
    for (const id of await run(driver.owned(HOST))) seen.add(id)
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

beforeAll(async () => {
  base = (await ensureTestBase()).name
}, 15 * 60_000)

afterAll(async () => {
  await pool?.close()
  expect(await run(driver.owned(HOST))).toEqual([])
  for (const id of seen) expect(await leftovers(id), id).toEqual([])
}, 300_000)

it("a qemu machine booted ahead is taken by a run with its session open, and the pool boots the next", async () => {
  pool = await startWarmPool({ driver, host: HOST, machines: 1, vcpus: 4, sizes: ["s"] })
  const { pool: warm } = pool
  await until("a warm qemu machine", async () => (await run(warm.ready)).length === 1)
  const [ready] = await run(warm.ready)
  const qemu = Number(readText(join(QemuDriverSettings.defaults.machinesDir, ready?.id ?? "", "qemu.pid")))
  expect(threadNices(qemu)).toEqual([backgroundNice()])
  const taken = Option.getOrThrow(await run(warm.take(base, "s")))
  // The run's now: every thread of its QEMU at the host agent's nice.
  expect(taken.machine.handle.pid).toBe(qemu)
  expect(threadNices(qemu)).toEqual([normalNice()])
  seen.add(taken.machine.id)
  expect(taken.machine.handle.accel).toBe("tcg")
  const out = await run(taken.guest.bash({ command: "echo warm on $(hostname); nproc" }))
  expect(out).toMatchObject({ exit_code: 0, output: "warm on machine\n1\n" })
  // The next is booting (or booted) while the first is in use.
  await until(
    "the next machine",
    async () => (await run(warm.making)).length + (await run(warm.ready)).length === 1,
  )
  await run(taken.close)
  await run(driver.destroy(taken.machine.id))
  expect(await leftovers(taken.machine.id)).toEqual([])
}, 600_000)

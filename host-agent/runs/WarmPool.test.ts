/**
 * The warm pool (`WarmPool.ts`) on real namespace machines, without the rest of the host agent: it
 * makes two at once, hands a ready one out and makes another, lets a run wait for the machine being
 * made rather than make its own, gives that machine back to the pool when the run stops waiting,
 * keeps only what the host's free room would hold, and leaves nothing when it closes, even with
 * machines half made.
 */
import { randomBytes } from "node:crypto"
import { Context, Effect, Exit, Fiber, Layer, Option, Scope } from "effect"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import { BasesSettings, ensureTestBase } from "../bases/Bases.ts"
import { MachineDriver } from "../machines/MachineDriver.ts"
import { make as namespaceDriver } from "../machines/namespace/NamespaceDriver.ts"
import { leftovers, testDriverSettings } from "../machines/namespace/testing.ts"
import * as Capacity from "../registry/Capacity.ts"
import { Host } from "../registry/HostSettings.ts"
import * as WarmPool from "./WarmPool.ts"

const driver = namespaceDriver(testDriverSettings)
// A host id of this file alone: the machines it owns are this file's.
const HOST = `host_${randomBytes(13).toString("hex").slice(0, 26)}`
let base: string

const run = <A, E>(e: Effect.Effect<A, E>) => Effect.runPromise(e)

interface Pool {
  readonly pool: WarmPool.WarmPoolService
  readonly capacity: Capacity.CapacityService
  readonly close: () => Promise<void>
}

let open: Pool | undefined

/** A pool of `machines` size-s machines of the test base on a host of `vcpus`. */
const startPool = async (machines: number, vcpus = 8): Promise<Pool> => {
  const scope = Effect.runSync(Scope.make())
  const capacity = await run(Capacity.make({ vcpus, memory_mib: 64 * 1024 }))
  const layer = WarmPool.layerWith({ machines, size: "s" }).pipe(
    Layer.provide(
      Layer.mergeAll(
        Layer.succeed(MachineDriver, driver),
        Layer.succeed(Capacity.Capacity, capacity),
        Layer.succeed(Host, { id: HOST as never, driver: "namespace", vcpus, memoryMib: 64 * 1024 }),
        BasesSettings.layer({ recipes: ["debian-bookworm-slim"] }),
      ),
    ),
  )
  const context = await run(Layer.buildWithScope(layer, scope))
  const pool = { pool: Context.get(context, WarmPool.WarmPool), capacity }
  open = { ...pool, close: () => run(Scope.close(scope, Exit.void)) }
  return open
}

/** Every machine this file's host owned at any look: each is checked for leftovers after its test. */
const seen = new Set<string>()
/** The machines this file's host owns now (noted in `seen`). */
const owned = async () => {
  const ids = await run(driver.owned(HOST))
  for (const id of ids) seen.add(id)
  return ids
}

const until = async (what: string, done: () => Promise<boolean>, ms = 60_000) => {
  const deadline = Date.now() + ms
  while (!(await done())) {
    await owned()
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 5))
  }
}

beforeAll(async () => {
  base = (await ensureTestBase()).name
}, 600_000)

afterEach(async () => {
  const pool = open
  open = undefined
  await owned()
  if (pool !== undefined) await pool.close()
  // Closed: every machine it made or was making is gone, with all it held (folders, cgroups,
  // network, mounts, processes).
  expect(await owned()).toEqual([])
  for (const id of seen) expect(await leftovers(id), id).toEqual([])
  seen.clear()
}, 120_000)

describe("warm pool", () => {
  it("makes two at once, hands a ready machine out with its session open, and makes another", async () => {
    const { pool } = await startPool(2)
    // Both begun before either is ready.
    await until("two machines being made", async () => (await run(pool.making)).length === 2)
    expect(await run(pool.ready)).toEqual([])
    await until("two ready", async () => (await run(pool.ready)).length === 2)
    const [first] = await run(pool.ready)

    const taken = await run(pool.take(base, "s"))
    expect(Option.isSome(taken)).toBe(true)
    const warm = Option.getOrThrow(taken)
    expect(warm.machine.id).toBe(first?.id)
    expect(warm.machine.limits.vcpus).toBe(1)
    const out = await run(warm.guest.bash({ command: "echo ready-$((6*7))" }))
    expect(out).toMatchObject({ exit_code: 0, output: "ready-42\n" })
    // The pool no longer holds it, and makes another in its place.
    expect((await run(pool.ready)).map((m) => m.id)).not.toContain(warm.machine.id)
    await until("the pool full again", async () => (await run(pool.ready)).length === 2)
    // The taken machine is the taker's to destroy.
    await run(warm.close)
    await run(driver.destroy(warm.machine.id))
    expect(await leftovers(warm.machine.id)).toEqual([])
  }, 120_000)

  it("a take while the pool's machine is being made waits for that one; another size never waits", async () => {
    const { pool } = await startPool(1)
    await until("a machine being made", async () => (await run(pool.making)).length === 1)
    expect(await run(pool.ready)).toEqual([])
    // Another size: none, at once, and the machine being made stays the pool's.
    expect(Option.isNone(await run(pool.take(base, "m")))).toBe(true)
    expect(await run(pool.making)).toEqual([{ base, claimed: false }])
    // Another base: none either.
    expect(Option.isNone(await run(pool.take("debian-none-20260101-000000000000", "s")))).toBe(true)

    const waiting = Effect.runFork(pool.take(base, "s"))
    await until("the machine promised to the take", async () =>
      (await run(pool.making)).some((m) => m.claimed),
    )
    const taken = Option.getOrThrow(await run(Fiber.join(waiting)))
    expect((await run(taken.guest.bash({ command: "true" }))).exit_code).toBe(0)
    await run(taken.close)
    await run(driver.destroy(taken.machine.id))
  }, 120_000)

  it("a take that stops waiting gives the machine being made back to the pool", async () => {
    const { pool } = await startPool(1)
    await until("a machine being made", async () => (await run(pool.making)).length === 1)
    const waiting = Effect.runFork(pool.take(base, "s"))
    await until("the machine promised", async () => (await run(pool.making)).some((m) => m.claimed))
    await run(Fiber.interrupt(waiting))
    expect(await run(pool.making)).toEqual([{ base, claimed: false }])
    // Made, it waits in the pool for the next run; no second machine is made beside it.
    await until("the machine ready", async () => (await run(pool.ready)).length === 1)
    expect(await run(pool.making)).toEqual([])
    expect(await owned()).toHaveLength(1)
  }, 120_000)

  it("keeps only what the free room would hold: a placement that takes the room makes the pool yield", async () => {
    // Two vCPUs: room for two size-s machines.
    const { pool, capacity } = await startPool(2, 2)
    await until("two ready", async () => (await run(pool.ready)).length === 2)
    // A run of size m placed here takes both vCPUs: a take (of another size) fits the pool to it.
    expect((await run(capacity.reserve("run_x", "m")))._tag).toBe("Right")
    expect(Option.isNone(await run(pool.take(base, "m")))).toBe(true)
    expect(await run(pool.ready)).toEqual([])
    await until("the yielded machines destroyed", async () => (await owned()).length === 0)
    // The room back: the pool fills again.
    await run(capacity.release("run_x"))
    await until("two ready again", async () => (await run(pool.ready)).length === 2)
  }, 120_000)

  it("closing while machines are being made finishes them, then removes everything", async () => {
    const { close, pool } = await startPool(2)
    await until("two machines being made", async () => (await run(pool.making)).length === 2)
    await until("their folders made", async () => (await owned()).length === 2)
    await close()
    open = undefined
    // afterEach checks that the host owns nothing.
  }, 120_000)
})

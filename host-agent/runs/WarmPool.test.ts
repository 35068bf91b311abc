/**
 * The warm pool (`WarmPool.ts`) on real namespace machines, without the rest of the host agent: it
 * makes two at once, hands a ready one out and makes another, lets a run wait for the machine being
 * made rather than make its own, gives that machine back to the pool when the run stops waiting,
 * keeps only what the host's free room would hold, and leaves nothing when it closes, even with
 * machines half made. Its machines yield the CPU while they wait (made in the background) and get
 * it back once taken or promised to a run.
 */

import { join } from "node:path"
import { ConfigProvider, Effect, Either, Fiber, Option } from "effect"
import { afterEach, beforeAll, describe, expect, it } from "vitest"
import { ensureTestBase } from "../bases/Bases.ts"
import { readText } from "../machines/HostFiles.ts"
import {
  BACKGROUND_WEIGHT,
  type MachineDriverService,
  NORMAL_WEIGHT,
  type SizeName,
} from "../machines/MachineDriver.ts"
import { groupOf } from "../machines/namespace/Cgroups.ts"
import { make as namespaceDriver } from "../machines/namespace/NamespaceDriver.ts"
import { leftovers, testDriverSettings } from "../machines/namespace/testing.ts"
import { startWarmPool, type TestPool, testHostId } from "./testing.ts"
import * as WarmPool from "./WarmPool.ts"

const driver = namespaceDriver(testDriverSettings)
// A host id of this file alone: the machines it owns are this file's.
const HOST = testHostId()
let base: string

const run = <A, E>(e: Effect.Effect<A, E>) => Effect.runPromise(e)

/** Machine `id`'s CPU weight (its group's `cpu.shares`). */
const weight = (id: string) =>
  Number(readText(join(groupOf(testDriverSettings.cgroupRoot, "cpu", id), "cpu.shares")))

let open: TestPool | undefined

/** A pool of `machines` machines of the test base per size of `sizes` on a host of `vcpus`. */
const startPool = async (machines: number, vcpus = 8, sizes: ReadonlyArray<SizeName> = ["s"]) => {
  open = await startWarmPool({ driver, host: HOST, machines, vcpus, sizes })
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
  // Asked only once the pool is closed: asking sweeps the host's half-made folders, and one the
  // pool was making then went from under it ("warm machine not made", ENOENT at its rename).
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
    const [first, second] = await run(pool.ready)
    // Made in the background: waiting, they yield the CPU to running work.
    expect([weight(first?.id ?? ""), weight(second?.id ?? "")]).toEqual([
      BACKGROUND_WEIGHT,
      BACKGROUND_WEIGHT,
    ])

    const taken = await run(pool.take(base, "s"))
    expect(Option.isSome(taken)).toBe(true)
    const warm = Option.getOrThrow(taken)
    try {
      expect(warm.machine.id).toBe(first?.id)
      expect(warm.machine.limits.vcpus).toBe(1)
      // The run's now: it weighs as any run's machine; the one left waiting does not.
      expect([weight(warm.machine.id), weight(second?.id ?? "")]).toEqual([NORMAL_WEIGHT, BACKGROUND_WEIGHT])
      const out = await run(warm.guest.bash({ command: "echo ready-$((6*7))" }))
      expect(out).toMatchObject({ exit_code: 0, output: "ready-42\n" })
      // The pool no longer holds it, and makes another in its place.
      expect((await run(pool.ready)).map((m) => m.id)).not.toContain(warm.machine.id)
      await until("the pool full again", async () => (await run(pool.ready)).length === 2)
    } finally {
      // The taken machine is the taker's to destroy, also when an assertion failed.
      await run(warm.close)
      await run(driver.destroy(warm.machine.id))
    }
    expect(await leftovers(warm.machine.id)).toEqual([])
  }, 120_000)

  it("a take while the pool's machine is being made waits for that one; another size never waits", async () => {
    // The real driver, the machines it is told are wanted noted.
    const wanted: Array<string> = []
    const noted: MachineDriverService = {
      ...driver,
      wanted: (id) =>
        Effect.zipRight(
          Effect.sync(() => wanted.push(id)),
          driver.wanted(id),
        ),
    }
    open = await startWarmPool({ driver: noted, host: HOST, machines: 1, vcpus: 8, sizes: ["s"] })
    const { pool } = open
    await until("a machine being made", async () => (await run(pool.making)).length === 1)
    expect(await run(pool.ready)).toEqual([])
    // Another size: none, at once, and the machine being made stays the pool's.
    expect(Option.isNone(await run(pool.take(base, "m")))).toBe(true)
    expect(await run(pool.making)).toEqual([{ base, size: "s", claimed: false }])
    // Another base: none either.
    expect(Option.isNone(await run(pool.take("debian-none-20260101-000000000000", "s")))).toBe(true)

    const waiting = Effect.runFork(pool.take(base, "s"))
    await until("the machine promised to the take", async () =>
      (await run(pool.making)).some((m) => m.claimed),
    )
    const taken = Option.getOrThrow(await run(Fiber.join(waiting)))
    // Promised while it was being made: wanted then (the rest of its making is the run's), and
    // again when taken; it weighs as any run's machine.
    const id = taken.machine.id
    try {
      expect(wanted).toHaveLength(2)
      expect(wanted).toContain(id)
      expect(weight(id)).toBe(NORMAL_WEIGHT)
      expect((await run(taken.guest.bash({ command: "true" }))).exit_code).toBe(0)
    } finally {
      // The taker's to destroy, also when an assertion failed.
      await run(taken.close)
      await run(driver.destroy(id))
    }
  }, 120_000)

  it("a take that stops waiting gives the machine being made back to the pool", async () => {
    const { pool } = await startPool(1)
    await until("a machine being made", async () => (await run(pool.making)).length === 1)
    const waiting = Effect.runFork(pool.take(base, "s"))
    await until("the machine promised", async () => (await run(pool.making)).some((m) => m.claimed))
    await run(Fiber.interrupt(waiting))
    // Given back: no machine is promised any more. (While it was promised the pool may have begun
    // another for itself.)
    const making = await run(pool.making)
    expect(making.length).toBeGreaterThanOrEqual(1)
    expect(making.every((m) => !m.claimed && m.base === base && m.size === "s")).toBe(true)
    // Made, it waits in the pool for the next run; the pool keeps no more than its one machine.
    await until("every machine made", async () => (await run(pool.making)).length === 0)
    expect(await run(pool.ready)).toHaveLength(1)
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

  it("keeps each size of HANGAR_WARM_SIZE apart: a run takes a machine of its own size, made at that size", async () => {
    const { pool } = await startPool(1, 8, ["s", "m"])
    await until("one of each size ready", async () => (await run(pool.ready)).length === 2)
    expect((await run(pool.ready)).map((m) => m.size).sort()).toEqual(["m", "s"])
    const m = Option.getOrThrow(await run(pool.take(base, "m")))
    expect(m.machine.limits.vcpus).toBe(2)
    expect((await run(m.guest.bash({ command: "nproc" }))).output).toBe("2\n")
    const small = Option.getOrThrow(await run(pool.take(base, "s")))
    expect(small.machine.limits.vcpus).toBe(1)
    expect((await run(small.guest.bash({ command: "nproc" }))).output).toBe("1\n")
    // A size not kept: none, and nothing waited for.
    expect(Option.isNone(await run(pool.take(base, "l")))).toBe(true)
    for (const w of [m, small]) {
      await run(w.close)
      await run(driver.destroy(w.machine.id))
    }
  }, 120_000)

  it("with sizes mixed, a placement makes the oldest yield until the rest fit the room left", async () => {
    // Three vCPUs: room for one s (1) and one m (2).
    const { pool, capacity } = await startPool(1, 3, ["s", "m"])
    await until("one of each size ready", async () => (await run(pool.ready)).length === 2)
    const oldest = (await run(pool.ready))[0]!
    // A run of size s here leaves 2 vCPUs: the two no longer fit, and the oldest goes.
    expect((await run(capacity.reserve("run_y", "s")))._tag).toBe("Right")
    expect(Option.isNone(await run(pool.take(base, "xl")))).toBe(true)
    const left = await run(pool.ready)
    expect(left).toHaveLength(1)
    expect(left[0]!.id).not.toBe(oldest.id)
    // The one missing does not fit beside it, so none is made.
    expect(await run(pool.making)).toEqual([])
    await run(capacity.release("run_y"))
    await until("both sizes again", async () => (await run(pool.ready)).length === 2)
  }, 120_000)

  it("HANGAR_WARM_SIZE takes a list of the spec's sizes and refuses anything else, naming the variable", async () => {
    expect(WarmPool.parseSizes("s,m")).toEqual(Either.right(["s", "m"]))
    expect(WarmPool.parseSizes(" m , m,")).toEqual(Either.right(["m"]))
    expect(WarmPool.parseSizes("m,xxl")).toEqual(
      Either.left('HANGAR_WARM_SIZE: "xxl" is not a size (s, m, l, xl)'),
    )
    expect(WarmPool.parseSizes(" , ")).toEqual(Either.left("HANGAR_WARM_SIZE: no size given (s, m, l, xl)"))
    const fromEnv = (vars: Record<string, string>) =>
      Effect.runPromiseExit(
        Effect.provide(WarmPool.WarmSettings.Tag, WarmPool.WarmSettings.layerFromEnv).pipe(
          Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(vars)))),
        ),
      )
    const read = await fromEnv({ HANGAR_WARM_SIZE: "l,s", HANGAR_WARM_MACHINES: "3" })
    expect(read._tag === "Success" && read.value).toEqual({ machines: 3, sizes: ["l", "s"] })
    const defaults = await fromEnv({})
    expect(defaults._tag === "Success" && defaults.value).toEqual({ machines: 2, sizes: ["m"] })
    const wrong = await fromEnv({ HANGAR_WARM_SIZE: "medium" })
    expect(wrong._tag).toBe("Failure")
    expect(String(wrong._tag === "Failure" && wrong.cause)).toContain(
      'HANGAR_WARM_SIZE: "medium" is not a size',
    )
  })

  it("closing while machines are being made finishes them, then removes everything", async () => {
    const { close, pool } = await startPool(2)
    await until("two machines being made", async () => (await run(pool.making)).length === 2)
    await until("their folders made", async () => (await owned()).length === 2)
    await close()
    open = undefined
    // afterEach checks that the host owns nothing.
  }, 120_000)
})

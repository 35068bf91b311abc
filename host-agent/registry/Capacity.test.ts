import { describe, expect, it } from "@effect/vitest"
import { Chunk, Effect, Either, Fiber, Stream } from "effect"
import type { SizeName } from "../../schema/Host.ts"
import { sizes } from "../../schema/Limits.ts"
import * as Capacity from "./Capacity.ts"

const GiB = 1024

// The case "with a 4-vCPU budget, an `l` and two `s` machines fit, the next waits" cannot
// hold literally (`l` alone is 4 vCPUs). Both readings are tested at their boundaries: a budget that
// `l` + 2×`s` fill exactly (6 vCPUs, 12 GiB), and the 4-vCPU budget taken in turn.
describe("Capacity", () => {
  it.effect("6 vCPUs / 12 GiB: an l and two s fill the budget exactly; the next s is NoRoom on vcpus", () =>
    Effect.gen(function* () {
      const cap = yield* Capacity.make({ vcpus: 6, memory_mib: 12 * GiB })
      const l = yield* cap.reserve("m_l", "l")
      const s1 = yield* cap.reserve("m_s1", "s")
      const s2 = yield* cap.reserve("m_s2", "s")
      expect([l, s1, s2].every(Either.isRight)).toBe(true)
      expect(yield* cap.free).toEqual({ vcpus: 0, memory_mib: 0 })
      const next = yield* cap.reserve("m_s3", "s")
      expect(Either.getLeft(next).pipe((o) => o._tag === "Some" && o.value)).toMatchObject({
        _tag: "NoRoom",
        machineId: "m_s3",
        size: "s",
        field: "vcpus",
        needed: 1,
        free: 0,
      })
      expect((yield* cap.state).machines.map((m) => m.id)).toEqual(["m_l", "m_s1", "m_s2"])
    }),
  )

  it.effect(
    "4 vCPUs: an l fits alone (at the limit) and an s waits; once it is gone four s fit, the fifth waits",
    () =>
      Effect.gen(function* () {
        const cap = yield* Capacity.make({ vcpus: 4, memory_mib: 64 * GiB })
        expect(Either.isRight(yield* cap.reserve("big", "l"))).toBe(true)
        expect(yield* cap.free).toEqual({ vcpus: 0, memory_mib: 56 * GiB })
        const waits = yield* cap.reserve("small0", "s")
        expect(Either.isLeft(waits) && waits.left.field).toBe("vcpus")
        expect(yield* cap.release("big")).toBe(true)
        for (const i of [1, 2, 3, 4]) expect(Either.isRight(yield* cap.reserve(`small${i}`, "s"))).toBe(true)
        const fifth = yield* cap.reserve("small5", "s")
        expect(Either.isLeft(fifth) && fifth.left).toMatchObject({ field: "vcpus", needed: 1, free: 0 })
      }),
  )

  it.effect("memory is checked too: one MiB short of an s is NoRoom on memory_mib; exactly enough fits", () =>
    Effect.gen(function* () {
      const short = yield* Capacity.make({ vcpus: 14, memory_mib: 8 * GiB + 2 * GiB - 1 })
      expect(Either.isRight(yield* short.reserve("a", "l"))).toBe(true)
      const refused = yield* short.reserve("b", "s")
      expect(Either.isLeft(refused) && refused.left).toMatchObject({
        field: "memory_mib",
        needed: 2 * GiB,
        free: 2 * GiB - 1,
      })
      const exact = yield* Capacity.make({ vcpus: 14, memory_mib: 8 * GiB + 2 * GiB })
      expect(Either.isRight(yield* exact.reserve("a", "l"))).toBe(true)
      expect(Either.isRight(yield* exact.reserve("b", "s"))).toBe(true)
      expect(yield* exact.free).toEqual({ vcpus: 9, memory_mib: 0 })
    }),
  )

  it.effect("reserving an id twice counts once; release is idempotent", () =>
    Effect.gen(function* () {
      const cap = yield* Capacity.make({ vcpus: 14, memory_mib: 64 * GiB })
      const first = yield* cap.reserve("m", "m")
      const again = yield* cap.reserve("m", "m")
      expect(again).toEqual(first)
      expect(yield* cap.free).toEqual({ vcpus: 12, memory_mib: 60 * GiB })
      expect(yield* cap.release("m")).toBe(true)
      expect(yield* cap.release("m")).toBe(false)
      expect(yield* cap.release("never")).toBe(false)
      expect(yield* cap.free).toEqual({ vcpus: 14, memory_mib: 64 * GiB })
    }),
  )

  it.effect("200 concurrent placements of mixed sizes never exceed the budget", () =>
    Effect.gen(function* () {
      const cap = yield* Capacity.make({ vcpus: 14, memory_mib: 40 * GiB })
      const order: ReadonlyArray<SizeName> = ["s", "m", "l", "xl"]
      const results = yield* Effect.forEach(
        Array.from({ length: 200 }, (_, i) => i),
        (i) =>
          Effect.gen(function* () {
            yield* Effect.yieldNow()
            const r = yield* cap.reserve(`m${i}`, order[i % 4]!)
            // Some machines go again at once, so placements and releases interleave.
            if (Either.isRight(r) && i % 3 === 0) yield* cap.release(`m${i}`)
            return r
          }),
        { concurrency: "unbounded" },
      )
      const held = (yield* cap.state).machines
      const usedVcpus = held.reduce((n, m) => n + m.vcpus, 0)
      const usedMemory = held.reduce((n, m) => n + m.memory_mib, 0)
      expect(usedVcpus).toBeLessThanOrEqual(14)
      expect(usedMemory).toBeLessThanOrEqual(40 * GiB)
      expect(yield* cap.free).toEqual({ vcpus: 14 - usedVcpus, memory_mib: 40 * GiB - usedMemory })
      expect(results.filter(Either.isRight).length).toBeGreaterThan(0)
      expect(results.filter(Either.isLeft).length).toBeGreaterThan(0)
      for (const m of held) expect(m.vcpus).toBe(sizes[m.size].vcpus)
    }),
  )

  it.effect(
    "changes: the current state, then one state per change; refusals and no-op releases add none",
    () =>
      Effect.gen(function* () {
        const cap = yield* Capacity.make({ vcpus: 1, memory_mib: 2 * GiB })
        const seen = yield* cap.changes.pipe(Stream.take(3), Stream.runCollect, Effect.fork)
        yield* Effect.yieldNow()
        // Wait until the subscriber holds the initial state (its first element) before changing.
        yield* Effect.repeat(Effect.yieldNow(), { times: 20 })
        yield* cap.reserve("a", "s")
        yield* cap.reserve("b", "s") // NoRoom: no change
        yield* cap.release("zzz") // not held: no change
        yield* cap.release("a")
        const states = Chunk.toReadonlyArray(yield* Fiber.join(seen))
        expect(states.map((s) => s.machines.map((m) => m.id))).toEqual([[], ["a"], []])
      }),
  )
})

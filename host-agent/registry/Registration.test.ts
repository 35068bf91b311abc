import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { expect, layer } from "@effect/vitest"
import { Chunk, Clock, Context, Effect, Exit, Layer, Option, Schema, Scope, Stream, TestClock } from "effect"
import { timestamp } from "../../schema/Common.ts"
import { HostId, type HostRecord } from "../../schema/Host.ts"
import { layerAll } from "../../test/harness/NatsServer.ts"
import { uniqueName } from "../../test/harness/names.ts"
import { BasesSettings } from "../bases/Bases.ts"
import * as Capacity from "./Capacity.ts"
import { Host, HostSettings } from "./HostSettings.ts"
import * as Registration from "./Registration.ts"

const GiB = 1024
const base = { name: "debian-bookworm-20260101-0123456789ab", sha256: "b".repeat(64), bytes: 4242 }
const recipe = "test-full"
// A base of a recipe the host does not offer, and one of its recipes being built by this process.
const other = { name: "debian-bookworm-20260101-aaaaaaaaaaaa", sha256: "c".repeat(64), bytes: 1 }
const building = "debian-trixie-20260101-bbbbbbbbbbbb"

/** A bases folder holding finished bases and a build under way, removed with the scope. */
const basesDir = Effect.acquireRelease(
  Effect.promise(async () => {
    const dir = await mkdtemp(join(tmpdir(), "hangar-reg-bases-"))
    for (const [b, r] of [
      [base, recipe],
      [other, "test-slim"],
    ] as const) {
      await mkdir(join(dir, b.name, "rootfs"), { recursive: true })
      await writeFile(join(dir, b.name, "base.json"), JSON.stringify({ ...b, recipe: r }))
    }
    await mkdir(join(dir, ".lock-bbbbbbbbbbbb"))
    await writeFile(
      join(dir, ".lock-bbbbbbbbbbbb", "owner.json"),
      JSON.stringify({ name: building, recipe, pid: process.pid, started: 0 }),
    )
    return dir
  }),
  (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true })),
)

/** Everything `Registration.make` needs for a host with a fresh id and a 6 vCPU / 12 GiB budget. */
const hostLayer = (dir: string, id: HostId) => {
  const host = Layer.succeed(Host, { id, driver: "namespace" as const, vcpus: 6, memoryMib: 12 * GiB })
  return Layer.mergeAll(
    Capacity.layer.pipe(Layer.provide(host)),
    host,
    HostSettings.layer({ heartbeatMs: 3000 }),
    BasesSettings.layer({ dir, recipes: [recipe] }),
  )
}

/** Registers a host in its own scope; returns the service, its capacity and the scope to close. */
const register = (dir: string, id: HostId = Schema.decodeSync(HostId)(uniqueName("host"))) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const ctx = yield* Layer.buildWithScope(hostLayer(dir, id), scope)
    const reg = yield* Registration.make.pipe(Effect.provide(ctx), Scope.extend(scope))
    const t0 = Date.parse((yield* reg.record).heartbeat_at)
    return { reg, capacity: Context.get(ctx, Capacity.Capacity), scope, t0 }
  })

/** The first value of `id` in KV matching `pred` (the current one, or a later write). */
const until = (id: string, pred: (r: HostRecord) => boolean) =>
  Effect.gen(function* () {
    const kv = yield* Registration.hostsKv
    const found = yield* kv.watch(id).pipe(
      Stream.filterMap((c) => (c._tag === "Put" && pred(c.value) ? Option.some(c.value) : Option.none())),
      Stream.runHead,
    )
    return Option.getOrThrow(found)
  })

/** Waits (real time, polling) until the heartbeat fiber sleeps on the TestClock. */
const heartbeatSleeping = Effect.gen(function* () {
  while (Chunk.isEmpty(yield* TestClock.sleeps()))
    yield* Effect.promise(() => new Promise((r) => setTimeout(r, 5)))
})

/** Advances the TestClock by one heartbeat and waits for the beat to be stored. */
const beatTo = (id: string, ms: number) =>
  Effect.gen(function* () {
    yield* heartbeatSleeping
    yield* TestClock.adjust("3 seconds")
    return yield* until(id, (r) => r.heartbeat_at === timestamp(ms))
  })

layer(layerAll())("Registration", (it) => {
  it.scoped(
    "start writes the host record: driver, budget, its recipes' bases on disk and building, nothing held, all free",
    () =>
      Effect.gen(function* () {
        const dir = yield* basesDir
        const { reg, scope, t0 } = yield* register(dir)
        // The TestClock is shared by the tests of this file: times are relative to the start.
        expect(t0).toBe(yield* Clock.currentTimeMillis)
        const kv = yield* Registration.hostsKv
        const stored = Option.getOrThrow(yield* kv.get(reg.id)).value
        expect(stored).toEqual({
          id: reg.id,
          driver: "namespace",
          vcpus: 6,
          memory_mib: 12 * GiB,
          bases: [base],
          building: [building],
          started_at: timestamp(t0),
          heartbeat_at: timestamp(t0),
          machines: [],
          free_vcpus: 6,
          free_memory_mib: 12 * GiB,
        })
        expect(yield* reg.record).toEqual(stored)
        yield* Scope.close(scope, Exit.void)
      }),
  )

  it.scoped("the heartbeat advances heartbeat_at every 3 s and keeps started_at", () =>
    Effect.gen(function* () {
      const dir = yield* basesDir
      const { reg, scope, t0 } = yield* register(dir)
      const first = yield* beatTo(reg.id, t0 + 3000)
      const second = yield* beatTo(reg.id, t0 + 6000)
      expect([first.started_at, second.started_at]).toEqual([timestamp(t0), timestamp(t0)])
      expect(second.heartbeat_at).toBe(timestamp(t0 + 6000))
      yield* Scope.close(scope, Exit.void)
    }),
  )

  it.scoped("liveHosts: a host is live up to 15 s after its last heartbeat and gone 1 ms later", () =>
    Effect.gen(function* () {
      const dir = yield* basesDir
      const { reg, scope, t0 } = yield* register(dir)
      const kv = yield* Registration.hostsKv
      // A host that stopped beating at t0 and never removed its record (it crashed).
      const deadId = Schema.decodeSync(HostId)(uniqueName("dead"))
      yield* kv.put(deadId, { ...(yield* reg.record), id: deadId })
      const ids = (now?: number) =>
        Effect.map(Registration.liveHosts(now), (hosts) =>
          hosts.map((h) => h.id).filter((id) => id === reg.id || id === deadId),
        )
      expect((yield* ids(t0 + 15_000)).sort()).toEqual([deadId, reg.id].sort())
      expect(yield* ids(t0 + 15_001)).toEqual([])
      // The beating host stays live as the clock moves on; the dead one drops out.
      for (let t = 3000; t <= 18_000; t += 3000) yield* beatTo(reg.id, t0 + t)
      expect(yield* ids()).toEqual([reg.id])
      // The limit is configurable: 5 s here.
      const liveWithin5s = (now: number) =>
        Effect.map(Registration.liveHosts(now, 5000), (hs) => hs.some((h) => h.id === reg.id))
      expect(yield* liveWithin5s(t0 + 18_000 + 5000)).toBe(true)
      expect(yield* liveWithin5s(t0 + 18_000 + 5001)).toBe(false)
      yield* kv.delete(deadId)
      yield* Scope.close(scope, Exit.void)
    }),
  )

  it.scoped("a clean shutdown (scope release) removes the record", () =>
    Effect.gen(function* () {
      const dir = yield* basesDir
      const { reg, scope } = yield* register(dir)
      const kv = yield* Registration.hostsKv
      expect(Option.isSome(yield* kv.get(reg.id))).toBe(true)
      yield* Scope.close(scope, Exit.void)
      expect(Option.isNone(yield* kv.get(reg.id))).toBe(true)
      expect((yield* Registration.liveHosts()).some((h) => h.id === reg.id)).toBe(false)
    }),
  )

  it.scoped("capacity changes are reflected in the record: machines held and free vCPUs/memory", () =>
    Effect.gen(function* () {
      const dir = yield* basesDir
      const { reg, capacity, scope } = yield* register(dir)
      yield* capacity.reserve("m_l", "l")
      yield* capacity.reserve("m_s", "s")
      const full = yield* until(reg.id, (r) => r.machines.length === 2)
      expect(full.machines).toEqual([
        { id: "m_l", size: "l", vcpus: 4, memory_mib: 8 * GiB },
        { id: "m_s", size: "s", vcpus: 1, memory_mib: 2 * GiB },
      ])
      expect([full.free_vcpus, full.free_memory_mib]).toEqual([1, 2 * GiB])
      yield* capacity.release("m_l")
      const after = yield* until(reg.id, (r) => r.machines.length === 1)
      expect(after.machines.map((m) => m.id)).toEqual(["m_s"])
      expect([after.free_vcpus, after.free_memory_mib]).toEqual([5, 10 * GiB])
      yield* Scope.close(scope, Exit.void)
    }),
  )

  it.scoped("a base built after the last heartbeat is listed by the next one, not by a capacity change", () =>
    Effect.gen(function* () {
      const dir = yield* basesDir
      const { reg, capacity, scope, t0 } = yield* register(dir)
      const fresh = { name: "debian-trixie-20260102-dddddddddddd", sha256: "d".repeat(64), bytes: 7 }
      yield* Effect.promise(async () => {
        await mkdir(join(dir, fresh.name, "rootfs"), { recursive: true })
        await writeFile(join(dir, fresh.name, "base.json"), JSON.stringify({ ...fresh, recipe }))
      })
      // The capacity change writes the record with the bases as the first write read them.
      yield* capacity.reserve("m_s", "s")
      const held = yield* until(reg.id, (r) => r.machines.length === 1)
      expect(held.bases).toEqual([base])
      expect(held.building).toEqual([building])
      // The heartbeat reads them again, and keeps what the capacity change wrote.
      const beaten = yield* beatTo(reg.id, t0 + 3000)
      expect(beaten.bases).toEqual([base, fresh])
      expect(beaten.machines.map((m) => m.id)).toEqual(["m_s"])
      yield* Scope.close(scope, Exit.void)
    }),
  )

  it.scoped(
    "a second agent under the same id takes the record over; the first one's writes fail with HostIdTaken",
    () =>
      Effect.gen(function* () {
        const dir = yield* basesDir
        const first = yield* register(dir)
        const t0 = first.t0
        yield* heartbeatSleeping
        yield* TestClock.adjust("1 second")
        const second = yield* register(dir, first.reg.id)
        const kv = yield* Registration.hostsKv
        expect(Option.getOrThrow(yield* kv.get(first.reg.id)).value.started_at).toBe(timestamp(t0 + 1000))
        const taken = yield* first.reg.beat.pipe(Effect.flip)
        expect(taken).toMatchObject({
          _tag: "HostIdTaken",
          ours: timestamp(t0),
          theirs: timestamp(t0 + 1000),
        })
        // The first agent's shutdown leaves the second one's record alone.
        yield* Scope.close(first.scope, Exit.void)
        expect(Option.getOrThrow(yield* kv.get(first.reg.id)).value.started_at).toBe(timestamp(t0 + 1000))
        yield* Scope.close(second.scope, Exit.void)
        expect(Option.isNone(yield* kv.get(first.reg.id))).toBe(true)
      }),
  )
})

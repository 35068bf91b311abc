/**
 * Warm machines: each host agent keeps a few machines of each base it offers booted before any run
 * asks — made, sshd answering, the host agent's session to it open — so a run that matches one
 * starts on it at once instead of waiting for a machine to be made (`RunMachine`, issue 25).
 *
 * - What is kept: `HANGAR_WARM_MACHINES` (default 2, 0 turns it off) per offered base and per size
 *   of `HANGAR_WARM_SIZE` (a comma-separated list; default `m`, the spec's default size). A run of
 *   a base and size kept takes one; a run of another size starts on a new machine as before. A
 *   machine is made at its size: its disk image and `/dev/shm` cannot be resized while it runs,
 *   so one machine cannot serve every size, and each size kept is a pool of its own.
 * - Never reused: a machine taken is the run's alone and is destroyed with it; the pool makes a new
 *   one in the background. At most two are made at once (`makingAtOnce`): runs that come faster
 *   than one machine is made still find the pool refilled, and refilling never takes more than two
 *   machine starts of the host's CPU from the runs.
 * - A run that finds none ready while one of its base and size is being made, and not yet promised
 *   to another run, waits for that one: it was begun earlier, so it is ready before a machine made
 *   for the run would be (and a second machine made beside it would slow both). If it is not made,
 *   the run's own machine is made as before. The pool begins another for itself meanwhile; should
 *   the run stop waiting, the one it gave back is kept and one made beyond the setting is removed.
 * - A machine made for the pool is background work (`MachineSpec.background`): its making and its
 *   processes yield the host's CPU to running work, so a refill does not slow the run that just
 *   took a machine (nor any other run). Taken, or promised to a run that waits for it, it is
 *   `wanted`: from then on it gets the CPU as any run's machine (one given back by a run that
 *   stopped waiting stays so: it waits idle in the pool).
 * - The offered bases are read again at most every 5 s (and after a machine not made): the pool
 *   looks at them at every event, several times a run. A machine is begun 40 ms after the event
 *   that wants it, so the run that just took one starts first (`BEGIN_AFTER_MS`).
 * - The budget is for running work: warm machines hold none of it, so the scheduler never keeps a
 *   run waiting for them. They are kept only while the room they would take if they ran is free
 *   (vCPUs and memory of the host's budget), and they yield — the oldest is destroyed — as soon as
 *   a run placed here takes that room (`take` checks after each placement). Their disks count
 *   against the host's disk like any machine's: a run's machine refused for the host's disk first
 *   makes them all yield, then is made again. An idle warm machine costs no CPU: an sshd waiting,
 *   and the session's keepalive.
 * - Owned like any machine (its folder names the host id), with ids `warm_<random>`: a host agent
 *   killed outright leaves them to its next life, which removes them (`HostActor`); one taken by a
 *   run and kept (`RunMachine.keep`) names its run in its note and is adopted with it. On stop the
 *   pool's machines are destroyed.
 */
import { randomBytes } from "node:crypto"
import {
  Config,
  ConfigError,
  Context,
  Deferred,
  Effect,
  Either,
  Exit,
  Layer,
  Option,
  Ref,
  Scope,
  Stream,
} from "effect"
import { defineSettings, env } from "../../core/Config.ts"
import * as Bases from "../bases/Bases.ts"
import { BasesSettings } from "../bases/Bases.ts"
import { connect, type GuestSession } from "../guest/GuestSession.ts"
import {
  alive,
  type Machine,
  MachineDriver,
  newKeyPair,
  type SizeName,
  sizes,
} from "../machines/MachineDriver.ts"
import { Capacity } from "../registry/Capacity.ts"
import { Host } from "../registry/HostSettings.ts"

/**
 * The sizes of `HANGAR_WARM_SIZE`: a comma-separated list of the spec's sizes (`s,m`), each once;
 * or why not.
 */
export const parseSizes = (value: string): Either.Either<ReadonlyArray<SizeName>, string> => {
  const names = value
    .split(",")
    .map((v) => v.trim())
    .filter((v) => v !== "")
  const wrong = names.find((n) => !(n in sizes))
  if (wrong !== undefined)
    return Either.left(`HANGAR_WARM_SIZE: ${JSON.stringify(wrong)} is not a size (s, m, l, xl)`)
  if (names.length === 0) return Either.left("HANGAR_WARM_SIZE: no size given (s, m, l, xl)")
  return Either.right([...new Set(names)] as Array<SizeName>)
}

/** `HANGAR_WARM_MACHINES` (per offered base and size; 0 = none) and `HANGAR_WARM_SIZE` (the sizes kept). */
export const WarmSettings = defineSettings(
  "host-agent/WarmSettings",
  { machines: 2, sizes: ["m"] as ReadonlyArray<SizeName> },
  (d) => ({
    machines: env.integer("WARM_MACHINES", d.machines),
    sizes: Config.string("HANGAR_WARM_SIZE").pipe(
      Config.mapOrFail((v) =>
        Either.mapLeft(parseSizes(v), (why) => ConfigError.InvalidData(["HANGAR_WARM_SIZE"], why)),
      ),
      Config.withDefault(d.sizes),
    ),
  }),
)

/** The id prefix of warm machines (`[a-z0-9_]`, as machine ids must be). */
export const warmPrefix = "warm_"

/** Whether machine `id` was made warm (not for a run by its id). */
export const isWarm = (id: string): boolean => id.startsWith(warmPrefix)

/** A warm machine handed to a run: the run's from then on, destroyed with it. */
export interface Warm {
  readonly machine: Machine
  readonly base: string
  /** The private key the session logs in with. */
  readonly clientKey: string
  /** The open session, ready for the run's first command. */
  readonly guest: GuestSession
  /** Closes the session (before the machine is destroyed). */
  readonly close: Effect.Effect<void>
}

/** The pool as a run's machine sees it. */
export interface WarmPoolService {
  /**
   * A ready machine of `base` at `size`, taken out of the pool (a new one is made in the
   * background), or none. Either way the pool then yields what the room left no longer holds.
   */
  readonly take: (base: string, size: SizeName) => Effect.Effect<Option.Option<Warm>>
  /**
   * Destroys every ready machine now (a machine being made for a run found the host's disk
   * promised to them); answers how many went.
   */
  readonly yieldAll: Effect.Effect<number>
  /** The machines ready now, oldest first (operators, tests and benches). */
  readonly ready: Effect.Effect<
    ReadonlyArray<{ readonly id: string; readonly base: string; readonly size: SizeName }>
  >
  /** The machines being made now, by base and size, and whether a run waits for each. */
  readonly making: Effect.Effect<
    ReadonlyArray<{ readonly base: string; readonly size: SizeName; readonly claimed: boolean }>
  >
}

/** The Tag of the host's warm pool. */
export class WarmPool extends Context.Tag("host-agent/WarmPool")<WarmPool, WarmPoolService>() {}

interface Entry extends Warm {
  readonly size: SizeName
  readonly scope: Scope.CloseableScope
}

/** A machine being made: its id, of which base and size, whether a run waits for it, and its end (made or not). */
interface Making {
  readonly id: string
  readonly base: string
  readonly size: SizeName
  claimed: boolean
  readonly done: Deferred.Deferred<void>
}

/** How many machines the pool makes at once. */
export const makingAtOnce = 2

/** How long the pool goes by the bases it read (`WarmPool.make`'s filler). */
const OFFERED_FRESH_MS = 5_000

/**
 * How long after the event that wants it a machine is begun. The usual event is a run taking a
 * machine: for these milliseconds its start has the host agent's thread and the cores to itself
 * (a machine's first steps are synchronous file work, then mkfs, perl and crun). Runs started every
 * 500 ms got their first result at p50 34–40 ms against 43–52 ms begun at once (4 pairs); runs one
 * after another did not move.
 */
const BEGIN_AFTER_MS = 40

/** The pool for the life of the scope (its machines are destroyed when it closes). */
export const make = Effect.gen(function* () {
  const settings = yield* WarmSettings.Tag
  const driver = yield* MachineDriver
  const capacity = yield* Capacity
  const host = yield* Host
  const bases = yield* BasesSettings.Tag
  const poolScope = yield* Effect.scope
  const ready: Array<Entry> = []
  const making: Array<Making> = []
  // Being made and not promised to a run: the pool's own (a promised one holds its run's room).
  const unclaimed = () => making.filter((m) => !m.claimed)
  // The step the last machine not made failed at, until one is made.
  let failedAt: string | undefined
  // After a machine was not made, the next is tried from then (not at every event).
  let retryAt = 0
  // Set to wake the filler (a machine was taken, room came back, a base may have been built).
  const wake = yield* Ref.make(yield* Deferred.make<void>())
  const poke = Effect.flatMap(Ref.get(wake), (d) => Deferred.succeed(d, undefined))

  const removeMachine = (id: string) =>
    driver
      .destroy(id)
      .pipe(
        Effect.catchAll((err) =>
          Effect.logError("warm machine not fully removed").pipe(
            Effect.annotateLogs({ machine: id, detail: err.detail }),
          ),
        ),
      )
  const destroy = (e: Entry) => Effect.zipRight(Scope.close(e.scope, Exit.void), removeMachine(e.machine.id))
  // In the background, but within the pool's life: a host agent stopping waits for it to finish.
  const destroyLater = (going: ReadonlyArray<Entry>) =>
    Effect.forkIn(Effect.uninterruptible(Effect.forEach(going, destroy, { discard: true })), poolScope)

  // Whether the pool's machines (ready, and being made for it), with one more of size `extra`,
  // would fit the room left if they ran.
  const fits = (extra?: SizeName) =>
    Effect.map(capacity.free, (free) => {
      const held = [...ready, ...unclaimed()].map((m) => sizes[m.size])
      if (extra !== undefined) held.push(sizes[extra])
      const vcpus = held.reduce((n, z) => n + z.vcpus, 0)
      const memoryMib = held.reduce((n, z) => n + z.memoryBytes / 2 ** 20, 0)
      return vcpus <= free.vcpus && memoryMib <= free.memory_mib
    })

  /**
   * Destroys the oldest ready machines until the rest fit the room left (in the background). Only
   * `take` calls it, after a placement took its machine or not: fitting on the room's own changes
   * would destroy the machine a run just placed here is about to take.
   */
  const fit = Effect.gen(function* () {
    const going: Array<Entry> = []
    while (ready.length > 0 && !(yield* fits())) going.push(ready.shift()!)
    for (const e of going)
      yield* Effect.logInfo("warm machine yields its room").pipe(
        Effect.annotateLogs({ machine: e.machine.id }),
      )
    if (going.length > 0) yield* destroyLater(going)
  })

  const makeOne = (base: Bases.Base, size: SizeName, m: Making) =>
    Effect.gen(function* () {
      const id = m.id
      const keys = { client: newKeyPair(), host: newKeyPair() }
      const scope = yield* Scope.make()
      const made = yield* driver
        .create({
          id,
          size,
          base: base.rootfs,
          authorizedKey: keys.client.public,
          hostKey: keys.host.private,
          owner: host.id,
          // A run that waits for it already (it was promised before it was begun) wants it now.
          background: !m.claimed,
        })
        .pipe(Effect.either)
      if (made._tag === "Left") {
        yield* Scope.close(scope, Exit.void)
        // Said once per kind of failure (a host whose disk holds no more says so every 30 s else).
        const said = failedAt === made.left.step
        failedAt = made.left.step
        yield* (said ? Effect.logDebug : Effect.logWarning)("warm machine not made").pipe(
          Effect.annotateLogs({ base: base.name, size, step: made.left.step, detail: made.left.detail }),
        )
        return false
      }
      failedAt = undefined
      const machine = made.right
      const guest = yield* connect({ ...machine.ssh, privateKey: keys.client.private }).pipe(
        Scope.extend(scope),
        Effect.either,
      )
      if (guest._tag === "Left") {
        yield* Scope.close(scope, Exit.void)
        yield* removeMachine(id)
        yield* Effect.logWarning("warm machine not reached").pipe(
          Effect.annotateLogs({ machine: id, detail: guest.left.detail }),
        )
        return false
      }
      // The pool already holds as many as it keeps: this one was begun while another, promised
      // to a run, was being made, and that run stopped waiting and gave it back. Not kept beyond
      // the setting (unless a run waits for this one now).
      if (
        !m.claimed &&
        ready.filter((e) => e.base === base.name && e.size === size).length >= settings.machines
      ) {
        yield* Scope.close(scope, Exit.void)
        yield* removeMachine(id)
        yield* Effect.logInfo("warm machine not needed").pipe(Effect.annotateLogs({ machine: id }))
        return true
      }
      ready.push({
        machine,
        base: base.name,
        size,
        clientKey: keys.client.private,
        guest: guest.right,
        scope,
        close: Scope.close(scope, Exit.void),
      })
      yield* Effect.logInfo("warm machine ready").pipe(
        Effect.annotateLogs({ machine: id, base: base.name, size }),
      )
      return true
    })

  // The bases offered, read again after `OFFERED_FRESH_MS` or a machine not made. The filler asks
  // at every event (a machine made or taken, room back), several times a run, and reading them is
  // a dozen file reads; a base is built or removed in minutes.
  let offeredRead: { readonly at: number; readonly bases: ReadonlyArray<Bases.Base> } | undefined
  const offeredBases = Effect.gen(function* () {
    if (offeredRead !== undefined && Date.now() - offeredRead.at < OFFERED_FRESH_MS) return offeredRead.bases
    const offered = yield* Bases.served(bases.recipes)
    const found = (yield* Bases.list(bases.dir)).filter(offered)
    offeredRead = { at: Date.now(), bases: found }
    return found
  })

  // The offered bases and kept sizes that want another machine, the ones with the fewest first.
  const wanted = Effect.gen(function* () {
    const have = (base: string, size: SizeName) =>
      [...ready, ...unclaimed()].filter((m) => m.base === base && m.size === size).length
    return (yield* offeredBases)
      .flatMap((base) => settings.sizes.map((size) => ({ base, size, have: have(base.name, size) })))
      .filter((w) => w.have < settings.machines)
      .sort((a, b) => a.have - b.have)
  })

  // Up to `makingAtOnce` machines at once while a base and size want one and the room holds it (the
  // one with the fewest that fits); else sleep until poked (a machine made, taken or yielded; room
  // back) or 5 s (a base may have been built: the bases are read again at most every 5 s).
  const filler = Effect.gen(function* () {
    for (;;) {
      const next = yield* Deferred.make<void>()
      yield* Ref.set(wake, next)
      let want: { readonly base: Bases.Base; readonly size: SizeName } | undefined
      if (Date.now() >= retryAt && making.length < makingAtOnce)
        for (const w of yield* wanted)
          if (yield* fits(w.size)) {
            want = w
            break
          }
      if (want !== undefined) {
        const m: Making = {
          id: `${warmPrefix}${randomBytes(10).toString("hex")}`,
          base: want.base.name,
          size: want.size,
          claimed: false,
          done: yield* Deferred.make<void>(),
        }
        making.push(m)
        // Not cut midway: a machine being made when the pool closes is finished, then destroyed
        // (the fiber is the pool scope's, stopped before its machines are destroyed). Begun after
        // `BEGIN_AFTER_MS`; a run that wants one meanwhile waits for it, as for one being made.
        yield* Effect.zipRight(Effect.sleep(BEGIN_AFTER_MS), makeOne(want.base, want.size, m)).pipe(
          Effect.tap((ok) =>
            Effect.sync(() => {
              // Not made (the host's disk, say): tried again in 30 s, not at every event, with
              // the bases read again (the one tried may be gone).
              if (!ok) {
                retryAt = Date.now() + 30_000
                offeredRead = undefined
              }
            }),
          ),
          Effect.ensuring(
            Effect.suspend(() => {
              making.splice(making.indexOf(m), 1)
              return Effect.zipRight(Deferred.succeed(m.done, undefined), poke)
            }),
          ),
          Effect.uninterruptible,
          Effect.forkIn(poolScope),
        )
        continue
      }
      const wait = Math.min(5_000, Math.max(0, retryAt - Date.now()) || 5_000)
      yield* Deferred.await(next).pipe(Effect.timeout(wait), Effect.ignore)
    }
  })

  if (settings.machines > 0) {
    // Registered before the fibers: runs after they are stopped, with every made machine listed.
    yield* Effect.addFinalizer(() =>
      Effect.forEach(ready.splice(0), destroy, { concurrency: "unbounded", discard: true }),
    )
    yield* Effect.forkScoped(filler)
    // Room given back (a run ended) may let the pool fill again.
    yield* Effect.forkScoped(Stream.runForEach(capacity.changes, () => poke))
  }

  // The first ready machine of `base` and `size` that is alive, out of the pool (a dead one is
  // destroyed).
  const takeReady = (base: string, size: SizeName) =>
    Effect.gen(function* () {
      for (let i = 0; i < ready.length; i++) {
        const e = ready[i]!
        if (e.base !== base || e.size !== size) continue
        ready.splice(i--, 1)
        // A machine that died while it waited is not handed out.
        if (yield* Effect.promise(() => alive(Number(e.machine.handle.pid)))) return e
        yield* destroyLater([e])
      }
      return undefined
    })

  const take: WarmPoolService["take"] = (base, want) =>
    Effect.gen(function* () {
      if (!settings.sizes.includes(want)) {
        yield* fit
        yield* poke
        return Option.none()
      }
      const t0 = Date.now()
      let found = yield* takeReady(base, want)
      // None ready: the machine being made for the pool, promised to this run and waited for.
      const promised =
        found === undefined ? making.find((m) => !m.claimed && m.base === base && m.size === want) : undefined
      if (promised !== undefined) {
        promised.claimed = true
        yield* driver.wanted(promised.id)
      }
      yield* fit
      yield* poke
      if (promised !== undefined) {
        yield* Deferred.await(promised.done).pipe(
          Effect.onInterrupt(() =>
            Effect.sync(() => {
              promised.claimed = false
            }),
          ),
        )
        found = yield* takeReady(base, want)
      }
      if (found === undefined) return Option.none()
      // Made in the background: the run's from here.
      yield* driver.wanted(found.machine.id)
      const { scope: _scope, size: _size, ...warm } = found
      yield* Effect.logInfo("warm machine taken").pipe(
        Effect.annotateLogs({
          machine: found.machine.id,
          ...(promised === undefined ? {} : { waited_ms: Date.now() - t0 }),
        }),
      )
      return Option.some(warm)
    })

  const yieldAll = Effect.gen(function* () {
    const going = ready.splice(0)
    for (const e of going)
      yield* Effect.logInfo("warm machine yields its room").pipe(
        Effect.annotateLogs({ machine: e.machine.id }),
      )
    yield* Effect.forEach(going, destroy, { concurrency: "unbounded", discard: true })
    return going.length
  })

  return {
    take,
    yieldAll,
    ready: Effect.sync(() => ready.map((e) => ({ id: e.machine.id, base: e.base, size: e.size }))),
    making: Effect.sync(() => making.map((m) => ({ base: m.base, size: m.size, claimed: m.claimed }))),
  } satisfies WarmPoolService
})

/** The pool as a layer, with its settings from `HANGAR_WARM_*`. */
export const layer = Layer.scoped(WarmPool, make).pipe(Layer.provide(WarmSettings.layerFromEnv))

/** The pool with these settings over the defaults (tests: `{ machines: 0 }` keeps none). */
export const layerWith = (settings: Partial<typeof WarmSettings.defaults>) =>
  Layer.scoped(WarmPool, make).pipe(Layer.provide(WarmSettings.layer(settings)))

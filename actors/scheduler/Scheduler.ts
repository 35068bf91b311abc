/**
 * The scheduler's handler (type `scheduler`, one instance `main`): the queue of runs waiting for a
 * machine and the placement of each on a host. Contract and message list in `schema/actors/Scheduler.ts`.
 *
 * Room on a host. The host's record in KV `hosts` (rewritten by its agent on every capacity change
 * and every heartbeat) lists its machines, reserved runs included, and what is free. Runs offered
 * or placed there and not listed in its record yet are taken off what it says is free (the state
 * keeps each placed run's room for that), so a record some moments old never makes the scheduler
 * offer the same room twice; a run the record already lists is counted once, and one it still
 * lists after it was freed only makes the scheduler wait for the next record. (Should an offer
 * still be too much, the host refuses what it lacks.) Hosts whose heartbeat is older than
 * `hostStaleMs` (or whose record is gone) have no room, and on `Tick` the runs offered to them wait
 * again. The runs they took fail `infrastructure` only on evidence gathered while NATS worked: a
 * `Tick` (delivered by NATS, so NATS works) that finds the host stale marks it suspect, and its runs
 * fail only if it is still stale `suspectMs` later. A NATS server that froze or restarted makes
 * every heartbeat look old the moment it is back; the hosts beat again within seconds and are
 * cleared, their runs untouched.
 *
 * Placement is strict first come, first served: only the oldest waiting run is ever considered;
 * when it fits nowhere, everything behind it waits. A refused offer puts the run back in its place;
 * the pass that follows leaves the refusing host out (its record was too optimistic), so refusals
 * cannot loop; the host is offered work again at the next event or `Tick`.
 *
 * Draining. An operator's `Drain` takes a host out of placement: it is offered nothing, its
 * running runs go on (and still fail if it stops beating), and once it holds none it can be
 * stopped; `Undrain` gives it work again. The set is the scheduler's own state, so it outlives
 * restarts of the host agent and of the workers; a drained host that is not registered yet is
 * simply never offered anything when it comes.
 *
 * Where the hosts are read. Placing on a message reads them from memory: the worker that handles
 * the scheduler keeps the `hosts` bucket in a `core/KvCache.ts` (complete, kept by a watch), started
 * on the first message it handles, since any worker may own the scheduler. A record there may be a
 * moment older than KV's, which the rule above makes safe; while the cache is not live (starting, or
 * its watch broke) the hosts are read from KV. A `Tick` always reads KV, so judging a host gone
 * never rests on the cache. A pass then costs the rule alone; a burst of messages (a group the
 * worker applies with one state write) is placed in one pass, by its last message (`ctx.more`),
 * and the state is encoded once per group (`bench/scheduler.ts`).
 *
 * The `tick` timer runs while anything waits, is offered or is placed: every message that takes the
 * scheduler from idle to busy schedules it, and each `Tick` schedules the next while busy. Other
 * messages never move it (a later schedule replaces the earlier one, and a steady stream of
 * messages would otherwise keep pushing it back).
 */
import { Effect, Option, Schema, Scope } from "effect"
import { defineSettings, env } from "../../core/Config.ts"
import * as Kv from "../../core/Kv.ts"
import * as KvCache from "../../core/KvCache.ts"
import { Nats } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import * as Actor from "../../schema/actors/Actor.ts"
import { Host } from "../../schema/actors/Host.ts"
import { Run } from "../../schema/actors/Run.ts"
import {
  Scheduler as Definition,
  type DrainAnswer,
  type SchedulerMessage,
  type SchedulerState,
  type Waiting,
} from "../../schema/actors/Scheduler.ts"
import { timestamp } from "../../schema/Common.ts"
import { HostRecord, isLive } from "../../schema/Host.ts"

export { Scheduler } from "../../schema/actors/Scheduler.ts"

export interface SchedulerSettingsShape {
  /** How often the scheduler re-reads the hosts while it has work (default 2 s). */
  readonly tickMs: number
  /**
   * How long a host holding runs stays suspect (stale on every tick) before it is declared gone;
   * default 5 s, a third of the stale window (a live host beats five times in it).
   */
  readonly suspectMs: number
}

/** The scheduler's settings (`HANGAR_SCHEDULER_*`). */
export const SchedulerSettings = defineSettings(
  "hangar/SchedulerSettings",
  { tickMs: 2_000, suspectMs: 5_000 } as SchedulerSettingsShape,
  (d) => ({
    tickMs: env.integer("SCHEDULER_TICK_MS", d.tickMs),
    suspectMs: env.integer("SCHEDULER_SUSPECT_MS", d.suspectMs),
  }),
)

/** What the handler reaches besides its state. */
export interface SchedulerDeps {
  readonly nats: Nats["Type"]
  readonly storage: Storage["Type"]
  readonly settings: SchedulerSettingsShape
  /** Where the hosts' cache (started on the first message) lives: the worker's life. */
  readonly scope: Scope.Scope
}

/** The detail of a run whose host went away. */
export const hostGoneDetail = "its host stopped answering"

const tickTimer = "tick"

type Result = Actor.HandlerResult<SchedulerState, unknown>
type Ctx = Actor.ActorContext<SchedulerMessage>

/** Queue order: creation time, then run id. */
const before = (a: Waiting, b: Waiting) =>
  a.created_at < b.created_at || (a.created_at === b.created_at && a.run < b.run)

/** The queue with `w` in its place (the queue is sorted). */
export const insert = (queue: ReadonlyArray<Waiting>, w: Waiting): ReadonlyArray<Waiting> => {
  const at = queue.findIndex((q) => before(w, q))
  return at === -1 ? [...queue, w] : [...queue.slice(0, at), w, ...queue.slice(at)]
}

const busy = (s: SchedulerState) =>
  s.queue.length > 0 || Object.keys(s.offered).length > 0 || Object.keys(s.placed).length > 0

/** The hosts the scheduler knows of (drained, or holding runs), or just `only`, as operators see them. */
export const hostViews = (s: SchedulerState, only?: string): DrainAnswer => {
  const runs = new Map<string, Array<string>>()
  const add = (host: string, run: string) => runs.set(host, [...(runs.get(host) ?? []), run])
  for (const [run, host] of Object.entries(s.placed)) add(host, run)
  for (const [run, o] of Object.entries(s.offered)) add(o.host, run)
  const ids = only !== undefined ? [only] : [...new Set([...s.draining, ...runs.keys()])].sort()
  return {
    hosts: ids.map((host) => ({
      host,
      draining: s.draining.includes(host),
      runs: [...(runs.get(host) ?? [])].sort(),
    })),
  }
}

const known = (s: SchedulerState, run: string) =>
  s.offered[run] !== undefined || s.placed[run] !== undefined || s.queue.some((w) => w.run === run)

/**
 * Offers the oldest waiting runs, one after the other, each to the live host with the most free
 * vCPUs that fits it, until one fits nowhere. Pure: the state after and the `Place` messages.
 */
export const place = (
  s: SchedulerState,
  hosts: ReadonlyArray<HostRecord>,
  exclude?: string,
): { readonly state: SchedulerState; readonly send: ReadonlyArray<Actor.Outgoing> } => {
  // Free room per host, less runs offered or placed there that its record does not list yet.
  const free = new Map<string, { vcpus: number; memory: number }>()
  const drained = new Set(s.draining)
  // The runs grouped by host once: a pass costs hosts + runs, not hosts × runs (with 100 hosts
  // and 1,000 offers out, the product made a pass ten times slower; bench/scheduler.ts).
  const taken = new Map<string, Array<{ run: string; vcpus: number; memory_mib: number }>>()
  const take = (host: string, t: { run: string; vcpus: number; memory_mib: number }) => {
    const list = taken.get(host)
    if (list === undefined) taken.set(host, [t])
    else list.push(t)
  }
  for (const o of Object.values(s.offered)) take(o.host, o.waiting)
  for (const [run, host] of Object.entries(s.placed)) {
    const room = s.room[run]
    if (room !== undefined) take(host, { run, ...room })
  }
  for (const h of hosts) {
    if (h.id === exclude || drained.has(h.id)) continue
    let vcpus = h.free_vcpus
    let memory = h.free_memory_mib
    const runs = taken.get(h.id)
    if (runs !== undefined) {
      const listed = new Set(h.machines.flatMap((m) => (m.run === undefined ? [] : [m.run as string])))
      for (const t of runs)
        if (!listed.has(t.run)) {
          vcpus -= t.vcpus
          memory -= t.memory_mib
        }
    }
    // The other way round: a run's machine the record still lists, though the run is neither
    // offered nor placed here any more (its `Freed` came first), holds nothing: its room is free
    // now, not at the record's next write, which would leave the next run waiting for a tick. Should
    // the host still hold it after all, it refuses the offer.
    for (const m of h.machines)
      if (m.run !== undefined && s.offered[m.run] === undefined && s.placed[m.run] === undefined) {
        vcpus += m.vcpus
        memory += m.memory_mib
      }
    free.set(h.id, { vcpus, memory })
  }
  const queue = [...s.queue]
  const offered = { ...s.offered }
  const send: Array<Actor.Outgoing> = []
  while (queue.length > 0) {
    const w = queue[0]!
    let best: string | undefined
    for (const [id, room] of free) {
      if (room.vcpus < w.vcpus || room.memory < w.memory_mib) continue
      const current = best === undefined ? undefined : free.get(best)!
      if (current === undefined || room.vcpus > current.vcpus || (room.vcpus === current.vcpus && id < best!))
        best = id
    }
    if (best === undefined) break
    queue.shift()
    const room = free.get(best)!
    free.set(best, { vcpus: room.vcpus - w.vcpus, memory: room.memory - w.memory_mib })
    offered[w.run] = { host: best, waiting: w }
    send.push(
      Actor.to(Host, best, {
        _tag: "Place",
        run: w.run,
        account: w.account,
        size: w.size,
        vcpus: w.vcpus,
        memory_mib: w.memory_mib,
      }),
    )
  }
  return { state: { ...s, queue, offered }, send }
}

/** The scheduler with its dependencies. */
export const make = (deps: SchedulerDeps) => {
  const scope = deps.scope
  const { tickMs, suspectMs } = deps.settings
  const hostsKv = Kv.make(deps.storage.names.kv.hosts.name, HostRecord).pipe(
    Effect.provideService(Nats, deps.nats),
  )

  // The records as stored, decoded in the view: one that does not decode is left out of placement
  // (a `Tick`'s read logs it) instead of breaking the watch.
  const decodeHost = Schema.decodeUnknownOption(HostRecord)
  let cache: KvCache.KvCache<Option.Option<HostRecord>> | undefined
  let cacheStarted = false
  const startCache = Effect.gen(function* () {
    const raw = yield* Kv.make(deps.storage.names.kv.hosts.name, Schema.Unknown)
    cache = yield* KvCache.make(raw, ">", decodeHost, { complete: true })
  }).pipe(
    Effect.provideService(Nats, deps.nats),
    Effect.catchAll((e) => Effect.logWarning("hosts cache not started; hosts are read from KV", e)),
  )

  /** The live hosts from memory once the cache holds them all; else (starting it once) from KV. */
  const placeableHosts = (now: number) =>
    Effect.suspend(() => {
      const all = cache?.all()
      if (all !== undefined) {
        const live: Array<HostRecord> = []
        for (const record of all.values())
          if (Option.isSome(record) && isLive(record.value, now)) live.push(record.value)
        return Effect.succeed(live)
      }
      if (cacheStarted) return liveHosts(now)
      cacheStarted = true
      return Effect.zipRight(Effect.forkIn(Scope.extend(startCache, scope), scope), liveHosts(now))
    })

  /** The hosts live at `now`; a record that does not decode or vanished while read is left out. */
  const liveHosts = (now: number) =>
    Effect.gen(function* () {
      const kv = yield* hostsKv
      const found = yield* Effect.forEach(
        yield* kv.keys(),
        (key) =>
          kv
            .get(key)
            .pipe(
              Effect.catchTag("KvValueInvalid", (e) =>
                Effect.as(
                  Effect.logWarning("host record left out: invalid").pipe(
                    Effect.annotateLogs({ host: key, error: e.message }),
                  ),
                  Option.none(),
                ),
              ),
            ),
        { concurrency: 8 },
      )
      return found.flatMap((r) => (Option.isSome(r) && isLive(r.value.value, now) ? [r.value.value] : []))
    }).pipe(Effect.mapError((cause) => new Actor.Retryable({ message: "reading the hosts failed", cause })))

  /** Whether host `id`'s own record is there and live (a record that does not decode is not). */
  const hostLive = (id: string, now: number) =>
    Effect.flatMap(hostsKv, (kv) => kv.get(id)).pipe(
      Effect.map(Option.exists((e) => isLive(e.value, now))),
      Effect.catchTag("KvValueInvalid", () => Effect.succeed(false)),
      Effect.mapError((cause) => new Actor.Retryable({ message: "reading a host failed", cause })),
    )

  /**
   * Places what it can (reading the hosts only when something waits) and keeps the tick going. With
   * `once`, a message that has more behind it in its group leaves the placing to the group's last
   * (one pass for a burst of messages, not one each; the tick places should the group end early).
   */
  const settle = (
    before: SchedulerState,
    s: SchedulerState,
    ctx: Ctx,
    options: {
      readonly exclude?: string
      readonly sends?: ReadonlyArray<Actor.Outgoing>
      readonly once?: boolean
    } = {},
  ) =>
    Effect.gen(function* () {
      let state = s
      const send = [...(options.sends ?? [])]
      if (state.queue.length > 0 && !(options.once === true && ctx.more)) {
        const placed = place(state, yield* placeableHosts(ctx.now), options.exclude)
        state = placed.state
        send.push(...placed.send)
      }
      if (!busy(before) && busy(state)) ctx.schedule(tickTimer, ctx.now + tickMs, { _tag: "Tick" })
      return { state, send } satisfies Result
    })

  const handler = (s: SchedulerState, m: SchedulerMessage, ctx: Ctx) =>
    Effect.gen(function* () {
      switch (m._tag) {
        case "Enqueue": {
          if (known(s, m.run)) return { state: s }
          const { _tag, ...waiting } = m
          return yield* settle(s, { ...s, queue: insert(s.queue, waiting) }, ctx, { once: true })
        }
        case "Dequeue": {
          if (!known(s, m.run)) return { state: s }
          const { [m.run]: _o, ...offered } = s.offered
          const { [m.run]: _p, ...placed } = s.placed
          const { [m.run]: _r, ...room } = s.room
          return yield* settle(
            s,
            { ...s, queue: s.queue.filter((w) => w.run !== m.run), offered, placed, room },
            ctx,
            { once: true },
          )
        }
        case "Placed": {
          // A run no longer offered (it ended meanwhile) is the run actor's to stop, not ours to track.
          const offer = s.offered[m.run]
          if (offer === undefined || offer.host !== m.host) return { state: s }
          const { [m.run]: _o, ...offered } = s.offered
          const { vcpus, memory_mib } = offer.waiting
          return yield* settle(
            s,
            {
              ...s,
              offered,
              placed: { ...s.placed, [m.run]: m.host },
              room: { ...s.room, [m.run]: { vcpus, memory_mib } },
            },
            ctx,
            { once: true },
          )
        }
        case "Refused": {
          const offer = s.offered[m.run]
          if (offer === undefined || offer.host !== m.host) return { state: s }
          const { [m.run]: _o, ...offered } = s.offered
          yield* Effect.logInfo("offer refused").pipe(Effect.annotateLogs({ run: m.run, host: m.host }))
          return yield* settle(s, { ...s, offered, queue: insert(s.queue, offer.waiting) }, ctx, {
            exclude: m.host,
          })
        }
        case "Freed": {
          const { [m.run]: _p, ...placed } = s.placed
          const { [m.run]: _r, ...room } = s.room
          const next = s.placed[m.run] === m.host ? { ...s, placed, room } : s
          return yield* settle(s, next, ctx, { once: true })
        }
        case "Drain": {
          const draining = s.draining.includes(m.host) ? s.draining : [...s.draining, m.host].sort()
          if (draining !== s.draining)
            yield* Effect.logInfo("host drained").pipe(Effect.annotateLogs({ host: m.host }))
          const state = { ...s, draining }
          return { state, reply: hostViews(state, m.host) }
        }
        case "Undrain": {
          const draining = s.draining.filter((h) => h !== m.host)
          if (draining.length !== s.draining.length)
            yield* Effect.logInfo("host undrained").pipe(Effect.annotateLogs({ host: m.host }))
          const settled = yield* settle(s, { ...s, draining }, ctx)
          return { ...settled, reply: hostViews(settled.state, m.host) }
        }
        case "Hosts":
          return { state: s, reply: hostViews(s) }
        case "Tick": {
          const hosts = yield* liveHosts(ctx.now)
          const live = new Set<string>(hosts.map((h) => h.id))
          // A key listing can miss a record rewritten while it is read (one value kept per key):
          // a host holding work is declared gone only when reading its own key says so too.
          const holding = new Set([
            ...Object.values(s.placed),
            ...Object.values(s.offered).map((o) => o.host),
          ])
          for (const host of holding) if (!live.has(host) && (yield* hostLive(host, ctx.now))) live.add(host)
          // A stale host holding runs is suspect first; gone once it stayed stale `suspectMs`.
          const suspect: Record<string, number> = {}
          const gone = new Set<string>()
          for (const host of new Set(Object.values(s.placed))) {
            if (live.has(host)) continue
            const since = s.suspect[host] ?? ctx.now
            if (ctx.now - since >= suspectMs) gone.add(host)
            else suspect[host] = since
            if (s.suspect[host] === undefined)
              yield* Effect.logWarning("host heartbeat stale: suspect").pipe(Effect.annotateLogs({ host }))
          }
          for (const host of Object.keys(s.suspect))
            if (live.has(host)) yield* Effect.logInfo("host beats again").pipe(Effect.annotateLogs({ host }))
          const sends: Array<Actor.Outgoing> = []
          const placed: Record<string, string> = {}
          const room: Record<string, SchedulerState["room"][string]> = {}
          for (const [run, host] of Object.entries(s.placed)) {
            if (!gone.has(host)) {
              placed[run] = host
              const r = s.room[run]
              if (r !== undefined) room[run] = r
              continue
            }
            yield* Effect.logWarning("host gone: failing its run").pipe(Effect.annotateLogs({ run, host }))
            sends.push(
              Actor.to(Run, run, {
                _tag: "Fail",
                failure: "infrastructure",
                detail: hostGoneDetail,
                at: timestamp(ctx.now),
              }),
            )
          }
          const offered: Record<string, SchedulerState["offered"][string]> = {}
          let queue = s.queue
          for (const [run, offer] of Object.entries(s.offered)) {
            if (live.has(offer.host)) offered[run] = offer
            else queue = insert(queue, offer.waiting)
          }
          let state: SchedulerState = { queue, offered, placed, room, suspect, draining: s.draining }
          if (state.queue.length > 0) {
            const result = place(state, hosts)
            state = result.state
            sends.push(...result.send)
          }
          if (busy(state)) ctx.schedule(tickTimer, ctx.now + tickMs, { _tag: "Tick" })
          return { state, send: sends }
        }
      }
    })

  return Actor.make({
    name: Definition.name,
    state: Definition.state,
    initial: Definition.initial,
    message: Definition.message,
    handler,
  })
}

/** The scheduler built from the process's connection, storage and settings, for the life of the scope. */
export const actor = Effect.gen(function* () {
  return make({
    nats: yield* Nats,
    storage: yield* Storage,
    settings: yield* SchedulerSettings.Tag,
    scope: yield* Effect.scope,
  })
})

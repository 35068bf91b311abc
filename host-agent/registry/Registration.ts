/**
 * Registration: the host's record in KV `hosts`, written at start, refreshed every
 * `heartbeatMs` (and on every capacity change), and removed when the scope closes.
 *
 * The bases on disk (finished, and being built) are read for the first write and for every
 * heartbeat; a write for a capacity change takes them from the record last written. A capacity
 * change comes several times a run, and reading the bases is a dozen file reads on the host
 * agent's thread while the run starts; a base is built or removed in minutes, and a heartbeat
 * lists it.
 *
 * Every write is compare-and-set on the revision this agent last wrote, serialized by one permit
 * and uninterruptible, so the heartbeat, a capacity change and the final delete never overtake one
 * another. A conflict means someone else wrote the key: if the stored record is still ours (same
 * `started_at`, e.g. a write whose answer was lost) or the key is gone, the agent takes it again;
 * if another agent with the same id has taken it, the write fails with `HostIdTaken`.
 */
import type { Scope } from "effect"
import { Clock, Context, Data, Effect, Layer, Option, Ref, Schedule, Stream } from "effect"
import * as Kv from "../../core/Kv.ts"
import type { Nats, NatsError } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import { timestamp } from "../../schema/Common.ts"
import { type HostId, HostRecord, hostStaleMs, isLive } from "../../schema/Host.ts"
import { BasesSettings } from "../bases/Bases.ts"
import * as Listing from "../bases/Listing.ts"
import { Capacity, type CapacityState, freeOf } from "./Capacity.ts"
import { Host, HostSettings } from "./HostSettings.ts"

/** Another agent has registered under this host's id (its record has another `started_at`). */
export class HostIdTaken extends Data.TaggedError("HostIdTaken")<{
  readonly id: string
  readonly ours: string
  readonly theirs: string
}> {}

/** What a registration write can fail with. */
export type RegistrationError = HostIdTaken | Kv.StateConflict | NatsError | Kv.KvValueInvalid

/** The registered host. */
export interface RegistrationService {
  readonly id: HostId
  /** The record as last written. */
  readonly record: Effect.Effect<HostRecord>
  /** Writes the record now with a fresh `heartbeat_at` and bases; what the heartbeat loop runs. */
  readonly beat: Effect.Effect<HostRecord, RegistrationError>
}

/** The Tag of this host's registration. */
export class Registration extends Context.Tag("host-agent/Registration")<
  Registration,
  RegistrationService
>() {}

/** The typed `hosts` bucket. */
export const hostsKv: Effect.Effect<Kv.Kv<HostRecord>, NatsError, Nats | Storage> = Effect.flatMap(
  Storage,
  (s) => Kv.make(s.names.kv.hosts.name, HostRecord),
)

/**
 * The hosts whose heartbeat is at most `staleMs` old at `now` (the Clock's time when left out).
 * A record that does not decode, or that vanished while being read, is left out.
 */
export const liveHosts = (
  now?: number,
  staleMs: number = hostStaleMs,
): Effect.Effect<ReadonlyArray<HostRecord>, NatsError, Nats | Storage> =>
  Effect.gen(function* () {
    const kv = yield* hostsKv
    const at = now ?? (yield* Clock.currentTimeMillis)
    const records = yield* Effect.forEach(
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
    return records.flatMap((r) =>
      Option.isSome(r) && isLive(r.value.value, at, staleMs) ? [r.value.value] : [],
    )
  })

/**
 * Registers this host for the life of the scope: writes the record, beats every `heartbeatMs`,
 * rewrites on each capacity change, and deletes the record on release. A failing beat is logged
 * and the next one tried; `HostIdTaken` stops the heartbeat (the other agent owns the id now).
 */
export const make: Effect.Effect<
  RegistrationService,
  RegistrationError,
  | Scope.Scope
  | Nats
  | Storage
  | Host
  | Capacity
  | Context.Tag.Identifier<typeof HostSettings.Tag>
  | Context.Tag.Identifier<typeof BasesSettings.Tag>
> = Effect.gen(function* () {
  const host = yield* Host
  const settings = yield* HostSettings.Tag
  const { dir: basesDir, recipes } = yield* BasesSettings.Tag
  const capacity = yield* Capacity
  const kv = yield* hostsKv
  const startedAt = timestamp(yield* Clock.currentTimeMillis)
  const permit = yield* Effect.makeSemaphore(1)
  const revision = yield* Ref.make(0)
  const last = yield* Ref.make<HostRecord | undefined>(undefined)

  // The bases: read again when `fresh` (the first write, the heartbeat), else as last written.
  const basesListing = (fresh: boolean) =>
    Effect.gen(function* () {
      const written = yield* Ref.get(last)
      if (!fresh && written !== undefined) return { bases: written.bases, building: written.building }
      return {
        bases: yield* Listing.onDisk(basesDir, recipes),
        building: yield* Listing.buildingIn(basesDir, recipes),
      }
    })

  const compose = (state: CapacityState, fresh: boolean) =>
    Effect.gen(function* () {
      const free = freeOf(state)
      const { bases, building } = yield* basesListing(fresh)
      const record: HostRecord = {
        id: host.id,
        driver: host.driver,
        vcpus: host.vcpus,
        memory_mib: host.memoryMib,
        bases,
        building,
        started_at: startedAt,
        heartbeat_at: timestamp(yield* Clock.currentTimeMillis),
        machines: state.machines,
        free_vcpus: Math.max(0, free.vcpus),
        free_memory_mib: Math.max(0, free.memory_mib),
      }
      return record
    })

  // After a conflict: the revision to write over, or HostIdTaken when the key is someone else's.
  const recover = Effect.gen(function* () {
    const current = yield* kv.get(host.id)
    if (Option.isNone(current)) return 0
    if (current.value.value.started_at !== startedAt)
      return yield* new HostIdTaken({ id: host.id, ours: startedAt, theirs: current.value.value.started_at })
    return current.value.revision
  })

  const writeAt = (state: CapacityState, rev: number, fresh: boolean) =>
    Effect.gen(function* () {
      const record = yield* compose(state, fresh)
      yield* Ref.set(revision, yield* kv.update(host.id, record, rev))
      yield* Ref.set(last, record)
      return record
    })

  const write = (state: CapacityState, fresh: boolean) =>
    Effect.flatMap(Ref.get(revision), (rev) =>
      writeAt(state, rev, fresh).pipe(
        Effect.catchTag("StateConflict", () =>
          Effect.flatMap(recover, (current) => writeAt(state, current, fresh)),
        ),
      ),
    ).pipe(Effect.uninterruptible, permit.withPermits(1))

  const beat = Effect.flatMap(capacity.state, (state) => write(state, true))

  // The first write takes the record over whoever wrote it: a record under our id is left by an
  // earlier run of this host that crashed, or belongs to a live agent misconfigured with our id,
  // whose next write then fails with HostIdTaken. A write racing ours between read and CAS (that
  // agent's heartbeat) just means reading again.
  const takeOver = Effect.gen(function* () {
    const previous = yield* kv.get(host.id)
    return yield* writeAt(yield* capacity.state, Option.isSome(previous) ? previous.value.revision : 0, true)
  }).pipe(
    Effect.retry({ times: 5, while: (e) => e._tag === "StateConflict" }),
    Effect.uninterruptible,
    permit.withPermits(1),
  )
  yield* Effect.acquireRelease(takeOver, () =>
    Effect.gen(function* () {
      const rev = yield* Ref.get(revision)
      yield* kv
        .delete(host.id, { revision: rev })
        .pipe(
          Effect.catchTag("StateConflict", () =>
            Effect.flatMap(recover, (fresh) =>
              fresh === 0 ? Effect.void : kv.delete(host.id, { revision: fresh }),
            ),
          ),
        )
      yield* Effect.logInfo("host unregistered")
    }).pipe(
      permit.withPermits(1),
      Effect.catchAll((e) =>
        Effect.logWarning("host record not removed").pipe(Effect.annotateLogs({ error: e._tag })),
      ),
    ),
  )
  yield* Effect.logInfo("host registered").pipe(
    Effect.annotateLogs({
      host: host.id,
      driver: host.driver,
      vcpus: host.vcpus,
      memory_mib: host.memoryMib,
    }),
  )

  const logFailure = (what: string) => (e: RegistrationError) =>
    e._tag === "HostIdTaken"
      ? Effect.fail(e)
      : Effect.logWarning(`${what} failed; trying again at the next one`).pipe(
          Effect.annotateLogs({ error: e._tag, message: e.message }),
        )
  const stopped = (what: string) => (e: RegistrationError) =>
    Effect.logError(`${what} stopped`).pipe(Effect.annotateLogs({ error: e._tag, message: e.message }))

  yield* beat.pipe(
    Effect.catchAll(logFailure("heartbeat")),
    Effect.schedule(Schedule.spaced(settings.heartbeatMs)),
    Effect.catchAll(stopped("heartbeat")),
    Effect.forkScoped,
  )
  // The first element may repeat the state just written: one extra write, but no change missed.
  yield* capacity.changes.pipe(
    Stream.runForEach((state) => write(state, false).pipe(Effect.catchAll(logFailure("capacity update")))),
    Effect.catchAll(stopped("capacity updates")),
    Effect.forkScoped,
  )

  return {
    id: host.id,
    record: Effect.map(Ref.get(last), (r) => r as HostRecord),
    beat,
  } satisfies RegistrationService
}).pipe(Effect.annotateLogs({ role: "host-agent" }))

/** This host's registration as a layer (released: the record is deleted). */
export const layer = Layer.scoped(Registration, make)

/**
 * An actor worker: claims a fair share of every actor type's mailbox partitions with leases,
 * consumes each owned partition in order through one consumer (one actor's messages one at a time
 * in stream order, so its handler never runs twice at once), and rebalances as workers come and go.
 *
 * Every `renewMs` a worker renews its presence and leases, releases partitions above its share,
 * and claims free or expired ones up to it. A lease it cannot renew stops that partition at once.
 * Closing the worker's scope stops its partitions and releases their leases, so others take over
 * at their next tick; a killed worker's leases simply expire.
 */
import { randomBytes } from "node:crypto"
import {
  Cause,
  Clock,
  Context,
  Deferred,
  Effect,
  Exit,
  Fiber,
  FiberSet,
  Layer,
  Option,
  Schedule,
  Scope,
} from "effect"
import type { AnyActor } from "../../schema/actors/Actor.ts"
import type { Delivery } from "../Consumer.ts"
import * as Consumer from "../Consumer.ts"
import { makeId } from "../Ids.ts"
import * as Kv from "../Kv.ts"
import { Nats, type NatsError } from "../Nats.ts"
import { Storage } from "../Storage.ts"
import {
  type CrashPoint,
  handle,
  type LeaseExpired,
  type PartitionRuntime,
  type StaleOwner,
} from "./internal/Handle.ts"
import * as Leases from "./Leases.ts"
import { type ActorRecord, encodedStateRecordSchema, recordSchema } from "./Record.ts"
import { ActorSettings } from "./Settings.ts"

export type { CrashPoint } from "./internal/Handle.ts"

/**
 * Test-only fault injection: the worker "dies" (stops everything, releases nothing, acks nothing)
 * at `crashAt` on the first message `match` accepts.
 */
export class WorkerFaults extends Context.Tag("hangar/actors/WorkerFaults")<
  WorkerFaults,
  {
    readonly crashAt: CrashPoint
    /** `group` is how many messages the crashing step applies together. */
    readonly match?: (info: {
      readonly id: string
      readonly tag: string
      readonly seq: number
      readonly group: number
    }) => boolean
  }
>() {}

export interface WorkerService {
  readonly id: string
  /** The partitions this worker owns now, as `<type>.<partition>`. */
  readonly owned: Effect.Effect<ReadonlyArray<string>>
  /** Completes when an injected fault has killed this worker. */
  readonly crashed: Effect.Effect<void>
}

/** A running worker. */
export class Worker extends Context.Tag("hangar/actors/Worker")<Worker, WorkerService>() {}

/** Leases of one actor type renewed at once in a tick (a worker alone holds all 32 by default). */
const RENEW_AT_ONCE = 32

interface Owned {
  readonly actor: AnyActor
  readonly partition: number
  revision: number
  deadline: number
  readonly consumer: string
  readonly fiber: Fiber.RuntimeFiber<void, unknown>
}

/** Starts a worker for `actors` in the current scope. */
export const make = (actors: ReadonlyArray<AnyActor>) =>
  Effect.gen(function* () {
    const nats = yield* Nats
    const { names } = yield* Storage
    const settings = yield* ActorSettings.Tag
    const faults = yield* Effect.serviceOption(WorkerFaults)
    const workerId = settings.workerId || makeId("wrk")
    const stream = names.streams.MAILBOX.name
    const leases = yield* Leases.open(names.kv.leases.name)
    const stores = new Map<string, Kv.Kv<ActorRecord<unknown>>>()
    for (const actor of actors) {
      stores.set(
        actor.name,
        (yield* Kv.make(names.kv.actors.name, recordSchema(actor))) as Kv.Kv<ActorRecord<unknown>>,
      )
    }
    const encodedKv = (yield* Kv.make(names.kv.actors.name, encodedStateRecordSchema)) as Kv.Kv<
      ActorRecord<unknown>
    >
    const owned = new Map<string, Owned>()
    const crashed = yield* Deferred.make<void>()
    let dead = false
    const margin = Math.max(1, Math.floor(settings.leaseMs / 10))
    const runnerScope = yield* Scope.make()

    const fault: NonNullable<PartitionRuntime["fault"]> = (point, info) =>
      Option.isSome(faults) && faults.value.crashAt === point && !dead && (faults.value.match?.(info) ?? true)
        ? Effect.gen(function* () {
            dead = true
            yield* Effect.logWarning("injected crash").pipe(
              Effect.annotateLogs({ point, worker: workerId, ...info }),
            )
            yield* Deferred.succeed(crashed, undefined)
            return yield* Effect.never
          })
        : Effect.void

    const runPartition = (actor: AnyActor, partition: number, consumer: string, label: string) =>
      Effect.gen(function* () {
        yield* Consumer.create(stream, consumer, {
          filter: names.subjects.mailboxPartition(actor.name, partition),
          ackWaitMs: settings.ackWaitMs,
          maxAckPending: settings.maxInFlight,
        })
        const take = yield* Consumer.batches(stream, consumer)
        const rt: PartitionRuntime = {
          actor,
          partition,
          label,
          kv: stores.get(actor.name)!,
          encodedKv,
          names,
          settings,
          cache: new Map(),
          leaseDeadline: () => owned.get(label)?.deadline ?? 0,
          ...(Option.isSome(faults) ? { fault } : {}),
        }
        yield* Effect.logInfo("partition started").pipe(
          Effect.annotateLogs({ worker: workerId, partition: label }),
        )
        // Messages of one actor run one after another in delivery order; different actors of the
        // partition run side by side (up to `maxInFlight` unacknowledged), so one slow or retrying
        // actor does not hold up the rest. An actor with messages waiting has one fiber, which takes
        // what has queued up for it as one group (see `handle`) until none is left. A
        // partition-stopping failure of any of them ends the lot.
        const running = yield* FiberSet.make<void, LeaseExpired | StaleOwner>()
        const waiting = new Map<string, Array<Delivery>>()
        const nextGroup = (id: string, queue: Array<Delivery>) =>
          Effect.sync(() => {
            // Checked and removed in one step, so a delivery queued meanwhile is never stranded.
            if (queue.length > 0) return queue.splice(0, Math.max(1, settings.groupMax))
            waiting.delete(id)
            return undefined
          })
        const drain = (id: string, queue: Array<Delivery>) =>
          Effect.gen(function* () {
            while (true) {
              const group = yield* nextGroup(id, queue)
              if (group === undefined) return
              yield* handle(rt, group)
            }
          })
        const dispatch = Effect.gen(function* () {
          while (true) {
            const batch = yield* take
            for (const d of batch) {
              const id = d.subject.slice(d.subject.lastIndexOf(".") + 1)
              const queue = waiting.get(id)
              if (queue !== undefined) {
                queue.push(d)
                continue
              }
              const fresh = [d]
              waiting.set(id, fresh)
              yield* FiberSet.run(running, drain(id, fresh))
            }
          }
        }).pipe(Effect.catchAll(Option.match({ onNone: () => Effect.void, onSome: Effect.fail })))
        yield* Effect.raceFirst(dispatch, FiberSet.join(running))
      }).pipe(
        Effect.scoped,
        Effect.tapErrorCause((cause) =>
          Cause.isInterruptedOnly(cause)
            ? Effect.void
            : Effect.logWarning("partition stopped", Cause.squash(cause)).pipe(
                Effect.annotateLogs({ worker: workerId, partition: label }),
              ),
        ),
        Effect.provideService(Nats, nats),
      )

    // Stops consuming first, then gives the lease back (only if still ours) for others to claim.
    const release = (label: string, o: Owned, removeConsumer: boolean) =>
      Effect.gen(function* () {
        owned.delete(label)
        yield* Fiber.interrupt(o.fiber)
        if (removeConsumer) yield* Consumer.remove(stream, o.consumer).pipe(Effect.ignore)
        yield* leases
          .delete(Leases.leaseKey(o.actor.name, o.partition), { revision: o.revision })
          .pipe(Effect.ignore)
        yield* Effect.logInfo("partition released").pipe(
          Effect.annotateLogs({ worker: workerId, partition: label }),
        )
      })

    const lose = (label: string, o: Owned, reason: string) =>
      Effect.gen(function* () {
        owned.delete(label)
        yield* Fiber.interrupt(o.fiber)
        yield* Effect.logWarning("partition lost").pipe(
          Effect.annotateLogs({ worker: workerId, partition: label, reason }),
        )
      })

    const tickActor = (actor: AnyActor, workers: ReadonlyArray<string>, now: number) =>
      Effect.gen(function* () {
        const quota = Leases.quotaOf(workers, workerId, settings.partitions)
        const expiresAt = now + settings.leaseMs
        const mine = () => [...owned.entries()].filter(([, o]) => o.actor === actor)

        // Renew what we hold; a partition whose fiber stopped (stale owner, consumer gone) is given
        // back. Side by side: one after another, a tick took the sum of its writes' round trips,
        // and a write the store does not answer waits out its 5 s timeout (a cluster electing the
        // leases stream's leader), so a few such writes held every later lease past its time.
        yield* Effect.forEach(
          mine(),
          ([label, o]) =>
            Effect.gen(function* () {
              if (Option.isSome(yield* Fiber.poll(o.fiber))) return yield* release(label, o, true)
              const renewed = yield* leases
                .update(
                  Leases.leaseKey(actor.name, o.partition),
                  { owner: workerId, expiresAt, consumer: o.consumer },
                  o.revision,
                )
                .pipe(Effect.either)
              if (renewed._tag === "Right") {
                o.revision = renewed.right
                o.deadline = expiresAt - margin
              } else if (renewed.left._tag === "StateConflict") {
                yield* lose(label, o, "lease taken")
              } else if (now >= o.deadline) {
                yield* lose(label, o, "lease expired")
              }
            }),
          { concurrency: RENEW_AT_ONCE, discard: true },
        )

        // Above our share: give the highest partitions back.
        const held = mine().sort((a, b) => b[1].partition - a[1].partition)
        for (const [label, o] of held.slice(0, Math.max(0, held.length - quota)))
          yield* release(label, o, true)

        // Below our share: claim free or expired partitions, starting at a worker-specific offset.
        let missing = quota - mine().length
        if (missing <= 0) return
        const start = Number.parseInt(workerId.slice(-4), 32) % settings.partitions || 0
        const order = Array.from(
          { length: settings.partitions },
          (_, i) => (start + i) % settings.partitions,
        ).filter((p) => !owned.has(`${actor.name}.${p}`))
        const current = yield* Effect.forEach(
          order,
          (p) => leases.get(Leases.leaseKey(actor.name, p)).pipe(Effect.map((e) => [p, e] as const)),
          { concurrency: 8 },
        )
        for (const [p, entry] of current) {
          if (missing <= 0) break
          if (Option.isSome(entry) && entry.value.value.expiresAt > now) continue
          const consumer = `c_${actor.name}_${p}_${randomBytes(4).toString("hex")}`
          const claimed = yield* leases
            .update(
              Leases.leaseKey(actor.name, p),
              { owner: workerId, expiresAt, consumer },
              Option.isSome(entry) ? entry.value.revision : 0,
            )
            .pipe(Effect.option)
          if (Option.isNone(claimed)) continue
          missing--
          const previous = Option.isSome(entry) ? entry.value.value.consumer : undefined
          if (previous !== undefined) yield* Consumer.remove(stream, previous).pipe(Effect.ignore)
          const label = `${actor.name}.${p}`
          const fiber = yield* Effect.forkIn(runPartition(actor, p, consumer, label), runnerScope)
          owned.set(label, {
            actor,
            partition: p,
            revision: claimed.value,
            deadline: expiresAt - margin,
            consumer,
            fiber,
          })
        }
      })

    const tick = Effect.gen(function* () {
      if (dead) return yield* Effect.never
      const now = yield* Clock.currentTimeMillis
      yield* leases.put(Leases.presenceKey(workerId), { owner: workerId, expiresAt: now + settings.leaseMs })
      const workers = yield* Leases.liveWorkers(leases, now)
      for (const actor of actors) yield* tickActor(actor, workers, now)
    }).pipe(
      Effect.catchAll((error: NatsError | Kv.KvValueInvalid | Kv.StateConflict) =>
        Effect.logWarning("lease tick failed").pipe(
          Effect.annotateLogs({ worker: workerId, error: error._tag }),
        ),
      ),
      Effect.provideService(Nats, nats),
    )

    // Registered before the loop is forked, so it runs after the loop has been interrupted.
    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        if (!dead) {
          yield* Effect.forEach([...owned.entries()], ([label, o]) => release(label, o, true), {
            discard: true,
          })
          yield* leases.delete(Leases.presenceKey(workerId)).pipe(Effect.ignore)
        }
        yield* Scope.close(runnerScope, Exit.void)
      }).pipe(Effect.provideService(Nats, nats)),
    )
    yield* Effect.logInfo("worker started").pipe(
      Effect.annotateLogs({ worker: workerId, actors: actors.map((a) => a.name) }),
    )
    yield* tick.pipe(Effect.repeat({ schedule: Schedule.spaced(settings.renewMs) }), Effect.forkScoped)

    return {
      id: workerId,
      owned: Effect.sync(() => [...owned.keys()].sort()),
      crashed: Deferred.await(crashed),
    } satisfies WorkerService
  })

/** A worker for `actors` as a layer; its partitions are released when the layer's scope closes. */
export const layer = (
  actors: ReadonlyArray<AnyActor>,
): Layer.Layer<Worker, NatsError, Nats | Storage | typeof ActorSettings.Tag.Identifier> =>
  Layer.scoped(Worker, make(actors))

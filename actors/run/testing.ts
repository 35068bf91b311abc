/**
 * Test helpers for the run and scheduler actors over a real nats-server: a worker hosting the
 * account, run and scheduler actors (with short timer settings), an inbox reading the messages
 * sent to an actor no worker hosts (a host agent's mailbox, a webhook event), host records written
 * as a host agent writes them, and a scripted host that answers `Place` and `Stop` as a host agent
 * does (reserve or refuse, `Started` + `Placed`, `Freed`) without making machines.
 */
import {
  Context,
  type Duration,
  Effect,
  Exit,
  Layer,
  Option,
  Queue,
  Ref,
  Schema,
  Scope,
  Stream,
} from "effect"
import * as Mailbox from "../../core/actors/Mailbox.ts"
import type { ActorSettingsShape } from "../../core/actors/Settings.ts"
import { fast, startWorker, type TestWorker } from "../../core/actors/testing/Harness.ts"
import type * as Worker from "../../core/actors/Worker.ts"
import * as Consumer from "../../core/Consumer.ts"
import * as Kv from "../../core/Kv.ts"
import { Nats, layerUrl as natsLayerUrl } from "../../core/Nats.ts"
import { Seal } from "../../core/Seal.ts"
import { Storage, layerPrefix as storageLayerPrefix } from "../../core/Storage.ts"
import type { AnyActor, MessageOf } from "../../schema/actors/Actor.ts"
import { Host, type HostMessage } from "../../schema/actors/Host.ts"
import { Run } from "../../schema/actors/Run.ts"
import { Scheduler, schedulerId } from "../../schema/actors/Scheduler.ts"
import { timestamp } from "../../schema/Common.ts"
import type { Size } from "../../schema/Definition.ts"
import { type HostId, type HostMachine, HostRecord } from "../../schema/Host.ts"
import type { RunId } from "../../schema/Ids.ts"
import { sizes } from "../../schema/Limits.ts"
import { StoredRun } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import * as AccountActor from "../account/Account.ts"
import { sealLayerMemory } from "../account/testing.ts"
import * as SchedulerActor from "../scheduler/Scheduler.ts"
import * as RunActor from "./Run.ts"
import { RunSettings, type RunSettingsShape } from "./Settings.ts"

/** Options of a test worker. */
export interface RunWorkerOptions {
  readonly run?: Partial<RunSettingsShape>
  readonly scheduler?: Partial<SchedulerActor.SchedulerSettingsShape>
  readonly actor?: Partial<ActorSettingsShape>
  readonly faults?: Worker.WorkerFaults["Type"]
}

/** Starts a worker hosting the account, run and scheduler actors for storage `prefix`. */
export const startRunWorker = (
  url: string,
  prefix: string,
  options: RunWorkerOptions = {},
): Effect.Effect<TestWorker> =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const deps = sealLayerMemory.pipe(
      Layer.provideMerge(storageLayerPrefix(prefix)),
      Layer.provideMerge(natsLayerUrl(url, "test-run-actors")),
    )
    const context = yield* Layer.buildWithScope(deps, scope).pipe(Effect.orDie)
    const nats = Context.get(context, Nats)
    const storage = Context.get(context, Storage)
    const actors = [
      AccountActor.make({ nats, storage, seal: Context.get(context, Seal) }),
      RunActor.make({ nats, storage, settings: { ...RunSettings.defaults, ...options.run } }),
      SchedulerActor.make({
        nats,
        storage,
        settings: { ...SchedulerActor.SchedulerSettings.defaults, ...options.scheduler },
        scope,
      }),
    ]
    const worker = yield* startWorker(url, prefix, actors, { ...fast, ...options.actor }, options.faults)
    return { worker: worker.worker, stop: worker.stop.pipe(Effect.zipRight(Scope.close(scope, Exit.void))) }
  })

/** Messages arriving in the mailbox of an actor no worker hosts, in order. */
export interface Inbox<M> {
  /** The next message (dies after `timeout`: a test that cannot finish). */
  readonly next: (timeout?: Duration.DurationInput) => Effect.Effect<M>
  /** The next message that `f` accepts, dropping the others. */
  readonly nextWhere: <B extends M>(f: (m: M) => m is B, timeout?: Duration.DurationInput) => Effect.Effect<B>
  /** Every message received and not yet taken. */
  readonly pending: Effect.Effect<ReadonlyArray<M>>
}

/**
 * Reads actor `actor`/`id`'s mailbox subject with a durable consumer (removed when the scope
 * closes), acknowledging each message, as the actor's owner would.
 */
export const inbox = <A extends AnyActor>(actor: A, id: string) =>
  Effect.gen(function* () {
    const mailbox = yield* Mailbox.Mailbox
    const { names } = yield* Storage
    const stream = names.streams.MAILBOX.name
    const name = `test_${actor.name}_${id}`.replace(/[^A-Za-z0-9_-]/g, "_")
    yield* Effect.acquireRelease(
      Consumer.create(stream, name, {
        filter: mailbox.subjectOf(actor, id),
        ackWaitMs: 30_000,
        maxAckPending: 1_000,
      }),
      () => Effect.ignore(Consumer.remove(stream, name)),
    )
    const deliveries = yield* Consumer.consume(stream, name)
    const queue = yield* Queue.unbounded<MessageOf<A>>()
    const decode = Schema.decodeUnknown(Schema.parseJson(actor.message))
    const text = new TextDecoder()
    yield* Stream.runForEach(deliveries, (d) =>
      Effect.flatMap(decode(text.decode(d.data)).pipe(Effect.orDie), (m) => {
        d.ack()
        return Queue.offer(queue, m as MessageOf<A>)
      }),
    ).pipe(Effect.forkScoped)
    const take = (timeout: Duration.DurationInput = "20 seconds") =>
      Queue.take(queue).pipe(
        Effect.timeoutFail({ duration: timeout, onTimeout: () => `no message for ${actor.name}/${id}` }),
        Effect.orDie,
      )
    const nextWhere = <B extends MessageOf<A>>(
      f: (m: MessageOf<A>) => m is B,
      timeout: Duration.DurationInput = "20 seconds",
    ) =>
      Effect.gen(function* () {
        while (true) {
          const m = yield* take(timeout)
          if (f(m)) return m
        }
      })
    return {
      next: take,
      nextWhere,
      pending: Queue.takeAll(queue).pipe(
        Effect.tap((all) => Queue.offerAll(queue, all)),
        Effect.map((c) => [...c]),
      ),
    } satisfies Inbox<MessageOf<A>>
  })

/** A host record as an agent writes it: budget, machines (reservations) and what is left free. */
export const hostRecord = (
  id: string,
  budget: { readonly vcpus: number; readonly memory_mib: number },
  machines: ReadonlyArray<HostMachine> = [],
  now = Date.now(),
): HostRecord => ({
  id: id as HostId,
  driver: "namespace",
  vcpus: budget.vcpus,
  memory_mib: budget.memory_mib,
  bases: [],
  started_at: timestamp(now),
  heartbeat_at: timestamp(now),
  machines,
  free_vcpus: budget.vcpus - machines.reduce((n, m) => n + m.vcpus, 0),
  free_memory_mib: budget.memory_mib - machines.reduce((n, m) => n + m.memory_mib, 0),
})

/** The typed `hosts` bucket. */
export const hostsKv = Effect.flatMap(Storage, ({ names }) => Kv.make(names.kv.hosts.name, HostRecord))

/** Writes a host record (last writer wins, as the test is the only writer of its hosts). */
export const writeHost = (record: HostRecord) => Effect.flatMap(hostsKv, (kv) => kv.put(record.id, record))

/** Removes a host record (the host is gone). */
export const removeHost = (id: string) => Effect.flatMap(hostsKv, (kv) => kv.delete(id))

/** A machine entry for a run of `size`. */
export const machineOf = (run: RunId, size: Size): HostMachine => ({
  id: run.replace(/[^a-z0-9_]/g, "_"),
  run,
  size,
  vcpus: sizes[size].vcpus,
  memory_mib: sizes[size].memoryMib,
})

/** A host that answers `Place` and `Stop` like a host agent; `log` is every message it received. */
export interface ScriptedHost {
  readonly id: string
  readonly log: Effect.Effect<ReadonlyArray<HostMessage>>
  /** The runs placed on it, in the order it took them. */
  readonly taken: Effect.Effect<ReadonlyArray<RunId>>
}

/**
 * Runs a scripted host `id` with `budget` for the scope: its record is written at start and after
 * every change; an offer that fits is reserved (`Started` to the run, `Placed` to the scheduler),
 * one that does not is refused, and so are the first `refuseFirst` offers (a record that promised
 * too much); a `Stop` releases the run's room and answers `Freed`.
 */
export const scriptedHost = (
  id: string,
  budget: { readonly vcpus: number; readonly memory_mib: number },
  refuseFirst = 0,
) =>
  Effect.gen(function* () {
    const machines = yield* Ref.make<ReadonlyArray<HostMachine>>([])
    const log = yield* Ref.make<ReadonlyArray<HostMessage>>([])
    const taken = yield* Ref.make<ReadonlyArray<RunId>>([])
    const refusals = yield* Ref.make(refuseFirst)
    const startedAt = Date.now()
    const write = Effect.flatMap(Ref.get(machines), (ms) =>
      writeHost({ ...hostRecord(id, budget, ms), started_at: timestamp(startedAt) }),
    )
    yield* write
    const messages = yield* inbox(Host, id)
    const handle = (m: HostMessage) =>
      Effect.gen(function* () {
        yield* Ref.update(log, (l) => [...l, m])
        switch (m._tag) {
          case "Place": {
            const held = yield* Ref.get(machines)
            const free = hostRecord(id, budget, held)
            const refuse = yield* Ref.modify(refusals, (n) => [n > 0, Math.max(0, n - 1)] as const)
            if (refuse || free.free_vcpus < m.vcpus || free.free_memory_mib < m.memory_mib) {
              yield* Mailbox.send(
                Scheduler,
                schedulerId,
                { _tag: "Refused", run: m.run, host: id },
                {
                  msgId: `refused-${id}-${m.run}-${held.length}-${Date.now()}`,
                },
              )
              return
            }
            yield* Ref.set(machines, [...held, machineOf(m.run, m.size)])
            yield* Ref.update(taken, (t) => [...t, m.run])
            yield* write
            yield* Mailbox.send(
              Run,
              m.run,
              { _tag: "Started", host: id, at: timestamp(Date.now()) },
              {
                msgId: `started-${id}-${m.run}`,
              },
            )
            yield* Mailbox.send(
              Scheduler,
              schedulerId,
              { _tag: "Placed", run: m.run, host: id },
              {
                msgId: `placed-${id}-${m.run}`,
              },
            )
            return
          }
          case "Stop": {
            const held = yield* Ref.get(machines)
            if (!held.some((x) => x.run === m.run)) return
            yield* Ref.set(
              machines,
              held.filter((x) => x.run !== m.run),
            )
            yield* write
            yield* Mailbox.send(
              Scheduler,
              schedulerId,
              { _tag: "Freed", run: m.run, host: id },
              {
                msgId: `freed-${id}-${m.run}`,
              },
            )
            return
          }
          case "CancelCommand":
            return
        }
      })
    yield* Effect.forever(Effect.flatMap(messages.next("1 hour"), handle)).pipe(Effect.forkScoped)
    return {
      id,
      log: Ref.get(log),
      taken: Ref.get(taken),
    } satisfies ScriptedHost
  })

/** The stored run (KV `runs`), or none. */
export const storedRun = (account: string, run: string) =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const kv = yield* Kv.make(names.kv.runs.name, StoredRun)
    return Option.map(yield* kv.get(kvKeys.run(account, run)), (e) => e.value)
  })

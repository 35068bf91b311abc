/**
 * The host actor (`schema/actors/Host.ts`), run by the host agent itself: only this process owns
 * the host's machines and capacity, so instead of an actor worker it consumes its own mailbox
 * subject `mb.host.<partition>.<host id>` (the partition as every sender computes it) through one
 * durable consumer named after the host, one message at a time, in order.
 *
 *   Place          reads the run (KV `runs`); a run that is missing or ended is dropped. A run
 *                  whose base this host is still building → scheduler `Refused` (it waits in the
 *                  queue and is offered again). Room is
 *                  reserved (`Capacity`, under the run's id): none → scheduler `Refused`; else run
 *                  `Started{host, at}` and scheduler `Placed`, then the run's machine starts in its
 *                  own fibers (`RunMachine`). A run already running that this process does not
 *                  hold was taken by an earlier life of this agent that did not leave it a machine
 *                  to adopt (see below): when it names this host, the run fails `infrastructure`.
 *   Stop           ends the run's machine (cancel commands, last log part, destroy, release room,
 *                  scheduler `Freed`). For a run this process does not hold, only `Freed` (the
 *                  machine is gone either way, and the scheduler must not count it).
 *   CancelCommand  cancels one command through the run's machine.
 *   Log            a line for the run's log from the agent loop (the model's messages); dropped
 *                  when the run's machine is not held here.
 *
 * Ending a machine and cancelling run beside the consumer, so one slow machine never holds up the
 * host's other messages. Every message sent carries a deterministic id (`<run>:started`,
 * `<run>:placed`, `<run>:refused:<mailbox seq>`, `<run>:freed`), so a message handled again after a
 * crash stores nothing twice. A message that cannot be handled for want of the bus is not
 * acknowledged and comes back; one that does not decode is logged and dropped.
 *
 * At start, before consuming, the machines an earlier life of this host id left (it was killed
 * outright) are taken over when they are ready and still run, and their runs go on; the rest are
 * removed and their runs failed `infrastructure` (`RunMachine.start`, `MachineDriver.adopt`).
 *
 * When the scope closes (the agent stops) the consumer stops first, then every machine is ended
 * the same way and its run told `Fail{infrastructure, "the host agent stopped"}`.
 */
import type { Scope } from "effect"
import { Clock, Context, Effect, Either, Layer, Option, Schedule, Schema, Stream } from "effect"
import * as Mailbox from "../../core/actors/Mailbox.ts"
import { ActorSettings } from "../../core/actors/Settings.ts"
import { both } from "../../core/Concurrent.ts"
import * as Consumer from "../../core/Consumer.ts"
import * as Kv from "../../core/Kv.ts"
import type { NatsError } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import { Host as HostActorDef, HostMessage, type Place } from "../../schema/actors/Host.ts"
import { Run } from "../../schema/actors/Run.ts"
import { Scheduler, schedulerId } from "../../schema/actors/Scheduler.ts"
import { timestamp } from "../../schema/Common.ts"
import type { RunId } from "../../schema/Ids.ts"
import { endedRunStates, StoredRun } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import * as Bases from "../bases/Bases.ts"
import { BasesSettings } from "../bases/Bases.ts"
import { type Kept, MachineDriver } from "../machines/MachineDriver.ts"
import { Capacity } from "../registry/Capacity.ts"
import { Host } from "../registry/HostSettings.ts"
import * as RunMachine from "./RunMachine.ts"
import * as WarmPool from "./WarmPool.ts"

/** The host actor as running in this agent. */
export interface HostActorService {
  /** The runs whose machines this agent holds now. */
  readonly runs: Effect.Effect<ReadonlyArray<RunId>>
}

/** The Tag of the host actor. */
export class HostActor extends Context.Tag("host-agent/HostActor")<HostActor, HostActorService>() {}

/** The durable consumer's name: one per host. */
export const consumerName = (hostId: string) => `host-${hostId}`

const decode = Schema.decodeUnknownEither(Schema.parseJson(HostMessage))

/** What the host actor needs beyond what a run's machine needs. */
export type HostActorServices =
  | RunMachine.RunMachineServices
  | Context.Tag.Identifier<typeof ActorSettings.Tag>

/** Consumes the host's mailbox for the life of the scope. */
export const make: Effect.Effect<HostActorService, NatsError, Scope.Scope | HostActorServices> = Effect.gen(
  function* () {
    const services = yield* Effect.context<HostActorServices>()
    const scope = yield* Effect.scope
    const { names } = yield* Storage
    const host = yield* Host
    const capacity = yield* Capacity
    const mailbox = yield* Mailbox.Mailbox
    const actorSettings = yield* ActorSettings.Tag
    const runs = yield* Kv.make(names.kv.runs.name, StoredRun)
    const held = new Map<string, RunMachine.RunMachine>()
    // Runs this life reserved room for (and claimed a machine for) whose placement has not
    // finished (see `place`).
    const placing = new Set<string>()
    const stream = names.streams.MAILBOX.name
    const name = consumerName(host.id)
    const driver = yield* MachineDriver
    const basesDir = (yield* BasesSettings.Tag).dir

    // A placement of this life that will not finish (its run ended or went elsewhere, or this
    // agent stops): its room goes back and its claimed folder goes.
    const giveBack = (run: string) =>
      Effect.suspend(() =>
        placing.delete(run)
          ? Effect.zipRight(capacity.release(run), Effect.ignore(driver.destroy(run)))
          : Effect.void,
      )

    // Registered before the consumer, so it runs after the consumer has stopped.
    yield* Effect.addFinalizer(() =>
      Effect.zipRight(
        Effect.forEach([...placing], giveBack, { discard: true }),
        Effect.forEach(
          [...held.values()],
          (m) => m.end({ failure: "infrastructure", detail: "the host agent stopped" }),
          { concurrency: "unbounded", discard: true },
        ),
      ),
    )

    const freed = (run: string) =>
      Mailbox.send(
        Scheduler,
        schedulerId,
        { _tag: "Freed", run: run as RunId, host: host.id },
        { msgId: `${run}:freed` },
      )

    // Machines an earlier life of this agent left (it was killed outright, or its host rebooted),
    // each with what its folder kept (`MachineDriver.adopt`), when its run is still running here:
    // - kept once ready, and still running: taken over, the run goes on (`RunMachine.start`);
    // - only claimed (it died before the machine was ready, so no command reached it): what was
    //   made is removed and the run starts over on a new machine;
    // - claimed for a run not running here (ended, elsewhere, or its placement never finished, in
    //   which case its `Place` comes back): removed;
    // - anything else (a kept machine that died, a folder that kept nothing): removed, and its run
    //   failed at once rather than left `running` to its time-out.
    const runOf = (id: string, note: string) =>
      Effect.gen(function* () {
        const account = RunMachine.accountOfNote(note)
        if (Option.isNone(account)) return Option.none<StoredRun>()
        return Option.map(yield* runs.get(kvKeys.run(account.value, id)), (entry) => entry.value)
      })
    // `id` is the machine's; `runId` its run's (the same, but for a warm machine a run took).
    const takeOver = (id: string, runId: string, kept: Kept) =>
      Effect.gen(function* () {
        // Read again while the store does not answer (a blip must not cost a live machine its run).
        const run = Option.getOrUndefined(
          yield* runOf(runId, kept.note).pipe(
            Effect.retry({
              schedule: Schedule.exponential("100 millis").pipe(
                Schedule.either(Schedule.spaced("5 seconds")),
                Schedule.upTo("2 minutes"),
              ),
              while: (e) => e._tag === "NatsError",
            }),
          ),
        )
        if (run === undefined || run.state !== "running" || run.host !== host.id) return "not ours" as const
        const reserved = yield* capacity.reserve(run.id, run.size, run.id)
        if (Either.isLeft(reserved)) return "lost" as const
        if (kept.machine === undefined) {
          yield* driver.destroy(id)
          yield* driver.claim(id, host.id, kept.note)
        }
        held.set(run.id, yield* RunMachine.start(run, kept))
        yield* Effect.logWarning(
          kept.machine === undefined
            ? "run of an earlier life starts over on a new machine"
            : "machine of an earlier life adopted; its run goes on",
        ).pipe(Effect.annotateLogs({ run: runId }))
        return "taken" as const
      }).pipe(
        Effect.catchAll((e) =>
          Effect.as(
            Effect.logError("a machine of an earlier life could not be taken over", e),
            "lost" as const,
          ),
        ),
      )
    const removeEarlier = (id: string) =>
      driver
        .destroy(id)
        .pipe(
          Effect.catchAll((e) => Effect.logError("a machine of an earlier life was not fully removed", e)),
        )
    const earlier = yield* Effect.forEach(yield* driver.owned(host.id), (id) =>
      Effect.map(driver.adopt(id), (found) => ({ id, found: Option.getOrUndefined(found) })),
    )
    // Runs whose warm machine was kept: the folder their placement claimed is only a folder now.
    const onWarm = new Set(
      earlier.flatMap(({ id, found }) => {
        const run = found?.machine === undefined ? undefined : RunMachine.runOfNote(found.note)
        return run !== undefined && run !== id ? [run as string] : []
      }),
    )
    for (const { id, found } of earlier) {
      const runId = (found === undefined ? undefined : RunMachine.runOfNote(found.note)) ?? id
      // A warm machine no run kept (it waited in the pool), or the claim of a run on a kept warm
      // machine: nothing runs on it.
      if ((WarmPool.isWarm(id) && runId === id) || (runId === id && onWarm.has(id))) {
        yield* removeEarlier(id)
        continue
      }
      // The claim of a run kept on a warm machine that is gone: commands may have reached it.
      const lostWarm =
        found !== undefined && found.machine === undefined && RunMachine.warmOfNote(found.note) !== undefined
      const outcome = found === undefined || lostWarm ? ("lost" as const) : yield* takeOver(id, runId, found)
      if (outcome === "taken") continue
      if (!held.has(runId)) yield* capacity.release(runId)
      yield* removeEarlier(id)
      // The scheduler stops counting it here either way (an earlier life may have died before
      // saying so; `Freed` names this host, so it never touches a placement elsewhere).
      if (outcome === "not ours") {
        yield* freed(runId).pipe(
          Effect.catchAll((e) => Effect.logError("a removed machine was not reported", e)),
        )
        continue
      }
      yield* Mailbox.send(
        Run,
        runId as RunId,
        {
          _tag: "Fail",
          failure: "infrastructure",
          detail: "the host agent restarted and lost the run's machine",
          at: timestamp(yield* Clock.currentTimeMillis),
        },
        { msgId: `${runId}:fail:lost` },
      ).pipe(
        Effect.zipRight(freed(runId)),
        Effect.catchAll((e) => Effect.logError("the run of a removed machine could not be failed", e)),
      )
      yield* Effect.logWarning("machine of an earlier life removed; its run failed").pipe(
        Effect.annotateLogs({ run: runId }),
      )
    }

    const place = (message: Place, seq: number) =>
      Effect.gen(function* () {
        const found = yield* runs.get(kvKeys.run(message.account, message.run))
        if (Option.isNone(found)) return yield* Effect.logInfo("placement of an unknown run dropped")
        const run = found.value.value
        if (endedRunStates.has(run.state)) {
          // A placement this life began and the run ended meanwhile: its room goes back.
          yield* giveBack(run.id)
          return yield* Effect.logInfo("placement of an ended run dropped")
        }
        if (held.has(run.id)) return
        // Reserved by this life but not yet running here: a placement that failed midway (the bus
        // went away between its sends) and came back; it goes on from where it stopped.
        const ours = placing.has(run.id)
        // Running on another host (this one's placement lost to it): nothing of it is ours.
        if (run.state === "running" && run.host !== host.id) {
          return yield* giveBack(run.id)
        }
        if (run.state === "running" && !ours) {
          // An earlier life of this agent took it; its machine went with that process.
          yield* Mailbox.send(
            Run,
            run.id,
            {
              _tag: "Fail",
              failure: "infrastructure",
              detail: "the host agent restarted and lost the run's machine",
              at: timestamp(yield* Clock.currentTimeMillis),
            },
            { msgId: `${run.id}:fail:lost` },
          )
          yield* capacity.release(run.id)
          return yield* freed(run.id)
        }
        // The run's base is still being built here (the host's first start): the run goes back
        // to the queue and is offered again at the scheduler's next tick, until the base is done.
        if (!ours && (yield* Bases.building(basesDir)).some((b) => b.name === run.base)) {
          yield* Effect.logDebug("placement refused: its base is still building").pipe(
            Effect.annotateLogs({ base: run.base }),
          )
          return yield* Mailbox.send(
            Scheduler,
            schedulerId,
            { _tag: "Refused", run: run.id, host: host.id },
            { msgId: `${run.id}:refused:${seq}` },
          )
        }
        const reserved = ours
          ? Either.right(undefined)
          : yield* capacity.reserve(run.id, message.size, run.id)
        if (Either.isLeft(reserved)) {
          yield* Effect.logInfo("placement refused: no room").pipe(
            Effect.annotateLogs({
              field: reserved.left.field,
              needed: reserved.left.needed,
              free: reserved.left.free,
            }),
          )
          return yield* Mailbox.send(
            Scheduler,
            schedulerId,
            { _tag: "Refused", run: run.id, host: host.id },
            { msgId: `${run.id}:refused:${seq}` },
          )
        }
        placing.add(run.id)
        // Claimed before the run hears of it: a life that dies from here on leaves the machine's
        // folder for the next one to find (see above). A claim refused (the host's disk) offers
        // the run elsewhere.
        const claimed = yield* driver.claim(run.id, host.id, RunMachine.claimNote(run)).pipe(Effect.either)
        if (Either.isLeft(claimed)) {
          yield* Effect.logError("placement refused: the machine could not be claimed").pipe(
            Effect.annotateLogs({ detail: claimed.left.detail }),
          )
          yield* giveBack(run.id)
          return yield* Mailbox.send(
            Scheduler,
            schedulerId,
            { _tag: "Refused", run: run.id, host: host.id },
            { msgId: `${run.id}:refused:${seq}` },
          )
        }
        const at = timestamp(yield* Clock.currentTimeMillis)
        const sends = [
          Mailbox.send(Run, run.id, { _tag: "Started", host: host.id, at }, { msgId: `${run.id}:started` }),
          Mailbox.send(
            Scheduler,
            schedulerId,
            { _tag: "Placed", run: run.id, host: host.id },
            { msgId: `${run.id}:placed` },
          ),
        ] as const
        yield* both(...sends)
        const machine = yield* RunMachine.start(run)
        held.set(run.id, machine)
        placing.delete(run.id)
        yield* Effect.logInfo("run placed").pipe(Effect.annotateLogs({ size: message.size }))
      })

    const handle = (d: Consumer.Delivery) =>
      Effect.gen(function* () {
        const decoded = decode(new TextDecoder().decode(d.data))
        if (Either.isLeft(decoded)) {
          yield* Effect.logError("host message dropped: it does not decode").pipe(
            Effect.annotateLogs({ seq: d.seq, error: decoded.left.message }),
          )
          return d.ack()
        }
        const message = decoded.right
        const work = Effect.gen(function* () {
          switch (message._tag) {
            case "Place":
              return yield* place(message, d.seq)
            case "Stop": {
              const machine = held.get(message.run)
              // A placement of this life that had not finished: its room goes back.
              if (machine === undefined) yield* giveBack(message.run)
              if (machine === undefined) return yield* freed(message.run)
              yield* machine
                .end()
                .pipe(Effect.ensuring(Effect.sync(() => held.delete(message.run))), Effect.forkIn(scope))
              return
            }
            case "CancelCommand": {
              const machine = held.get(message.run)
              if (machine !== undefined)
                yield* Effect.forkIn(
                  Effect.interruptible(machine.cancel(message.command, message.sequence)),
                  scope,
                )
              return
            }
            case "Log": {
              const machine = held.get(message.run)
              if (machine !== undefined) yield* machine.log(message.kind, message.fields)
              return
            }
          }
        })
        yield* work.pipe(
          Effect.annotateLogs({ run: message.run, message: message._tag }),
          Effect.matchCauseEffect({
            onSuccess: () => Effect.sync(() => d.ack()),
            onFailure: (cause) =>
              Effect.logWarning("host message not handled; it comes back").pipe(
                Effect.annotateLogs({ seq: d.seq, cause: String(cause) }),
                Effect.zipRight(Effect.sync(() => d.nak(1_000))),
              ),
          }),
        )
      }).pipe(Effect.provide(services), Effect.uninterruptible)

    // The consumer is made again after a failure (the bus went away, the consumer was removed).
    yield* Effect.gen(function* () {
      yield* Consumer.create(stream, name, {
        filter: mailbox.subjectOf(HostActorDef, host.id),
        ackWaitMs: actorSettings.ackWaitMs,
        maxAckPending: 1,
      })
      yield* Stream.runForEach(yield* Consumer.consume(stream, name), handle)
    }).pipe(
      Effect.scoped,
      Effect.tapErrorCause((cause) =>
        Effect.logWarning("host mailbox consumer failed; starting it again").pipe(
          Effect.annotateLogs({ cause: String(cause) }),
        ),
      ),
      Effect.retry(Schedule.spaced("1 second")),
      Effect.forever,
      Effect.forkScoped,
    )
    yield* Effect.logInfo("host actor consuming").pipe(Effect.annotateLogs({ host: host.id }))

    return { runs: Effect.sync(() => [...held.keys()] as Array<RunId>) } satisfies HostActorService
  },
).pipe(Effect.annotateLogs({ role: "host-agent" }))

/** The host actor as a layer (closing it ends every machine). */
export const layer: Layer.Layer<HostActor, NatsError, HostActorServices> = Layer.scoped(HostActor, make)

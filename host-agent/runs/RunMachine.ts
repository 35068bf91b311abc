/**
 * One run's machine on this host, from creation to removal (issue 7's machine life cycle).
 *
 * Its life, in order: create the machine over the run's base (a base this host does not have is
 * an `infrastructure` failure), connect the guest session, unpack the input upload into
 * `/workspace/in` and check the input manifest (`input` failure), run the function's setup
 * commands with its environment (`setup` failure, the failing command's output in the detail),
 * tell the run actor `Ready`, then feed the run's commands to the machine's dispatcher.
 *
 * Commands come from KV `commands` (`<run>.*`, current values first, then changes): each record
 * seen `queued` for the first time is taken. Machine kinds go to the dispatcher, which starts them
 * in sequence order; as each starts its record becomes `running` (+`started_at`), and when it ends
 * the end state with result or error (+`ended_at`). Every write is compare-and-set on the revision
 * this machine last read or wrote: when the run actor got there first (it marks what is left
 * `cancelled` when the run ends), its record stands. `finish` is handled here, starting at its
 * turn: `failed` ends the run with `no_submission` at once; `succeeded` first waits until every
 * earlier command has ended, then checks the output manifest — problems are the command's result
 * and the run goes on; a match packs `/workspace/out` into the `outputs` store as `<run>` (sealed)
 * and the run succeeds. `terminal` starts at its turn and ends `succeeded` as soon as its session
 * waits for the caller (`TerminalSession.ts`). A caller's command that ends on a run with a webhook posts
 * `command.finished` (event id derived from the command id, so a retry is one event).
 *
 * A failure of the life tells the run actor (`Fail`) and leaves the machine for the `Stop` that
 * follows, so there is one way a machine goes away: `end`. It stops the life, cancels the commands
 * still running (their records end `cancelled`), writes the last log part while it closes the
 * guest session and destroys the machine, then gives its capacity back and tells the scheduler
 * `Freed`. `end` runs once; later calls wait for it.
 *
 * Once ready (setup done), the machine is kept for a later life of this host agent
 * (`MachineDriver.keep`): a host agent killed outright and started again takes it over (`start`
 * with `kept`) and the run goes on.
 *
 * Messages carry deterministic ids (`<run>:ready`, `<run>:succeed`, `<run>:fail:<why>`,
 * `<run>:freed`), so a message sent again is stored once.
 */
import {
  Cause,
  Clock,
  type Context,
  Data,
  Deferred,
  Duration,
  Effect,
  ExecutionStrategy,
  Exit,
  Fiber,
  Option,
  Redacted,
  Runtime,
  Schedule,
  Schema,
  Scope as ScopeOps,
} from "effect"
import * as Mailbox from "../../core/actors/Mailbox.ts"
import { both } from "../../core/Concurrent.ts"
import { Functions } from "../../core/Functions.ts"
import { derivedId } from "../../core/Ids.ts"
import * as Kv from "../../core/Kv.ts"
import { Links } from "../../core/Links.ts"
import { isNatsError, type Nats } from "../../core/Nats.ts"
import * as ObjectStore from "../../core/ObjectStore.ts"
import * as OperatorEvents from "../../core/OperatorEvents.ts"
import { Seal } from "../../core/Seal.ts"
import type { SealStream } from "../../core/SealStream.ts"
import { Secrets } from "../../core/Secrets.ts"
import { Storage } from "../../core/Storage.ts"
import { TerminalSettings } from "../../core/TerminalSettings.ts"
import { Run } from "../../schema/actors/Run.ts"
import { Scheduler, schedulerId } from "../../schema/actors/Scheduler.ts"
import { Webhook } from "../../schema/actors/Webhook.ts"
import {
  type CommandRecord,
  CommandRecord as CommandRecordSchema,
  type CommandResult,
  endedCommandStates,
} from "../../schema/Command.ts"
import { type Timestamp, timestamp } from "../../schema/Common.ts"
import { AccountId, type EventId, RunId } from "../../schema/Ids.ts"
import type { RunFailure, StoredRun } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import * as Bases from "../bases/Bases.ts"
import { BasesSettings } from "../bases/Bases.ts"
import * as Dispatcher from "../commands/Dispatcher.ts"
import type { CommandContext, Outcome } from "../commands/Executor.ts"
import { connect, type GuestSession } from "../guest/GuestSession.ts"
import * as Inputs from "../guest/Inputs.ts"
import * as Outputs from "../guest/Outputs.ts"
import * as Setup from "../guest/Setup.ts"
import { type Kept, type Machine, MachineDriver, newKeyPair } from "../machines/MachineDriver.ts"
import { Capacity } from "../registry/Capacity.ts"
import { Host } from "../registry/HostSettings.ts"
import * as RunLog from "./RunLog.ts"
import { RunSettings } from "./RunSettings.ts"
import * as TerminalSession from "./TerminalSession.ts"
import { WarmPool } from "./WarmPool.ts"

/** What a run's machine needs. */
export type RunMachineServices =
  | Nats
  | Storage
  | SealStream
  | Seal
  | Context.Tag.Identifier<typeof TerminalSettings.Tag>
  | WarmPool
  | Mailbox.Mailbox
  | MachineDriver
  | Capacity
  | Host
  | Functions
  | Secrets
  | Links
  | Context.Tag.Identifier<typeof RunSettings.Tag>
  | Context.Tag.Identifier<typeof BasesSettings.Tag>

/** Why a run fails, as sent to the run actor. */
export interface Failure {
  readonly failure: RunFailure
  readonly detail: string
}

/** One run's machine. */
export interface RunMachine {
  readonly run: StoredRun
  /** Cancels one of the run's commands (queued or running); an ended or unknown one is left alone. */
  readonly cancel: (command: string, sequence: number) => Effect.Effect<void>
  /** Adds a line to the run's log (from outside the machine: the agent's messages). */
  readonly log: (kind: string, fields: Readonly<Record<string, unknown>>) => Effect.Effect<void>
  /**
   * Ends the machine (see the module doc); with `failure`, first tells the run actor it failed.
   * Runs once; a second call waits for the first.
   */
  readonly end: (failure?: Failure) => Effect.Effect<void>
  /** Completes once the machine has ended. */
  readonly ended: Effect.Effect<void>
}

// A failure of the life that the run actor hears about.
class LifeFailed extends Schema.TaggedError<LifeFailed>()("LifeFailed", {
  failure: Schema.String,
  detail: Schema.String,
}) {}
const lifeFailed = (failure: RunFailure, detail: string) => new LifeFailed({ failure, detail })

/** How the life takes a command the watch brought (given once the machine is ready). */
type Take = (
  record: CommandRecord,
  revision: number,
) => Effect.Effect<void, never, Nats | Storage | SealStream | Mailbox.Mailbox>

// A command the watch delivered and the life could not take (kept apart from the watch's own
// failures, which are retried: its error is not a `cause`, so it is never taken for NATS's).
class Untaken extends Data.TaggedError("Untaken")<{ readonly error: { readonly _tag: string } }> {}

// The error text of a tagged error, for details and command errors.
const describe = (e: { readonly _tag: string }): string => {
  const { detail, message } = e as { readonly detail?: unknown; readonly message?: unknown }
  return `${e._tag}: ${String(detail ?? message ?? "")}`
}

/**
 * The log parts stored for `run`: its record's count, and any stored since that the run actor has
 * not counted yet (an earlier life may have died between storing a part and the count's message).
 */
const logPartsOf = (run: StoredRun) =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const logs = yield* ObjectStore.make(names.objects.logs.name)
    let n = run.log_parts
    while (Option.isSome(yield* logs.info(kvKeys.logPart(run.id, n + 1)))) n++
    return n
  }).pipe(
    Effect.retry(Schedule.exponential("100 millis").pipe(Schedule.upTo("1 minute"))),
    Effect.orElseSucceed(() => run.log_parts),
  )

/** A command this machine took, and what it last wrote for it. */
interface Tracked {
  record: CommandRecord
  revision: number
  /** Set once its end state is written (by this machine or found written by the run actor). */
  done: boolean
  /** The fiber that writes its end (dispatched kinds) or handles it (`finish`). */
  fiber?: Fiber.RuntimeFiber<void>
  /** Set at the start: fires after `runningAfterMs` to write `running`; the end clears it. */
  markTimer?: ReturnType<typeof setTimeout>
  /** The fiber writing `running` once the timer fired; the end waits for it. */
  marking?: Fiber.RuntimeFiber<void>
  /** When the machine started it (its `started_at`, whether or not `running` was written). */
  startedAt?: Timestamp
  /** Dispatched through the dispatcher (cancel there), or handled here (interrupt the fiber). */
  dispatched: boolean
  lock: Effect.Semaphore
}

/**
 * The note a machine's folder keeps for a later life of this host agent: its run's account from
 * the claim (`MachineDriver.claim`, before the machine is made), and once the machine is ready
 * (`MachineDriver.keep`) the key the host agent logs in with, sealed for that account, and the run
 * (a warm machine's id is not its run's).
 */
const MachineNote = Schema.parseJson(
  Schema.Struct({
    account: AccountId,
    key: Schema.optional(Schema.String),
    run: Schema.optional(RunId),
    /** In a run's claimed folder: the warm machine the run was kept on (its own folder holds it). */
    warm: Schema.optional(Schema.String),
  }),
)
const decodeNote = Schema.decodeUnknownOption(MachineNote)
const keyAad = (run: string) => `machine-key:${run}`

/**
 * Keeps `machine` for a later life of this host agent, with the key it logs in with sealed for the
 * run's account. A warm machine (whose id is not the run's) is named in the run's claimed folder
 * too, so a later life that finds the run's claim and not its machine (it died meanwhile) knows
 * commands may have reached it and fails the run instead of starting it over.
 */
export const keep = (machine: Machine, run: StoredRun, clientKey: string, host?: string) =>
  Effect.gen(function* () {
    const sealed = yield* (yield* Seal).seal(run.account, keyAad(run.id), new TextEncoder().encode(clientKey))
    const note = Schema.encodeSync(MachineNote)({
      account: run.account,
      key: Buffer.from(sealed).toString("base64"),
      run: run.id,
    })
    const driver = yield* MachineDriver
    // Not cut off midway: an interrupted file write would go on in the background, and could put
    // the file back into a folder the machine's end is removing.
    yield* Effect.uninterruptible(driver.keep(machine, note))
    if (machine.id !== run.id && host !== undefined)
      yield* Effect.uninterruptible(
        driver.claim(
          run.id,
          host,
          Schema.encodeSync(MachineNote)({ account: run.account, run: run.id, warm: machine.id }),
        ),
      )
  })

/** The note `MachineDriver.claim` keeps for `run`'s machine. */
export const claimNote = (run: StoredRun): string => Schema.encodeSync(MachineNote)({ account: run.account })

/** The account of the run a claimed or kept machine served, read from its note. */
export const accountOfNote = (note: string): Option.Option<AccountId> =>
  Option.map(decodeNote(note), (n) => n.account)

/** The run a kept machine serves, when its note names it (a kept warm machine's does). */
export const runOfNote = (note: string): RunId | undefined => Option.getOrUndefined(decodeNote(note))?.run

/** The warm machine a run's claimed folder says the run was kept on. */
export const warmOfNote = (note: string): string | undefined => Option.getOrUndefined(decodeNote(note))?.warm

/** The error of a command an earlier life of the host agent had taken and a later one adopted. */
export const RESTARTED_ERROR =
  "the host agent restarted while this command was queued or running; it was not run again (it may have run in part)"

/**
 * Starts the machine of `run`, whose capacity the caller has reserved under the run's id. The life
 * runs in its own fibers; the returned machine is ended with `end`.
 *
 * `earlier` is what an earlier life of this host agent left of the run's machine
 * (`MachineDriver.adopt`), and the log goes on after the parts that life stored. With a machine
 * (kept once it was ready, still running), the life connects to it again instead of making one,
 * kills what the earlier life's commands left running, ends every command not yet ended with
 * `RESTARTED_ERROR`, and goes on with the commands that come after. Without one (claimed, never
 * ready: no command reached it; the caller has removed what was made of it), the life starts over
 * on a new machine.
 */
export const start = (run: StoredRun, earlier?: Kept): Effect.Effect<RunMachine, never, RunMachineServices> =>
  Effect.gen(function* () {
    const services = yield* Effect.context<RunMachineServices>()
    const { names } = yield* Storage
    const settings = yield* RunSettings.Tag
    const host = yield* Host
    const capacity = yield* Capacity
    const links = yield* Links
    const seal = yield* Seal
    const terminalSettings = yield* TerminalSettings.Tag
    const scope = yield* ScopeOps.make()
    // The machine's claim (`MachineDriver.claim`, by the host actor) goes with a life that ends
    // before a machine took it over; once one has, its own finalizer removes it all. Registered
    // first, before the life can be stopped (a stop while it read the function version had left
    // the claim), so it runs last, after the machine's own.
    let made = false
    const claims = yield* MachineDriver
    yield* ScopeOps.addFinalizer(
      scope,
      Effect.suspend(() => (made ? Effect.void : Effect.ignore(claims.destroy(run.id)))),
    )
    // Terminal sessions live here: closed before the machine's last log line, so theirs are in it.
    const terminals = yield* ScopeOps.fork(scope, ExecutionStrategy.sequential)
    const done = yield* Deferred.make<void>()
    const dispatcherReady = yield* Deferred.make<Dispatcher.Dispatcher>()
    const log = yield* RunLog.make({
      run: run.id,
      account: run.account,
      flushMs: settings.logFlushMs,
      stored: earlier === undefined ? 0 : yield* logPartsOf(run),
    }).pipe(ScopeOps.extend(scope))
    const tracked = new Map<string, Tracked>()
    // Revisions of the records this machine wrote: the watch brings them back, and they are passed
    // over undecoded (each command's end would otherwise be read back once). The watch goes in
    // revision order, so a write it already passed (its delivery beat the acknowledgement) is not
    // kept.
    const ownWrites = new Set<number>()
    let watched = 0
    // Revisions the fast feed took before the watch brought them, and the records' keys taken by
    // either (see `hastenCommands`).
    const hastened = new Set<number>()
    const takenKeys = new Set<string>()
    const runFork = Runtime.runFork(yield* Effect.runtime<never>())
    // The machine is going away: no `running` is written any more.
    let closing = false
    yield* ScopeOps.addFinalizer(
      scope,
      Effect.sync(() => {
        closing = true
        for (const t of tracked.values()) clearTimeout(t.markTimer)
      }),
    )
    const feedLock = yield* Effect.makeSemaphore(1)
    let finished = false
    let ending = false
    const runId = run.id
    const now = Effect.map(Clock.currentTimeMillis, timestamp)

    // What the host agent tells about a run or a command is retried until NATS takes it (every
    // message and record write is idempotent: message ids, revisions), so an outage of NATS, even
    // a long one, loses no end: 0.1 s doubling to one try every 5 s, for up to 10 minutes. A
    // failure NATS caused (the keyring's store, met by a seal) is retried the same way.
    const untilTaken = Schedule.exponential("100 millis").pipe(
      Schedule.either(Schedule.spaced("5 seconds")),
      Schedule.upTo("10 minutes"),
    )
    /** Tries again while NATS does not take the call (a restart of nats-server), up to 10 minutes. */
    const whileStoreAway = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
      Effect.retry(effect, {
        schedule: untilTaken,
        while: isNatsError,
      })
    const send = <E, R>(what: string, effect: Effect.Effect<void, E, R>) =>
      effect.pipe(
        whileStoreAway,
        Effect.catchAllCause((cause) =>
          Effect.logError(`could not tell ${what}`).pipe(
            Effect.annotateLogs({ run: runId, cause: Cause.pretty(cause) }),
          ),
        ),
      )
    const fail = (failure: RunFailure, detail: string, key: string, message?: string) =>
      Effect.flatMap(now, (at) =>
        send(
          "the run actor it failed",
          Mailbox.send(
            Run,
            runId,
            { _tag: "Fail", failure, detail, at, ...(message === undefined ? {} : { message }) },
            { msgId: `${runId}:fail:${key}` },
          ),
        ),
      )

    // ----- command records

    const commands = yield* Kv.make(names.kv.commands.name, CommandRecordSchema).pipe(Effect.orDie)
    const keyOf = (r: CommandRecord) => kvKeys.command(runId, r.sequence)

    // The ids of the run's commands not ended now.
    const unendedCommands = Effect.gen(function* () {
      const ids = new Set<string>()
      for (const key of yield* commands.keys(kvKeys.commandsOf(runId))) {
        const entry = yield* commands.get(key)
        if (Option.isSome(entry) && !endedCommandStates.has(entry.value.value.state))
          ids.add(entry.value.value.id)
      }
      return ids
    }).pipe(
      whileStoreAway,
      Effect.mapError((e) => lifeFailed("infrastructure", `reading the run's commands: ${describe(e)}`)),
    )

    // Writes `next` over the revision last seen; false when the run actor ended the record first.
    const writeRecord = (t: Tracked, next: CommandRecord): Effect.Effect<boolean> =>
      Effect.gen(function* () {
        for (let attempt = 0; attempt < 5; attempt++) {
          const written = yield* commands.update(keyOf(next), next, t.revision).pipe(
            Effect.map(Option.some),
            Effect.catchTag("StateConflict", () => Effect.succeed(Option.none<number>())),
          )
          if (Option.isSome(written)) {
            // This write ended it: operators hear of it (the record stays the truth).
            if (!endedCommandStates.has(t.record.state))
              yield* OperatorEvents.publishAfterWrite(
                OperatorEvents.commandEnded(run.account, next, next.ended_at ?? ""),
              ).pipe(Effect.provide(services))
            t.revision = written.value
            t.record = next
            if (written.value > watched) ownWrites.add(written.value)
            return true
          }
          const current = yield* commands.get(keyOf(next))
          if (Option.isNone(current) || endedCommandStates.has(current.value.value.state)) {
            t.done = true
            return false
          }
          t.revision = current.value.revision
        }
        return false
      }).pipe(
        whileStoreAway,
        Effect.catchAll((e) =>
          Effect.as(
            Effect.logWarning("command record not written").pipe(
              Effect.annotateLogs({ run: runId, command: next.id, error: e._tag, message: e.message }),
            ),
            false,
          ),
        ),
        t.lock.withPermits(1),
      )

    const markRunning = (t: Tracked) =>
      Effect.gen(function* () {
        if (t.done || t.record.state !== "queued") return
        const startedAt = t.startedAt ?? (yield* now)
        yield* writeRecord(t, { ...t.record, state: "running", started_at: startedAt } as CommandRecord)
      })

    const commandFinished = (record: CommandRecord) =>
      Effect.gen(function* () {
        if (record.source !== "caller" || run.webhook === undefined) return
        const event = derivedId("evt", record.id) as EventId
        const body = JSON.stringify({
          id: event,
          type: "command.finished",
          created: record.ended_at ?? (yield* now),
          data: { run: runId, command: Schema.encodeSync(CommandRecordSchema)(record) },
        })
        yield* send(
          "the webhook of a finished command",
          Mailbox.send(
            Webhook,
            event,
            {
              _tag: "Deliver",
              event,
              account: run.account,
              run: runId,
              url: run.webhook,
              type: "command.finished",
              body,
            },
            { msgId: event },
          ),
        )
      })

    // Writes the end state; the webhook and the log follow when this machine wrote it. Not cut
    // midway: a record ended here always has its log line and webhook.
    const finishRecord = (t: Tracked, outcome: Outcome) =>
      Effect.gen(function* () {
        // Still waiting to write `running`: it never will; already writing: that write comes first.
        clearTimeout(t.markTimer)
        if (t.marking) yield* Fiber.await(t.marking)
        if (t.done) return
        const at = yield* now
        const base = { ...t.record, ended_at: at }
        const started = base.started_at ?? t.startedAt ?? at
        const next = (
          outcome.state === "succeeded"
            ? { ...base, state: "succeeded", result: outcome.result, started_at: started }
            : outcome.state === "failed"
              ? { ...base, state: "failed", error: outcome.error }
              : { ...base, state: "cancelled" }
        ) as CommandRecord
        const wrote = yield* writeRecord(t, next)
        t.done = true
        if (!wrote) return
        if (next.source === "agent" && next.kind !== "finish")
          yield* log.append("tool_call", {
            command: next.id,
            name: next.kind,
            arguments: next.arguments,
            state: next.state,
            ...(next.result === undefined ? {} : { result: next.result }),
            ...(next.error === undefined ? {} : { error: next.error }),
          })
        yield* commandFinished(next)
      }).pipe(Effect.uninterruptible)

    // ----- the life

    // The run's commands as they change, each handed to `take` once it is given. The watch goes
    // on through an outage of NATS: opened again one past the last change it delivered (every
    // change before that one was handled whole). A command it could not take fails the life
    // (`Untaken`: not retried, its change would not come again).
    const watchCommands = (taking: Deferred.Deferred<Take>) =>
      Effect.suspend(() =>
        commands.watchEach(
          kvKeys.commandsOf(runId),
          {
            ...(watched > 0 ? { fromRevision: watched + 1 } : {}),
            skip: (_key, revision) => {
              watched = revision
              return ownWrites.delete(revision) || hastened.delete(revision)
            },
          },
          (change) =>
            change._tag === "Put"
              ? Effect.flatMap(Deferred.await(taking), (take) =>
                  feedLock
                    .withPermits(1)(
                      Effect.suspend(() => {
                        takenKeys.add(change.key)
                        return take(change.value, change.revision)
                      }),
                    )
                    .pipe(Effect.mapError((error) => new Untaken({ error }))),
                )
              : Effect.void,
        ),
      ).pipe(
        whileStoreAway,
        Effect.mapError((e) =>
          lifeFailed(
            "infrastructure",
            `watching the run's commands: ${describe(e instanceof Untaken ? e.error : e)}`,
          ),
        ),
      )

    // The same changes as the stream stores them (`Kv.writesEach`): they come with the write's
    // acknowledgement, about 0.8 ms before the watch's consumer delivers them, so a new command
    // reaches the machine sooner. Only a record first seen here is handed on; the watch stays the
    // complete, ordered source (this feed misses what is written while the connection is away),
    // and passes over what was taken here. Should this feed fail, the watch goes on alone.
    const hastenCommands = (taking: Deferred.Deferred<Take>) => {
      const fresh = (key: string, revision: number) => revision > watched && !takenKeys.has(key)
      return commands
        .writesEach(kvKeys.commandsOf(runId), { skip: (key, revision) => !fresh(key, revision) }, (change) =>
          change._tag === "Put"
            ? Effect.flatMap(Deferred.await(taking), (take) =>
                feedLock.withPermits(1)(
                  Effect.suspend(() => {
                    if (!fresh(change.key, change.revision)) return Effect.void
                    takenKeys.add(change.key)
                    hastened.add(change.revision)
                    return take(change.value, change.revision)
                  }),
                ),
              )
            : Effect.void,
        )
        .pipe(
          Effect.catchAll((e) =>
            Effect.logWarning("the fast feed of commands stopped; the watch goes on").pipe(
              Effect.annotateLogs({ run: runId, error: describe(e) }),
            ),
          ),
        )
    }

    const life = (handOver: (d: Dispatcher.Dispatcher) => Effect.Effect<void>) =>
      Effect.gen(function* () {
        // The commands' watch is opened now, beside the machine's way to ready (the server takes
        // 5–10 ms to make its consumer); each change it brings waits there for `take`, which is
        // given once the run actor was told the machine is ready.
        const taking = yield* Deferred.make<Take>()
        const watching = yield* Effect.fork(watchCommands(taking))
        yield* Effect.fork(hastenCommands(taking))
        const functions = yield* Functions
        const driver = yield* MachineDriver
        const secrets = yield* Secrets
        const basesDir = (yield* BasesSettings.Tag).dir
        const readVersion = functions.version(run.function, run.version).pipe(
          // Read again while the store is away (a restart of nats-server), not failed at once.
          whileStoreAway,
          Effect.mapError((e) =>
            lifeFailed("infrastructure", `reading the function version: ${describe(e)}`),
          ),
          Effect.flatMap(
            Option.match({
              onNone: () =>
                Effect.fail(
                  lifeFailed(
                    "infrastructure",
                    `version ${run.version} of function ${run.function} is missing`,
                  ),
                ),
              onSome: Effect.succeed,
            }),
          ),
        )
        const openFiles = ObjectStore.make(names.objects.files.name).pipe(whileStoreAway)
        const [version, files] = yield* both(readVersion, openFiles)
        // The machine goes when the life's scope closes, made here or adopted. `made` is set inside
        // the acquisition (which is not interrupted once begun) once the machine is there, so an
        // interruption before it, or a create that failed, leaves the claim to its own finalizer.
        const owning = (making: Effect.Effect<Machine, LifeFailed>) =>
          Effect.acquireRelease(
            // Only a machine that was made is this finalizer's; a create that failed removed what
            // it made, and the claim's own finalizer removes the folder.
            Effect.tap(making, () =>
              Effect.sync(() => {
                made = true
              }),
            ),
            (m) =>
              driver
                .destroy(m.id)
                .pipe(
                  Effect.catchAll((e) =>
                    Effect.logError("machine not fully removed").pipe(
                      Effect.annotateLogs({ run: runId, detail: e.detail }),
                    ),
                  ),
                ),
          ).pipe(ScopeOps.extend(scope))
        const connected = (machine: Machine, privateKey: string, what: string) =>
          connect({ ...machine.ssh, privateKey }).pipe(
            ScopeOps.extend(scope),
            Effect.mapError((e) => lifeFailed("infrastructure", `${what}: ${e.detail}`)),
          )

        const kept = earlier?.machine
        let machine: Machine
        let guest: GuestSession
        let clientKey: string
        // A warm machine of the run's base and size, when the pool has one ready (`WarmPool.ts`).
        const pool = yield* WarmPool
        const warm = kept === undefined ? yield* pool.take(run.base, run.size) : Option.none()
        if (Option.isSome(warm)) {
          // Its id is not the run's: the claim's finalizer removes the run's claimed folder, and
          // this one the machine (after its session, closed first).
          machine = yield* Effect.acquireRelease(Effect.succeed(warm.value.machine), (m) =>
            driver
              .destroy(m.id)
              .pipe(
                Effect.catchAll((e) =>
                  Effect.logError("machine not fully removed").pipe(
                    Effect.annotateLogs({ run: runId, machine: m.id, detail: e.detail }),
                  ),
                ),
              ),
          ).pipe(ScopeOps.extend(scope))
          yield* ScopeOps.addFinalizer(scope, warm.value.close)
          clientKey = warm.value.clientKey
          guest = warm.value.guest
          yield* log.append("machine", { size: run.size, base: run.base, host: host.id, warm: true })
        } else if (kept === undefined) {
          const base = (yield* Bases.list(basesDir)).find((b) => b.name === run.base)
          if (base === undefined)
            return yield* lifeFailed("infrastructure", `the base ${run.base} is not on this host`)
          const keys = { client: newKeyPair(), host: newKeyPair() }
          clientKey = keys.client.private
          const making = driver.create({
            id: runId,
            size: run.size,
            base: base.rootfs,
            authorizedKey: keys.client.public,
            hostKey: keys.host.private,
            owner: host.id,
          })
          machine = yield* owning(
            making.pipe(
              // The host's disk promised to warm machines: they yield, and it is made again.
              Effect.catchIf(
                (e) => e.step === "disk room",
                (e) => Effect.flatMap(pool.yieldAll, (n) => (n > 0 ? making : Effect.fail(e))),
              ),
              Effect.mapError((e) =>
                lifeFailed("infrastructure", `creating the machine failed at ${e.step}: ${e.detail}`),
              ),
            ),
          )
          yield* log.append("machine", {
            size: run.size,
            base: run.base,
            host: host.id,
            // An earlier life of the host agent died before this run's machine was ready.
            ...(earlier === undefined ? {} : { started_over: true }),
          })
          guest = yield* connected(machine, clientKey, "connecting to the machine")
        } else {
          machine = yield* owning(Effect.succeed(kept))
          const note = Option.getOrUndefined(decodeNote(earlier?.note))
          if (note?.key === undefined || note.account !== run.account)
            return yield* lifeFailed(
              "infrastructure",
              "the host agent restarted; the machine's note does not read",
            )
          clientKey = new TextDecoder().decode(
            yield* seal.open(run.account, keyAad(runId), Buffer.from(note.key, "base64")).pipe(
              whileStoreAway,
              Effect.mapError((e) =>
                lifeFailed(
                  "infrastructure",
                  `the host agent restarted; opening the machine's key: ${describe(e)}`,
                ),
              ),
            ),
          )
          // What the earlier life's commands left running is ended as the session opens, before
          // it opens a command wrapper of its own (which the clearing would kill too).
          guest = yield* connect({ ...machine.ssh, privateKey: clientKey }, { clearLeftovers: true }).pipe(
            ScopeOps.extend(scope),
            Effect.timeoutFail({
              duration: Duration.seconds(40),
              onTimeout: () =>
                lifeFailed(
                  "infrastructure",
                  "the host agent restarted; the machine did not answer or its earlier commands did not end",
                ),
            }),
            Effect.mapError((e) =>
              e instanceof LifeFailed
                ? e
                : lifeFailed(
                    "infrastructure",
                    `the host agent restarted; reconnecting to the machine and ending its earlier commands: ${e.detail}`,
                  ),
            ),
          )
          yield* log.append("adopted", { host: host.id })
        }

        // Input.
        const inputFailure = (e: { readonly _tag: string }) =>
          e instanceof Inputs.InputFailed
            ? lifeFailed("input", e.detail)
            : lifeFailed("infrastructure", `unpacking the input: ${describe(e)}`)
        if (kept === undefined && run.input !== undefined) {
          const unpacked = yield* Inputs.unpack(
            guest,
            { store: files, account: run.account, name: run.input },
            { diskBytes: machine.limits.diskBytes },
          ).pipe(
            // Again while NATS does not answer: a failed unpack removed what it had unpacked.
            whileStoreAway,
            Effect.tapError((e) => log.append("input", { upload: run.input, error: describe(e) })),
            Effect.mapError(inputFailure),
          )
          yield* log.append("input", { upload: run.input, ...unpacked })
        }
        if (kept === undefined && version.input_manifest.length > 0)
          yield* Inputs.checkManifest(guest, version.input_manifest).pipe(
            Effect.tapError((e) => log.append("input", { error: describe(e) })),
            Effect.mapError(inputFailure),
          )

        // The environment: plain values, and secrets opened for the account.
        const env: Record<string, string> = {}
        for (const v of version.environment) {
          if ("value" in v) env[v.name] = v.value
          else {
            const opened = yield* secrets.open(run.account, v.secret_id).pipe(
              whileStoreAway,
              Effect.mapError((e) =>
                lifeFailed("infrastructure", `opening the secret of ${v.name}: ${describe(e)}`),
              ),
            )
            if (Option.isNone(opened))
              return yield* lifeFailed("setup", `the secret of environment variable ${v.name} is missing`)
            env[v.name] = Redacted.value(opened.value)
          }
        }

        if (kept === undefined) {
          // Setup.
          const setup = yield* Setup.run(guest, version.setup, { env }).pipe(
            Effect.mapError((e) => lifeFailed("infrastructure", `setup could not run: ${describe(e)}`)),
          )
          for (const step of setup.steps) yield* log.append("setup", { ...step })
          const setupFailure = Setup.failureDetail(setup)
          if (setupFailure !== undefined) return yield* lifeFailed("setup", setupFailure)

          // Ready: from here a later life of this host agent takes the machine over. Kept before
          // `Ready` is sent, so a machine not kept is one no command has reached (a later life
          // starts it over); one that cannot be kept fails the run rather than break that.
          yield* keep(machine, run, clientKey, host.id).pipe(
            whileStoreAway,
            Effect.mapError((e) =>
              lifeFailed("infrastructure", `keeping the machine for the host agent: ${describe(e)}`),
            ),
          )
        }
        // Sent again by an adopting life (the id keeps it once): the earlier one may have died
        // between keeping the machine and sending it.
        const sendReady = send(
          "the run actor it is ready",
          Effect.flatMap(now, (at) =>
            Mailbox.send(Run, runId, { _tag: "Ready", at }, { msgId: `${runId}:ready` }),
          ),
        )
        // The commands do not wait for it (2–5 ms on a busy host): what a later life needs was
        // kept above, and the run actor learns of their ends from their records. `send` fails
        // nothing; the message goes on a fiber of the life's. It is published long before a
        // command can end; should a store outage delay it past a `finish`, the run actor takes a
        // `Ready` of an ended run as nothing.
        yield* Effect.fork(sendReady)
        const outputs = yield* ObjectStore.make(names.objects.outputs.name).pipe(whileStoreAway)
        if (kept === undefined) yield* log.append("ready")

        // Commands.
        const context: CommandContext = {
          account: run.account,
          env,
          files,
          signDownload: (object, as) =>
            Effect.sync(() =>
              links.download({
                store: "files",
                object: object.name,
                account: run.account,
                filename: as.filename,
              }),
            ),
        }
        const dispatcher = yield* Dispatcher.make({
          guest,
          context,
          // `running` is written only for a command that is still working `runningAfterMs` after
          // its start (a short one costs one write, its end); the end interrupts the wait.
          onStart: (record) => {
            const t = tracked.get(record.id)
            if (t === undefined) return Effect.void
            // A plain timer: most commands end before it fires, and a fiber each would cost more.
            return Effect.map(now, (at) => {
              t.startedAt = at
              t.markTimer = setTimeout(() => {
                t.markTimer = undefined
                if (!t.done && !closing) t.marking = runFork(Effect.uninterruptible(markRunning(t)))
              }, settings.runningAfterMs)
            })
          },
        }).pipe(ScopeOps.extend(scope))
        yield* handOver(dispatcher)

        // The run's end once a `finish` was accepted: failed (`no_submission`), or the output packed
        // into the `outputs` store and the run told it succeeded.
        const finishFailed = (detail: string | undefined) =>
          fail(
            "no_submission",
            `finished as failed${detail === undefined ? "" : `: ${detail}`}`,
            "finish",
            detail,
          )
        // With the listing of the check just made, when there was one.
        const packOutput = (listing?: Outputs.OutputListing) =>
          Outputs.pack(
            guest,
            { store: outputs, account: run.account, name: runId },
            listing === undefined ? {} : { listing },
          ).pipe(
            // Packed again (into the same object) while the store is away; the guest's files stay.
            whileStoreAway,
          )
        const succeed = (packed: Outputs.PackedOutput, detail: string | undefined) =>
          Effect.flatMap(now, (at) =>
            send(
              "the run actor it succeeded",
              Mailbox.send(
                Run,
                runId,
                {
                  _tag: "Succeed",
                  output: {
                    sha256: packed.sha256,
                    bytes: packed.bytes,
                    file_count: packed.file_count,
                    files: packed.files,
                    object: runId,
                  },
                  ...(detail === undefined ? {} : { message: detail }),
                  at,
                },
                { msgId: `${runId}:succeed` },
              ),
            ),
          )
        // A `finish` an earlier life of the host agent accepted and ended, dying before the run
        // heard the end (the record is written first): the end is told again. The output is packed
        // again from the same files (no command ran after the finish).
        const finishAgain = (record: CommandRecord) =>
          Effect.gen(function* () {
            if (record.kind !== "finish") return
            const args = record.arguments
            if (args.state === "failed") return yield* finishFailed(args.detail)
            const packed = yield* packOutput().pipe(
              Effect.tapError((e) =>
                fail("infrastructure", `packing the output failed: ${describe(e)}`, "pack"),
              ),
            )
            yield* succeed(packed, args.detail)
          }).pipe(Effect.ignore)

        // A terminal starts at its turn; its command ends as soon as the session is there to join
        // (its result says where), and the session goes on until the shell exits or the run ends.
        const openTerminal = (t: Tracked) =>
          Effect.gen(function* () {
            const record = t.record
            if (record.kind !== "terminal") return
            yield* dispatcher.turn(record.sequence)
            const opened = yield* TerminalSession.open(
              { guest, env, settings: terminalSettings, log: log.append, scope: terminals },
              { command: record.id, ...record.arguments },
            ).pipe(Effect.either)
            yield* finishRecord(
              t,
              opened._tag === "Right"
                ? { state: "succeeded", result: opened.right as CommandResult }
                : {
                    state: "failed",
                    error:
                      "field" in opened.left
                        ? `${opened.left.field}: ${opened.left.detail}`
                        : `the terminal could not be opened: ${describe(opened.left)}`,
                  },
            )
          })

        const handleFinish = (t: Tracked) =>
          Effect.gen(function* () {
            const record = t.record
            if (record.kind !== "finish") return
            yield* dispatcher.turn(record.sequence)
            yield* markRunning(t)
            const args = record.arguments
            // Every earlier command has started; an output is judged once they have all ended, or
            // after `finishWaitMs` at the latest, so `[bash writing out/…, finish]` sent together
            // sees what the bash wrote while a long command cannot hold the run. Giving up
            // (`failed`) judges nothing and does not wait. Either way the run's end cancels what
            // still runs (command rule 6).
            const before = [...tracked.values()].filter((o) => o.record.sequence < record.sequence)
            if (args.state === "succeeded")
              yield* Effect.forEach(
                before,
                (o) => (o.fiber === undefined ? Effect.void : Fiber.await(o.fiber)),
                {
                  discard: true,
                },
              ).pipe(Effect.timeoutOption(Duration.millis(settings.finishWaitMs)))
            const stillRunning = before.filter((o) => !o.done).map((o) => o.record.id)
            if (finished)
              return yield* finishRecord(t, { state: "failed", error: "the run has already finished" })
            if (args.state === "failed") {
              finished = true
              yield* finishRecord(t, { state: "succeeded", result: { accepted: true } })
              yield* log.append("finish", {
                command: record.id,
                state: "failed",
                detail: args.detail ?? null,
              })
              return yield* finishFailed(args.detail)
            }
            // The manifest is checked and the folder listed in one pass; the archive follows.
            const { problems, listing } = yield* Outputs.inspect(guest, version.output_manifest)
            if (problems.length > 0) {
              const list = problems.map((p) => p.detail)
              yield* log.append("finish", {
                command: record.id,
                state: "succeeded",
                accepted: false,
                problems: list,
                ...(stillRunning.length > 0 ? { still_running: stillRunning } : {}),
              })
              return yield* finishRecord(t, {
                state: "succeeded",
                result: { accepted: false, problems: list } as CommandResult,
              })
            }
            finished = true
            const packed = yield* packOutput(listing).pipe(
              Effect.tapError((e) =>
                Effect.zipRight(
                  finishRecord(t, { state: "failed", error: `packing the output failed: ${describe(e)}` }),
                  fail("infrastructure", `packing the output failed: ${describe(e)}`, "pack"),
                ),
              ),
            )
            yield* finishRecord(t, { state: "succeeded", result: { accepted: true } })
            yield* log.append("finish", {
              command: record.id,
              state: "succeeded",
              accepted: true,
              ...(stillRunning.length > 0 ? { still_running: stillRunning } : {}),
              sha256: packed.sha256,
              bytes: packed.bytes,
              file_count: packed.file_count,
            })
            yield* succeed(packed, args.detail)
          }).pipe(
            Effect.catchAll((e) =>
              finishRecord(t, { state: "failed", error: `the machine is unavailable: ${describe(e)}` }),
            ),
          )

        // Adopted: the commands not ended when this life began were the earlier life's (or came
        // while no life was there to take them). Whether they ran, or how far, is not known; none
        // runs again, each ends failed (but see `finish` below).
        const unendedAtStart = kept === undefined ? new Set<string>() : yield* unendedCommands

        const take = (record: CommandRecord, revision: number) =>
          Effect.gen(function* () {
            if (tracked.has(record.id)) return
            const t: Tracked = {
              record,
              revision,
              done: false,
              dispatched: false,
              lock: yield* Effect.makeSemaphore(1),
            }
            tracked.set(record.id, t)
            // A `finish` is the exception: judging the output and packing it again is harmless, so
            // it runs again here (as if it came now) and the run still ends.
            const again = unendedAtStart.delete(record.id) && !endedCommandStates.has(record.state)
            if (again && record.kind !== "finish") {
              yield* dispatcher.skip(record.sequence)
              return yield* finishRecord(t, { state: "failed", error: RESTARTED_ERROR })
            }
            if (
              kept !== undefined &&
              record.kind === "finish" &&
              record.state === "succeeded" &&
              (record.result as { readonly accepted?: boolean } | undefined)?.accepted === true &&
              !finished
            ) {
              finished = true
              t.done = true
              yield* dispatcher.skip(record.sequence)
              t.fiber = yield* Effect.forkIn(finishAgain(record), scope)
              return
            }
            if ((record.state !== "queued" && !again) || finished) {
              // Ended (or running) elsewhere, or after the run finished: not this machine's to run.
              t.done = record.state !== "queued"
              return yield* dispatcher.skip(record.sequence)
            }
            if (record.kind === "finish") {
              t.fiber = yield* Effect.forkIn(handleFinish(t), scope)
              return
            }
            if (record.kind === "terminal") {
              t.fiber = yield* Effect.forkIn(openTerminal(t), scope)
              return
            }
            t.dispatched = true
            const ticket = yield* dispatcher.submit(record).pipe(Effect.either)
            if (ticket._tag === "Left") {
              t.dispatched = false
              return yield* finishRecord(t, {
                state: "failed",
                error: `sequence ${record.sequence} was taken`,
              })
            }
            t.fiber = yield* Deferred.await(ticket.right.outcome).pipe(
              Effect.catchAll((e) => Effect.succeed<Outcome>({ state: "failed", error: e.detail })),
              Effect.flatMap((outcome) => finishRecord(t, outcome)),
              Effect.forkIn(scope),
            )
          })

        yield* Deferred.succeed(taking, take)
        yield* Fiber.join(watching)
      })

    const lifeFiber = yield* life((d) => Deferred.succeed(dispatcherReady, d)).pipe(
      Effect.catchAll((e) =>
        e instanceof LifeFailed
          ? Effect.all([
              // Setup and input details hold the caller's output (maybe secrets): the log has those.
              Effect.logWarning("run failed on its machine").pipe(
                Effect.annotateLogs({
                  run: runId,
                  failure: e.failure,
                  ...(e.failure === "infrastructure" ? { detail: e.detail.slice(0, 2_000) } : {}),
                }),
              ),
              log.append("failed", { failure: e.failure, detail: e.detail }),
              fail(e.failure as RunFailure, e.detail, e.failure),
            ])
          : Effect.zipRight(
              Effect.logError("run machine failed").pipe(
                Effect.annotateLogs({ run: runId, error: describe(e) }),
              ),
              fail("infrastructure", describe(e), "infrastructure"),
            ),
      ),
      Effect.catchAllDefect((defect) =>
        Effect.zipRight(
          Effect.logError("run machine died").pipe(
            Effect.annotateLogs({ run: runId, defect: String(defect) }),
          ),
          fail("infrastructure", `internal error: ${String(defect)}`, "infrastructure"),
        ),
      ),
      Effect.annotateLogs({ run: runId }),
      Effect.provide(services),
      // The host actor starts machines in an uninterruptible handler; the life (and every fiber
      // it forks: commands, output sinks) must stay interruptible, or nothing could stop it.
      Effect.interruptible,
      Effect.forkIn(scope),
    )

    // ----- cancel and end

    const cancelTracked = (t: Tracked) =>
      Effect.gen(function* () {
        // Ended: its fiber may still be writing the log line and the webhook; let it.
        if (t.done) {
          if (t.fiber) yield* Fiber.await(t.fiber)
          return
        }
        if (t.dispatched) {
          const dispatcher = yield* Deferred.await(dispatcherReady)
          yield* dispatcher.cancel(t.record.id)
          if (t.fiber) yield* Fiber.await(t.fiber)
        } else if (t.fiber) {
          yield* Fiber.interrupt(t.fiber)
        }
        yield* finishRecord(t, { state: "cancelled" })
      })

    const cancel: RunMachine["cancel"] = (command, sequence) =>
      feedLock.withPermits(1)(
        Effect.gen(function* () {
          const t = tracked.get(command)
          if (t !== undefined) return yield* cancelTracked(t)
          // Not taken yet (the machine is still starting): end its record here; the feed skips it.
          const current = yield* commands.get(kvKeys.command(runId, sequence))
          if (Option.isNone(current) || current.value.value.id !== command) return
          if (endedCommandStates.has(current.value.value.state)) return
          const at = yield* now
          const ended = { ...current.value.value, state: "cancelled", ended_at: at } as CommandRecord
          yield* commands.update(kvKeys.command(runId, sequence), ended, current.value.revision).pipe(
            Effect.zipRight(
              OperatorEvents.publishAfterWrite(OperatorEvents.commandEnded(run.account, ended, at)),
            ),
            Effect.catchTag("StateConflict", () => Effect.void),
          )
        }).pipe(
          Effect.catchAll((e) =>
            Effect.logWarning("command not cancelled").pipe(
              Effect.annotateLogs({ run: runId, command, error: e._tag }),
            ),
          ),
          Effect.provide(services),
        ),
      )

    const teardown = (failure: Failure | undefined) =>
      Effect.gen(function* () {
        if (failure !== undefined) yield* fail(failure.failure, failure.detail, "host")
        yield* Fiber.interrupt(lifeFiber)
        // Commands still running end `cancelled`, and ended ones finish their log line and webhook,
        // within the grace (the run actor marks the rest). Interruptible, or the grace would wait
        // for them all the same (the teardown is not).
        yield* Effect.forEach(tracked.values(), cancelTracked, {
          concurrency: "unbounded",
          discard: true,
        }).pipe(
          Effect.interruptible,
          Effect.timeout(settings.endGraceMs),
          Effect.catchAll(() => Effect.logWarning("commands not all marked cancelled in time")),
        )
        yield* ScopeOps.close(terminals, Exit.void)
        yield* log.append(
          "end",
          failure === undefined ? {} : { failure: failure.failure, detail: failure.detail },
        )
        // The last part is stored while the machine goes (neither needs the other): its removal
        // began 11–20 ms later when it waited for the store's answers.
        yield* both(log.end, ScopeOps.close(scope, Exit.void))
        yield* capacity.release(runId)
        yield* send(
          "the scheduler the machine is gone",
          Mailbox.send(
            Scheduler,
            schedulerId,
            { _tag: "Freed", run: runId, host: host.id },
            { msgId: `${runId}:freed` },
          ),
        )
        yield* Effect.logInfo("run machine ended").pipe(Effect.annotateLogs({ run: runId }))
      }).pipe(
        Effect.provide(services),
        Effect.ensuring(Deferred.succeed(done, undefined)),
        Effect.uninterruptible,
      )

    const end: RunMachine["end"] = (failure) =>
      Effect.suspend(() => {
        if (ending) return Deferred.await(done)
        ending = true
        return teardown(failure)
      })

    return {
      run,
      cancel,
      log: (kind, fields) => log.append(kind, fields),
      end,
      ended: Deferred.await(done),
    } satisfies RunMachine
  })

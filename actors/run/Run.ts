/**
 * The run actor's handler (type `run`, id = the run id): the run's life cycle, its command
 * sequence, its timers and its billing. Contract and message list in `schema/actors/Run.ts`.
 *
 * Side effects inside the handler. The runtime's outbox reaches actor mailboxes only, so the
 * handler writes KV itself, before the runtime stores its state (a retried or re-run handler writes
 * again, so every write is idempotent):
 *
 * - the projection `StoredRun` in KV `runs` (`<account>.<run>`), after every change of the run,
 *   compare-and-set, and skipped when the stored `seq` is newer than the message being handled (a
 *   stale owner's late write loses). The same `seq` is written again: it is a retry of the same
 *   message, whose result is the one the runtime is about to store;
 * - the function's newest run, `<account>.last.<function>` in KV `runs` (`Create`; the greatest
 *   run id wins), which `GET /v1/functions` shows as `last`;
 * - command index entries in KV `commands` (`<run>.id.<command>` → sequence): claimed by `AddCommand`
 *   before its record, so the same id added again (a retried ask, a resumed agent, a re-run of a
 *   message whose state write was lost) gets its sequence back; the state keeps no list of ids. A
 *   `fresh` id (a caller's command sent without an `Idempotency-Key`: no other message can carry
 *   it) has its entry and record written at once, one round trip sooner to the host agent;
 * - command records in KV `commands` (`<run>.<sequence>`): created `queued` by `AddCommand`; set
 *   `cancelled` by `CancelCommand` (a queued run has no machine to ask) and, when the run ends, on
 *   every record not ended yet, by CAS on the revision read, so the host agent's own writes win
 *   a race and are never overwritten.
 *
 * Billing. Minute `k` (from 1) of a run starts at `started_at + (k − 1) × minuteMs`. `Started`
 * charges minute 1 at once; the `bill` timer fires a grace (a 20th of a minute, at most a second)
 * after the start of each next minute and charges every minute started a grace before it fired
 * (`ctx.sentAt`, the mailbox's clock, not when a worker got to it: a worker down for a while must
 * not charge the minutes it was down for a run whose end waits behind the timer) in one `Charge`;
 * the end charges what is left, so a run pays `max(1, ceil((ended_at − started_at) / minuteMs))`
 * minutes. A minute the timer charged stays charged; the grace keeps that from happening to a run
 * whose host reported its end just before the minute began but whose message reached the mailbox
 * just after the timer. Each `Charge` carries the ledger id `derivedId("led", "<run>:<from>-<through>")`
 * and the runtime's deterministic message id: a redelivered or re-run message charges the same
 * range under the same id, which the account applies once, so a run's compute entries always add
 * up to its charged minutes. Timeouts end at their deadline (a `timeout_minutes` run pays exactly
 * that many minutes; the `bill` timer never charges past it).
 *
 * The agent (issue 8): when a run whose provider is not `none` is `Ready`, the handler creates
 * `r.<run>` in KV `agents` (`{run, account}`; an existing record is left), which the agent
 * supervisors of the actor workers watch to start its loop (`actors/agent/`); when the run ends it
 * deletes the record, which stops the loop.
 *
 * Credit and suspension are checked at every `bill` (once a minute, so well within the spec's 5
 * minutes): the account actor's stored balance, and the account record's `state`.
 */
import { Effect, Either, Option, type Schema } from "effect"
import type { AccountRecord } from "../../core/Accounts.ts"
import { AccountRecord as AccountRecordSchema, computeRate } from "../../core/Accounts.ts"
import * as State from "../../core/actors/State.ts"
import { both } from "../../core/Concurrent.ts"
import { derivedId } from "../../core/Ids.ts"
import * as Kv from "../../core/Kv.ts"
import { Nats, type NatsError } from "../../core/Nats.ts"
import * as OperatorEvents from "../../core/OperatorEvents.ts"
import { Storage } from "../../core/Storage.ts"
import { Account, type AccountActorState, type Charge } from "../../schema/actors/Account.ts"
import * as Actor from "../../schema/actors/Actor.ts"
import { Host } from "../../schema/actors/Host.ts"
import {
  type Create,
  Run as Definition,
  type RunActorState,
  type RunMessage,
  type RunReply,
} from "../../schema/actors/Run.ts"
import { Scheduler, schedulerId } from "../../schema/actors/Scheduler.ts"
import { Webhook } from "../../schema/actors/Webhook.ts"
import { CommandIndex, CommandRecord, endedCommandStates } from "../../schema/Command.ts"
import { type Timestamp, timestamp } from "../../schema/Common.ts"
import { type EventId, type LedgerEntryId, noProvider, type RunId } from "../../schema/Ids.ts"
import { fileCommandTimeoutMs, minutePriceUsdNanos, overdraftUsdNanos, sizes } from "../../schema/Limits.ts"
import {
  apiRun,
  emptyUsage,
  endedRunStates,
  LastRun,
  type RunFailure,
  type StoredOutput,
  StoredRun,
} from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { AgentRun } from "../agent/Store.ts"
import { RunSettings, type RunSettingsShape } from "./Settings.ts"

export { Run } from "../../schema/actors/Run.ts"

/** What the handler reaches besides its state. */
export interface RunDeps {
  readonly nats: Nats["Type"]
  readonly storage: Storage["Type"]
  readonly settings: RunSettingsShape
}

/**
 * Completes once the work already due in this process has run (a macrotask: everything the
 * current read of the connection woke, and what that forked, goes first). Costs a turn of the event
 * loop when nothing else waits.
 */
const afterReadyWork = Effect.async<void>((resume) => {
  const at = setImmediate(() => resume(Effect.void))
  return Effect.sync(() => clearImmediate(at))
})

/** Timer names (subject tokens). */
const timers = { queue: "queue", timeout: "timeout", bill: "bill", commands: "commands" } as const

/** The detail of a run failed by the actor itself. */
export const details = {
  queueTimeout: (ms: number) => `no machine took the run within ${Math.round(ms / 60_000)} minutes`,
  timeout: (minutes: number) => `the run passed its timeout of ${minutes} minute${minutes === 1 ? "" : "s"}`,
  credit: "the account's balance went more than $10 below its minimum",
  suspended: "the account was suspended",
  /** A command's end never reported by its host (`CommandWatch`). */
  commandLost: (timeoutMs: number, graceMs: number) =>
    `no end was reported within the command's timeout (${timeoutMs} ms) and a grace of ${graceMs} ms: its machine's host lost it`,
} as const

/** How a run ends. */
interface Ending {
  readonly state: "succeeded" | "failed"
  /** When it ended (epoch ms). */
  readonly at: number
  readonly failure?: RunFailure
  readonly detail?: string
  readonly message?: string | undefined
  readonly output?: StoredOutput
}

type Result = Actor.HandlerResult<RunActorState, RunReply>
type Ctx = Actor.ActorContext<RunMessage>

const retryable = (what: string) => (cause: unknown) =>
  new Actor.Retryable({ message: `${what} failed`, cause })

const isConflict = (e: unknown): e is Kv.StateConflict => (e as { _tag?: unknown })._tag === "StateConflict"

/** The run as first stored: queued, nothing used yet. */
export const queuedRun = (m: Create, seq: number): StoredRun => ({
  id: m.id,
  account: m.account,
  function: m.function,
  version: m.version,
  base: m.base,
  size: m.size,
  provider: m.provider,
  prompt: m.prompt,
  ...(m.input === undefined ? {} : { input: m.input }),
  ...(m.webhook === undefined ? {} : { webhook: m.webhook }),
  ...(m.external_reference === undefined ? {} : { external_reference: m.external_reference }),
  state: "queued",
  created_at: m.created_at,
  created_by: m.created_by,
  usage: emptyUsage(m.size),
  memory_mib: m.memory_mib,
  timeout_minutes: m.timeout_minutes,
  log_parts: 0,
  seq,
})

/** The run actor with its dependencies. */
export const make = (deps: RunDeps) => {
  const { minuteMs, queueTimeoutMs, commandGraceMs } = deps.settings

  /**
   * The timeout the machine applies to a command: `bash`'s `timeout_ms`, the host's 5 minutes for a
   * file command; none for the kinds without one (`put`, `get`, `finish`, `terminal`: the run's
   * timeout bounds them).
   */
  const commandTimeout = (record: CommandRecord): number | undefined => {
    switch (record.kind) {
      case "bash":
        return record.arguments.timeout_ms
      case "read":
      case "write":
      case "edit":
      case "list":
        return fileCommandTimeoutMs
      default:
        return undefined
    }
  }

  /**
   * When a command that has not ended is given up on: its timeout counted from when it was added
   * or the machine was ready, whichever is later, plus the grace.
   */
  const commandDeadline = (record: CommandRecord, readyAt: number): number | undefined => {
    const timeout = commandTimeout(record)
    return timeout === undefined
      ? undefined
      : Math.max(Date.parse(record.created_at), readyAt) + timeout + commandGraceMs
  }

  /** Sets the `CommandWatch` timer to `at` unless it is set earlier already. */
  const armWatch = (
    s: RunActorState,
    at: number,
    ctx: { schedule: (n: string, at: number, m: RunMessage) => void },
  ) => {
    if (s.watch_at !== undefined && s.watch_at <= at) return s
    ctx.schedule(timers.commands, at, { _tag: "CommandWatch" })
    return { ...s, watch_at: at }
  }
  /** How long after a minute starts its `bill` timer fires, and how far back it counts minutes. */
  const billGraceMs = Math.min(1_000, Math.floor(minuteMs / 20))
  /** When the `bill` timer for minute `charged + 1` fires. */
  const billAt = (startedMs: number, charged: number) => startedMs + charged * minuteMs + billGraceMs
  const names = deps.storage.names
  const provide = <A, E>(effect: Effect.Effect<A, E, Nats | Storage>): Effect.Effect<A, E> =>
    effect.pipe(Effect.provideService(Nats, deps.nats), Effect.provideService(Storage, deps.storage))
  // Each view is made at its first use and kept: providing the services again on every message
  // cost about 50 fiber steps a view (two views on every command's add).
  const view = <A, I>(bucket: string, schema: Schema.Schema<A, I>): Effect.Effect<Kv.Kv<A>, NatsError> => {
    let made: Kv.Kv<A> | undefined
    const make = Effect.tap(provide(Kv.make(bucket, schema)), (kv) => {
      made = kv
    })
    return Effect.suspend(() => (made === undefined ? make : Effect.succeed(made)))
  }
  const runsKv = view(names.kv.runs.name, StoredRun)
  const commandsKv = view(names.kv.commands.name, CommandRecord)
  const indexKv = view(names.kv.commands.name, CommandIndex)
  const accountsKv = view(names.kv.accounts.name, AccountRecordSchema)
  const agentsKv = view(names.kv.agents.name, AgentRun)
  const lastRunKv = view(names.kv.runs.name, LastRun)
  const hasAgent = (run: StoredRun) => run.provider !== noProvider

  /** Starts the run's agent: its record in KV `agents` (left as it is when it exists). */
  const startAgent = (run: StoredRun) =>
    Effect.flatMap(agentsKv, (kv) =>
      kv.create(kvKeys.agentRun(run.id), { run: run.id, account: run.account }),
    ).pipe(
      Effect.catchTag("StateConflict", () => Effect.void),
      Effect.asVoid,
      Effect.mapError(retryable("starting the agent")),
    )

  /** Stops the run's agent: its record goes (idempotent). */
  const stopAgent = (run: StoredRun) =>
    Effect.flatMap(agentsKv, (kv) => kv.delete(kvKeys.agentRun(run.id))).pipe(
      Effect.mapError(retryable("stopping the agent")),
    )

  /**
   * Points the function's `last` (`<account>.last.<function>`) at `run` unless a newer run is
   * there: run ids are time-ordered, so the greatest id is the newest run (CAS, retried on races
   * between runs of the same function).
   */
  const noteLast = (run: StoredRun) =>
    Effect.gen(function* () {
      const kv = yield* lastRunKv
      const key = kvKeys.lastRun(run.account, run.function)
      for (let attempt = 0; ; attempt++) {
        const found = yield* kv.get(key).pipe(Effect.catchTag("KvValueInvalid", () => Effect.succeedNone))
        if (Option.isSome(found) && found.value.value.run >= run.id) return
        const written = yield* Effect.either(
          kv.update(key, { run: run.id }, Option.isSome(found) ? found.value.revision : 0),
        )
        if (Either.isRight(written)) return
        if (!isConflict(written.left) || attempt >= 4) return yield* Effect.fail(written.left)
      }
    }).pipe(Effect.mapError(retryable("writing the function's last run")))

  /** Writes the projection unless a newer one is stored (see the module comment). */
  const project = (run: StoredRun) =>
    Effect.gen(function* () {
      const kv = yield* runsKv
      const key = kvKeys.run(run.account, run.id)
      for (let attempt = 0; ; attempt++) {
        const current = yield* Effect.either(kv.get(key))
        // A stored value that no longer decodes is replaced (only this actor writes the key).
        if (Either.isLeft(current)) {
          if (current.left._tag !== "KvValueInvalid") return yield* Effect.fail(current.left)
          yield* kv.put(key, run)
          return
        }
        const found = current.right
        if (Option.isSome(found) && found.value.value.seq > run.seq) return
        // A state change: operators hear of it first, so a write that fails and is retried
        // publishes again (stored once: the event's id is the run and the state).
        if (Option.isNone(found) || found.value.value.state !== run.state)
          yield* provide(
            OperatorEvents.publish({
              type: "run.state",
              v: 1,
              at: run.ended_at ?? run.started_at ?? run.created_at,
              account: run.account,
              run: run.id,
              state: run.state,
              ...(run.failure === undefined ? {} : { failure: run.failure }),
            }),
          )
        // Revision 0 creates: two first writes cannot both succeed.
        const revision = Option.isSome(found) ? found.value.revision : 0
        const written = yield* Effect.either(kv.update(key, run, revision))
        if (Either.isRight(written)) return
        if (!isConflict(written.left) || attempt >= 4) return yield* Effect.fail(written.left)
      }
    }).pipe(Effect.mapError(retryable("writing the run record")))

  /**
   * Changes command record `sequence` with `f` by CAS, re-reading after a lost race; `f` returns
   * undefined to leave it. The record as it stands afterwards, or none when there is none.
   */
  const modifyCommand = (
    account: string,
    run: string,
    sequence: number,
    f: (record: CommandRecord) => CommandRecord | undefined,
  ) =>
    Effect.gen(function* () {
      const kv = yield* commandsKv
      const key = kvKeys.command(run, sequence)
      for (let attempt = 0; ; attempt++) {
        const current = yield* kv.get(key)
        if (Option.isNone(current)) return Option.none<CommandRecord>()
        const next = f(current.value.value)
        if (next === undefined) return Option.some(current.value.value)
        const written = yield* Effect.either(kv.update(key, next, current.value.revision))
        if (Either.isRight(written)) {
          // This write ended it: operators hear of it (the record stays the truth).
          if (!endedCommandStates.has(current.value.value.state))
            yield* provide(
              OperatorEvents.publishAfterWrite(
                OperatorEvents.commandEnded(account, next, next.ended_at ?? ""),
              ),
            )
          return Option.some(next)
        }
        if (!isConflict(written.left) || attempt >= 9) return yield* Effect.fail(written.left)
      }
    })

  const cancelled = (at: Timestamp) => (record: CommandRecord) =>
    endedCommandStates.has(record.state)
      ? undefined
      : ({ ...record, state: "cancelled", ended_at: at } as CommandRecord)

  /** Marks every command of the run that has not ended `cancelled`. */
  const cancelOpenCommands = (s: RunActorState, account: string, run: string, at: Timestamp) =>
    Effect.forEach(
      Array.from({ length: s.next_sequence - 1 }, (_, i) => i + 1),
      (sequence) =>
        modifyCommand(account, run, sequence, cancelled(at)).pipe(
          // One unreadable record must not keep the run from ending.
          Effect.catchTag("KvValueInvalid", (e) =>
            Effect.as(
              Effect.logWarning("command record left as it was: invalid").pipe(
                Effect.annotateLogs({ run, sequence, error: e.message }),
              ),
              Option.none(),
            ),
          ),
        ),
      { concurrency: 8, discard: true },
    ).pipe(Effect.mapError(retryable("cancelling the run's commands")))

  /** The `Charge` for minutes `from`…`through` of a started run. */
  const chargeOf = (s: RunActorState, run: StoredRun, from: number, through: number): Charge => {
    const started = Date.parse(run.started_at!)
    return {
      _tag: "Charge",
      entry_id: derivedId("led", `${run.id}:${from}-${through}`) as LedgerEntryId,
      amount_usd_nanos:
        (through - from + 1) * minutePriceUsdNanos(run.memory_mib, s.rate_usd_nanos_per_gib_hour),
      // When the first billed minute began: the same for every copy of the entry.
      effective_at: timestamp(started + (from - 1) * minuteMs),
      run: run.id,
      function: run.function,
      version: run.version,
      size: run.size,
      provider: run.provider,
      started_by: run.created_by,
      ...(run.external_reference === undefined ? {} : { external_reference: run.external_reference }),
      from_minute: from,
      through_minute: through,
      memory_mib: run.memory_mib,
      rate_usd_nanos_per_gib_hour: s.rate_usd_nanos_per_gib_hour,
    }
  }

  /**
   * Ends the run once: final charge, timers cancelled, memory released, its host stopped (or the
   * scheduler told), open commands cancelled, the projection written, the webhook event sent.
   * `sends` are messages decided before (a `bill`'s charge), kept first.
   */
  const end = (
    s: RunActorState,
    run: StoredRun,
    e: Ending,
    ctx: Ctx,
    sends: ReadonlyArray<Actor.Outgoing> = [],
  ): Effect.Effect<Result, Actor.Retryable> =>
    Effect.gen(function* () {
      const out: Array<Actor.Outgoing> = [...sends]
      // Never before the run was created or started (clocks of different processes).
      const startedMs = run.started_at === undefined ? undefined : Date.parse(run.started_at)
      const endedMs = Math.max(e.at, Date.parse(run.created_at), startedMs ?? 0)
      const endedAt = timestamp(endedMs)
      let charged = s.charged_through
      let seconds = 0
      if (startedMs !== undefined) {
        const used = endedMs - startedMs
        seconds = Math.ceil(used / 1000)
        const total = Math.max(1, Math.ceil(used / minuteMs), charged)
        if (total > charged) out.push(Actor.to(Account, run.account, chargeOf(s, run, charged + 1, total)))
        charged = total
      }
      const { failure: _f, detail: _d, message: _m, output: _o, ...rest } = run
      const stored: StoredRun = {
        ...rest,
        state: e.state,
        ended_at: endedAt,
        ...(e.failure === undefined ? {} : { failure: e.failure }),
        ...(e.detail === undefined ? {} : { detail: e.detail }),
        ...(e.message === undefined ? {} : { message: e.message }),
        ...(e.output === undefined ? {} : { output: e.output }),
        usage: { ...run.usage, compute: { size: run.size, seconds } },
        seq: ctx.seq,
      }
      for (const name of Object.values(timers)) ctx.cancel(name)
      out.push(Actor.to(Account, run.account, { _tag: "Release", run: run.id }))
      out.push(
        run.host === undefined
          ? Actor.to(Scheduler, schedulerId, { _tag: "Dequeue", run: run.id })
          : Actor.to(Host, run.host, { _tag: "Stop", run: run.id }),
      )
      if (run.webhook !== undefined) {
        const event = derivedId("evt", run.id) as EventId
        const type = e.state === "succeeded" ? "run.succeeded" : "run.failed"
        out.push(
          Actor.to(Webhook, event, {
            _tag: "Deliver",
            event,
            account: run.account,
            run: run.id,
            url: run.webhook,
            type,
            // `data.output.url` is signed by the deliverer at each attempt.
            body: JSON.stringify({ id: event, type, created: endedAt, data: apiRun(stored, "") }),
          }),
        )
      }
      yield* cancelOpenCommands(s, run.account, run.id, endedAt)
      if (hasAgent(run)) yield* stopAgent(run)
      yield* project(stored)
      yield* Effect.logInfo("run ended").pipe(
        Effect.annotateLogs({ run: run.id, state: e.state, failure: e.failure ?? "-", minutes: charged }),
      )
      return { state: { ...s, run: stored, charged_through: charged }, send: out }
    })

  /** The account's balance is more than the overdraft below its minimum. */
  const overdrawn = (account: string) =>
    provide(State.read(Account, account)).pipe(
      Effect.map(
        Option.match({
          onNone: () => false,
          onSome: (r) => {
            const a = r.state as AccountActorState
            return a.balance_usd_nanos < a.minimum_balance_usd_nanos - overdraftUsdNanos
          },
        }),
      ),
      Effect.mapError(retryable("reading the account's balance")),
    )

  /** The account record says `suspended` (an account without a record is not). */
  const suspended = (account: string) =>
    Effect.flatMap(accountsKv, (kv) => kv.get(account)).pipe(
      Effect.map(Option.exists((e: Kv.KvEntry<AccountRecord>) => e.value.state === "suspended")),
      Effect.mapError(retryable("reading the account record")),
    )

  const handler = (
    s: RunActorState,
    m: RunMessage,
    ctx: Ctx,
  ): Effect.Effect<Result, Actor.Retryable | Kv.KvValueInvalid> =>
    Effect.gen(function* () {
      const run = s.run
      const ended = run !== undefined && endedRunStates.has(run.state)
      switch (m._tag) {
        case "Create": {
          if (run !== undefined) return { state: s, reply: { run } }
          const created = queuedRun(m, ctx.seq)
          ctx.schedule(timers.queue, Date.parse(m.created_at) + queueTimeoutMs, { _tag: "QueueTimeout" })
          // Two keys of their own, each write idempotent: side by side (a run's start waits on them).
          yield* both(project(created), noteLast(created))
          yield* Effect.logInfo("run queued").pipe(Effect.annotateLogs({ run: m.id, account: m.account }))
          return {
            state: { ...s, run: created, rate_usd_nanos_per_gib_hour: computeRate },
            reply: { run: created },
            send: [
              Actor.to(Scheduler, schedulerId, {
                _tag: "Enqueue",
                run: m.id,
                account: m.account,
                size: m.size,
                vcpus: sizes[m.size].vcpus,
                memory_mib: m.memory_mib,
                created_at: m.created_at,
              }),
            ],
          }
        }

        case "AddCommand": {
          if (run === undefined) return { state: s, reply: { unknown: true as const } }
          const fails = (what: string) => (e: Kv.StateConflict | NatsError | Kv.KvValueInvalid) =>
            e._tag === "KvValueInvalid" ? e : retryable(what)(e)
          const index = yield* indexKv.pipe(Effect.mapError(retryable("opening the commands bucket")))
          const kv = yield* commandsKv.pipe(Effect.mapError(retryable("opening the commands bucket")))
          const indexKey = kvKeys.commandIndex(run.id, m.id)
          // The record at `sequence`: created at once in the usual case (one write); a key already
          // there is read: our own record stands, one left by a message whose state write was lost
          // is replaced.
          const recordAt = (sequence: number) => {
            const key = kvKeys.command(run.id, sequence)
            const record = {
              id: m.id,
              run: run.id,
              kind: m.kind,
              arguments: m.arguments,
              source: m.source,
              sequence,
              state: "queued",
              created_at: m.created_at,
            } as CommandRecord
            const existing = kv
              .get(key)
              .pipe(
                Effect.flatMap((found) =>
                  Option.isSome(found) && found.value.value.id === m.id
                    ? Effect.succeed(found.value.value)
                    : Effect.as(
                        kv.update(key, record, Option.isSome(found) ? found.value.revision : 0),
                        record,
                      ),
                ),
              )
            return {
              key,
              record,
              existing,
              created: kv.create(key, record).pipe(
                Effect.as(record),
                Effect.catchTag("StateConflict", () => existing),
              ),
            }
          }
          // The host agent watching a ready run's records is woken by the same read as the
          // record's write (in one process under `npm start`): it goes first, up to the command's
          // start on the machine, since the command waits for that and not for this state write
          // and reply.
          const added = (stored: CommandRecord) =>
            Effect.as(s.ready_at === undefined ? Effect.void : afterReadyWork, {
              state: ((next) => {
                const deadline =
                  s.ready_at === undefined || ended ? undefined : commandDeadline(stored, s.ready_at)
                return deadline === undefined ? next : armWatch(next, deadline, ctx)
              })({ ...s, next_sequence: stored.sequence + 1 }),
              reply: { command: stored },
            })
          // A fresh id (made for this message alone) can have been claimed only by an earlier run
          // of this same message whose state write was lost, which claimed the same sequence (the
          // state did not move); no other message carries it. So its index entry and record are
          // written at once, saving the claim's round trip on the way to the host agent.
          if (m.fresh === true && !ended) {
            const sequence = s.next_sequence
            // Both sent before either is awaited: one socket write, and no fiber each.
            const claiming = yield* index
              .creating(indexKey, { sequence })
              .pipe(Effect.mapError(fails("claiming the command's sequence")))
            const at = recordAt(sequence)
            const writing = yield* kv
              .creating(at.key, at.record)
              .pipe(Effect.mapError(fails("writing the command")))
            yield* claiming.pipe(
              Effect.catchTag("StateConflict", () =>
                Effect.flatMap(index.get(indexKey), (found) =>
                  Option.isSome(found) && found.value.value.sequence !== sequence
                    ? Effect.logError("a fresh command id was claimed at another sequence").pipe(
                        Effect.annotateLogs({
                          run: run.id,
                          command: m.id,
                          claimed: found.value.value.sequence,
                          sequence,
                        }),
                      )
                    : Effect.void,
                ),
              ),
              Effect.mapError(fails("claiming the command's sequence")),
            )
            const stored = yield* writing.pipe(
              Effect.as(at.record),
              Effect.catchTag("StateConflict", () => at.existing),
              Effect.mapError(fails("writing the command")),
            )
            return yield* added(stored)
          }
          // The id's sequence: claimed now (the usual case, one write), or found where an earlier
          // add of the same id claimed it. Claimed before the record is written, so a re-run of
          // this message (its state write lost) finds its own sequence. (Claim and record as one
          // atomic batch would be one round trip, but nats-server 2.15 commits a two-message batch
          // in 2.6–3.2 ms against 0.5–0.6 ms for the two creates, measured on loopback.)
          const claim = ended
            ? Effect.map(
                index.get(indexKey),
                Option.map((e) => e.value.sequence),
              )
            : index.create(indexKey, { sequence: s.next_sequence }).pipe(
                Effect.as(Option.some(s.next_sequence)),
                Effect.catchTag("StateConflict", () =>
                  Effect.map(
                    index.get(indexKey),
                    Option.map((e) => e.value.sequence),
                  ),
                ),
              )
          const claimed = yield* claim.pipe(Effect.mapError(fails("claiming the command's sequence")))
          if (Option.isNone(claimed)) return { state: s, reply: { ended: true as const } }
          const sequence = claimed.value
          const write = recordAt(sequence)
          // A sequence below the next one was added before: its record stands as it is.
          const known = sequence < s.next_sequence
          const stored = yield* (known ? write.existing : write.created).pipe(
            Effect.mapError(fails("writing the command")),
          )
          if (known) return { state: s, reply: { command: stored } }
          return yield* added(stored)
        }

        case "CancelCommand": {
          if (run === undefined || m.sequence >= s.next_sequence)
            return { state: s, reply: { unknown: true as const } }
          const current = yield* Effect.flatMap(commandsKv, (kv) =>
            kv.get(kvKeys.command(run.id, m.sequence)),
          ).pipe(
            Effect.mapError((e) => (e._tag === "KvValueInvalid" ? e : retryable("reading the command")(e))),
          )
          // The sequence must hold that command.
          if (Option.isNone(current) || current.value.value.id !== m.id)
            return { state: s, reply: { unknown: true as const } }
          if (run.host === undefined) {
            // No machine has seen the command: it ends here (a queued run, or one that ended queued).
            const at = timestamp(ctx.now)
            const record = yield* modifyCommand(run.account, run.id, m.sequence, cancelled(at)).pipe(
              Effect.mapError((e) =>
                e._tag === "KvValueInvalid" ? e : retryable("cancelling the command")(e),
              ),
            )
            return Option.match(record, {
              onNone: () => ({ state: s, reply: { unknown: true as const } }),
              onSome: (command) => ({ state: s, reply: { command } }),
            })
          }
          const command = current.value.value
          // An ended command is unchanged; a live one is the host's to kill.
          if (endedCommandStates.has(command.state) || ended) return { state: s, reply: { command } }
          return {
            state: s,
            reply: { command },
            send: [
              Actor.to(Host, run.host, {
                _tag: "CancelCommand",
                run: run.id,
                command: m.id,
                sequence: m.sequence,
              }),
            ],
          }
        }

        case "Started": {
          const stop = [Actor.to(Host, m.host, { _tag: "Stop", run: ctx.id as RunId })]
          if (run === undefined || ended) {
            // Ended while the host was taking it (queue timeout, a failure): the machine goes.
            yield* Effect.logInfo("run started after it ended: stopping").pipe(
              Effect.annotateLogs({ run: ctx.id, host: m.host }),
            )
            return { state: s, send: stop }
          }
          if (run.state === "running")
            // The same start again changes nothing; a second host taking the run is told to stop.
            return run.host === m.host ? { state: s } : { state: s, send: stop }
          const startedMs = Math.max(Date.parse(m.at), Date.parse(run.created_at))
          const running: StoredRun = {
            ...run,
            state: "running",
            started_at: timestamp(startedMs),
            host: m.host,
            seq: ctx.seq,
          }
          ctx.cancel(timers.queue)
          ctx.schedule(timers.timeout, startedMs + run.timeout_minutes * minuteMs, { _tag: "Timeout" })
          ctx.schedule(timers.bill, billAt(startedMs, 1), { _tag: "Bill" })
          yield* project(running)
          yield* Effect.logInfo("run started").pipe(Effect.annotateLogs({ run: run.id, host: m.host }))
          return {
            state: { ...s, run: running, charged_through: 1 },
            send: [Actor.to(Account, run.account, chargeOf(s, running, 1, 1))],
          }
        }

        case "Ready": {
          yield* Effect.logInfo("run ready").pipe(Effect.annotateLogs({ run: ctx.id }))
          if (run === undefined || run.state !== "running") return { state: s }
          if (hasAgent(run)) yield* startAgent(run)
          const readyAt = Date.parse(m.at)
          const ready = { ...s, ready_at: readyAt }
          // Commands added before: the watch reads them when the earliest of them could be due.
          return {
            state:
              s.next_sequence - 1 > s.watched_through
                ? armWatch(ready, readyAt + commandGraceMs, ctx)
                : ready,
          }
        }

        case "CommandWatch": {
          const fired: RunActorState = { ...s, watch_at: undefined }
          if (run === undefined || run.state !== "running" || s.ready_at === undefined)
            return { state: fired }
          const kv = yield* commandsKv.pipe(Effect.mapError(retryable("opening the commands bucket")))
          const now = ctx.now
          let through = s.watched_through
          let open = false
          let earliest: number | undefined
          const sends: Array<ReturnType<typeof Actor.to>> = []
          for (let seq = s.watched_through + 1; seq < s.next_sequence; seq++) {
            const found = yield* kv
              .get(kvKeys.command(run.id, seq))
              .pipe(
                Effect.mapError((e) => (e._tag === "KvValueInvalid" ? e : retryable("reading a command")(e))),
              )
            const record = Option.getOrUndefined(Option.map(found, (e) => e.value))
            // Ended, or of a kind without a timeout (the run's own bounds it): nothing to watch.
            let done =
              record === undefined ||
              endedCommandStates.has(record.state) ||
              commandDeadline(record, s.ready_at) === undefined
            if (record !== undefined && !done) {
              const deadline = commandDeadline(record, s.ready_at)
              if (deadline !== undefined && deadline <= now) {
                // Its host never reported its end: it fails here, and the host is told to kill it.
                const failed = yield* modifyCommand(run.account, run.id, seq, (r) =>
                  endedCommandStates.has(r.state)
                    ? undefined
                    : ({
                        ...r,
                        state: "failed",
                        error: details.commandLost(commandTimeout(r) ?? 0, commandGraceMs),
                        ended_at: timestamp(now),
                      } as CommandRecord),
                ).pipe(
                  Effect.mapError((e) =>
                    e._tag === "KvValueInvalid" ? e : retryable("failing a command")(e),
                  ),
                )
                done = true
                // Ours only if it carries our words (the host may have ended it failed meanwhile).
                const ours =
                  Option.isSome(failed) &&
                  failed.value.state === "failed" &&
                  failed.value.error === details.commandLost(commandTimeout(record) ?? 0, commandGraceMs)
                if (ours && run.host !== undefined) {
                  yield* Effect.logWarning("command past its timeout: failed").pipe(
                    Effect.annotateLogs({ run: run.id, command: record.id, sequence: seq }),
                  )
                  sends.push(
                    Actor.to(Host, run.host, {
                      _tag: "CancelCommand",
                      run: run.id,
                      command: record.id,
                      sequence: seq,
                    }),
                  )
                }
              } else if (deadline !== undefined)
                earliest = earliest === undefined ? deadline : Math.min(earliest, deadline)
            }
            if (done && !open) through = seq
            else open = true
          }
          const watched = { ...fired, watched_through: through }
          return { state: earliest === undefined ? watched : armWatch(watched, earliest, ctx), send: sends }
        }

        case "Succeed":
          if (run === undefined || ended) return { state: s }
          return yield* end(
            s,
            run,
            { state: "succeeded", at: Date.parse(m.at), output: m.output, message: m.message },
            ctx,
          )

        case "Fail":
          if (run === undefined || ended) return { state: s }
          return yield* end(
            s,
            run,
            {
              state: "failed",
              at: Date.parse(m.at),
              failure: m.failure,
              detail: m.detail,
              message: m.message,
            },
            ctx,
          )

        case "QueueTimeout":
          if (run === undefined || run.state !== "queued") return { state: s }
          return yield* end(
            s,
            run,
            {
              state: "failed",
              at: Date.parse(run.created_at) + queueTimeoutMs,
              failure: "infrastructure",
              detail: details.queueTimeout(queueTimeoutMs),
            },
            ctx,
          )

        case "Timeout": {
          if (run === undefined || run.state !== "running" || run.started_at === undefined)
            return { state: s }
          // The run ends at its deadline: it pays `timeout_minutes` minutes, not the timer's lateness.
          const deadline = Date.parse(run.started_at) + run.timeout_minutes * minuteMs
          return yield* end(
            s,
            run,
            {
              state: "failed",
              at: Math.min(ctx.now, deadline),
              failure: "timeout",
              detail: details.timeout(run.timeout_minutes),
            },
            ctx,
          )
        }

        case "Bill": {
          if (run === undefined || run.state !== "running" || run.started_at === undefined)
            return { state: s }
          const startedMs = Date.parse(run.started_at)
          // Minutes started a grace before the timer fired, never past the timeout (the run ends at
          // its deadline).
          const startedMinutes = Math.min(
            Math.floor(Math.max(0, ctx.sentAt - billGraceMs - startedMs) / minuteMs) + 1,
            run.timeout_minutes,
          )
          const sends: Array<Actor.Outgoing> = []
          let next = s
          if (startedMinutes > s.charged_through) {
            sends.push(
              Actor.to(Account, run.account, chargeOf(s, run, s.charged_through + 1, startedMinutes)),
            )
            next = { ...s, charged_through: startedMinutes }
          }
          ctx.schedule(timers.bill, billAt(startedMs, next.charged_through), { _tag: "Bill" })
          if (yield* overdrawn(run.account))
            return yield* end(
              next,
              run,
              { state: "failed", at: ctx.now, failure: "credit", detail: details.credit },
              ctx,
              sends,
            )
          if (yield* suspended(run.account))
            return yield* end(
              next,
              run,
              { state: "failed", at: ctx.now, failure: "suspended", detail: details.suspended },
              ctx,
              sends,
            )
          return { state: next, send: sends }
        }

        case "LogPart": {
          const complete = m.last === true || run?.log_complete === true
          if (run === undefined || (m.n <= run.log_parts && complete === (run.log_complete === true)))
            return { state: s }
          const updated: StoredRun = {
            ...run,
            log_parts: Math.max(run.log_parts, m.n),
            ...(complete ? { log_complete: true } : {}),
            seq: ctx.seq,
          }
          yield* project(updated)
          return { state: { ...s, run: updated } }
        }

        case "Usage": {
          if (run === undefined) return { state: s }
          const updated: StoredRun = { ...run, usage: { ...run.usage, model: m.model }, seq: ctx.seq }
          yield* project(updated)
          return { state: { ...s, run: updated } }
        }
      }
    })

  return Actor.make({
    name: Definition.name,
    state: Definition.state,
    initial: Definition.initial,
    message: Definition.message,
    reply: Definition.reply,
    handler,
  })
}

/** The run actor built from the process's connection, storage and settings. */
export const actor = Effect.gen(function* () {
  return make({ nats: yield* Nats, storage: yield* Storage, settings: yield* RunSettings.Tag })
})

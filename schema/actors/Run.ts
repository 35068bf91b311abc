/**
 * The run actor's contract (type `run`, id = the run id): its messages, replies and stored state.
 * Senders (gateway, scheduler, host agents, webhooks) import this module; the handler lives in
 * `actors/run/Run.ts` (actors role only). The run actor is the one writer of the run's record in KV `runs`
 * (`StoredRun`, a projection of its state) and the creator of command records in KV `commands`.
 *
 *   Create         (gateway, ask)  → {run}                queued; 15-minute start timer; Enqueue to the scheduler
 *   AddCommand     (gateway/agent, ask) → {command} | {ended}   next sequence; record `queued` in KV `commands`
 *   CancelCommand  (gateway, ask)  → {command} | {ended}   queued on a queued run: cancelled here; else asks the host
 *   Started        (host)          running; started_at; minute 1 charged; timeout and billing timers
 *   Ready          (host)          the machine is up, input unpacked, setup done (logged)
 *   Succeed        (host)          finish/submit matched the manifest and the output is stored → succeeded
 *   Fail           (anyone)        → failed with `failure` and `detail` (input, setup, no_submission, …)
 *   LogPart        (host)          log part `n` is stored (`log_parts` = max n); `last`: the one with `end`
 *   Usage          (agent loop)    model usage so far (replaces the model counters)
 *   QueueTimeout, Timeout, Bill, CommandWatch   the actor's own timers
 *
 * When the run ends (once): final charge, memory released at the account, `Stop` to its host or
 * `Dequeue` to the scheduler, queued/running commands marked `cancelled` (host writes win a race
 * by CAS), timers cancelled, and a `run.*` webhook event when the run has a webhook.
 */
import { Effect, Schema } from "effect"
import { CommandKind, CommandRecord, CommandSource } from "../Command.ts"
import { Count, IntAtLeast, Timestamp } from "../Common.ts"
import { Size } from "../Definition.ts"
import { AccountId, Actor, BaseName, CommandId, FunctionId, RunId, UploadId } from "../Ids.ts"
import { RunFailure, RunUsage, StoredOutput, StoredRun } from "../Run.ts"
import * as ActorDef from "./Actor.ts"

/**
 * Creates the run (idempotent: a second `Create` for an existing run answers its record). The
 * gateway has resolved version, base, size and provider, and the account actor has held the memory
 * (`MayStart`).
 */
export const Create = Schema.TaggedStruct("Create", {
  id: RunId,
  account: AccountId,
  function: FunctionId,
  version: IntAtLeast(1),
  base: BaseName,
  size: Size,
  memory_mib: IntAtLeast(1),
  provider: Schema.String,
  prompt: Schema.String,
  input: Schema.optional(UploadId),
  webhook: Schema.optional(Schema.String),
  external_reference: Schema.optional(Schema.String),
  timeout_minutes: IntAtLeast(1),
  created_at: Timestamp,
  created_by: Actor,
})
export type Create = typeof Create.Type

/**
 * Adds a command (idempotent by `id`: the same id answers the stored record). Refused with
 * `{ended: true}` once the run has ended. The record is written `queued` with the next sequence.
 */
export const AddCommand = Schema.TaggedStruct("AddCommand", {
  id: CommandId,
  kind: CommandKind,
  /** The decoded arguments of `kind` (checked by the sender with `CreateCommandRequest`). */
  arguments: Schema.Unknown,
  source: CommandSource,
  created_at: Timestamp,
  /**
   * The id was made for this message alone (a caller's command sent without an `Idempotency-Key`):
   * no other message can carry it, so its index entry and its record are written at once instead
   * of one after the other. Absent (false) for ids a retry or a resumed agent may send again.
   */
  fresh: Schema.optional(Schema.Boolean),
})
export type AddCommand = typeof AddCommand.Type

/** Cancels a command: a queued one of a run without a machine ends here; otherwise the host cancels it. */
export const CancelCommand = Schema.TaggedStruct("CancelCommand", {
  id: CommandId,
  sequence: IntAtLeast(1),
})

/** A host took the run (its capacity is reserved): `started_at` = `at`. */
export const Started = Schema.TaggedStruct("Started", { host: Schema.String, at: Timestamp })
/** The machine is ready: input unpacked and checked, setup done; commands now run. */
export const Ready = Schema.TaggedStruct("Ready", { at: Timestamp })
/** The output matched the manifest and is stored: the run succeeds with `message` (finish detail or agent summary). */
export const Succeed = Schema.TaggedStruct("Succeed", {
  output: StoredOutput,
  message: Schema.optional(Schema.String),
  at: Timestamp,
})
/** The run fails (ignored once ended). */
export const Fail = Schema.TaggedStruct("Fail", {
  failure: RunFailure,
  detail: Schema.String,
  /** The agent's or caller's final message, when there is one (a `finish` with `failed`). */
  message: Schema.optional(Schema.String),
  at: Timestamp,
})
/**
 * Log part `n` is stored in the `logs` store as `<run>.<n>`; `last` when it is the one written as
 * the machine went (its `end` line): the log is whole.
 */
export const LogPart = Schema.TaggedStruct("LogPart", {
  n: IntAtLeast(1),
  last: Schema.optional(Schema.Boolean),
})
/** The model usage so far (the agent loop sends running totals). */
export const Usage = Schema.TaggedStruct("Usage", { model: RunUsage.fields.model })
/** Timer: 15 minutes (setting) after creation; fails a run still queued with `infrastructure`. */
export const QueueTimeout = Schema.TaggedStruct("QueueTimeout", {})
/** Timer: `timeout_minutes` after `started_at`; fails a running run with `timeout`. */
export const Timeout = Schema.TaggedStruct("Timeout", {})
/** Timer: every billing interval while running: charges the next started minute, checks credit and suspension. */
export const Bill = Schema.TaggedStruct("Bill", {})

/**
 * Timer: the earliest deadline of a command not known to have ended (its timeout from when the
 * machine was ready, plus a grace): one whose host never reported its end fails there.
 */
export const CommandWatch = Schema.TaggedStruct("CommandWatch", {})

/** Every message of the run actor. */
export const RunMessage = Schema.Union(
  Create,
  AddCommand,
  CancelCommand,
  Started,
  Ready,
  Succeed,
  Fail,
  LogPart,
  Usage,
  QueueTimeout,
  Timeout,
  Bill,
  CommandWatch,
)
export type RunMessage = typeof RunMessage.Type

/** Replies: the run (Create), a command (AddCommand, CancelCommand), or the run has ended / is unknown. */
export const RunReply = Schema.Union(
  Schema.Struct({ run: StoredRun }),
  Schema.Struct({ command: CommandRecord }),
  Schema.Struct({ ended: Schema.Literal(true) }),
  Schema.Struct({ unknown: Schema.Literal(true) }),
)
export type RunReply = typeof RunReply.Type

/** The run actor's state: the stored run (absent before `Create`) and its bookkeeping. */
export const RunActorState = Schema.Struct({
  run: Schema.optional(StoredRun),
  /** The next command sequence (from 1). */
  next_sequence: IntAtLeast(1),
  /** Minutes charged so far (1-based, inclusive). */
  charged_through: Count,
  /** Rate and who started it, for ledger entries. */
  rate_usd_nanos_per_gib_hour: Count,
  /** When the machine was ready (ms): commands' deadlines count from then. */
  ready_at: Schema.optional(Schema.Number),
  /** Every command up to this sequence is known to have ended. */
  watched_through: Schema.optionalWith(Count, { default: () => 0 }),
  /** When the `CommandWatch` timer fires (ms), while one is set. */
  watch_at: Schema.optional(Schema.Number),
})
export type RunActorState = typeof RunActorState.Type

export const initialState: RunActorState = {
  next_sequence: 1,
  charged_through: 0,
  rate_usd_nanos_per_gib_hour: 0,
  watched_through: 0,
}

/** The run actor as senders see it; its handler runs in the actors role (`Run.ts`). */
export const Run = ActorDef.make({
  name: "run",
  state: RunActorState,
  initial: initialState,
  message: RunMessage,
  reply: RunReply,
  handler: () => Effect.dieMessage("the run actor's handler runs in the actors role (Run.ts)"),
})

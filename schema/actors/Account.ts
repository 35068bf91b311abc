/**
 * The account actor's contract (type `account`, id = the account id): its messages, replies and
 * stored state. Other roles import this module to send to the actor or read its state; the handler
 * lives in `actors/account/Account.ts` (actors role only).
 *
 *   Adjust            → {balance_usd_nanos}        credit or debit once per `entry_id`
 *   Balance           → {balance_usd_nanos, minimum_balance_usd_nanos, available_usd_nanos}
 *   EnsureWebhookKey  → {public_key: "whpk_…"}     the account's Ed25519 webhook key, made on first use
 *
 *   MayStart          → {ok} | {refused: no_credit | memory_limit}   holds the run's memory when ok
 *   Release           (run actor)  the run ended: its memory hold goes (idempotent by run)
 *   Charge            (run actor)  a `compute` ledger entry for minutes of a run, once per `entry_id`
 */
import { Effect, Schema } from "effect"
import { Count, Timestamp, UsdNanos } from "../Common.ts"
import { Size } from "../Definition.ts"
import { Actor as ActorRef, FunctionId, LedgerEntryId, RunId } from "../Ids.ts"
import * as Actor from "./Actor.ts"

/** Kinds of ledger entry an `Adjust` may write (compute entries come from `Charge`, later). */
export const AdjustKind = Schema.Literal("purchase", "refund", "dispute", "adjustment")
export type AdjustKind = typeof AdjustKind.Type

/**
 * Adds `amount_usd_nanos` (negative debits) to the balance and appends one ledger entry with id
 * `entry_id`; an `entry_id` already applied changes nothing (send it with `msgId: entry_id`).
 */
export const Adjust = Schema.TaggedStruct("Adjust", {
  entry_id: LedgerEntryId,
  kind: AdjustKind,
  amount_usd_nanos: UsdNanos,
  effective_at: Timestamp,
  /** Stored as the entry's `external_reference` (a payment id, a dispute id, an operator's note). */
  reference: Schema.optional(Schema.String),
})
export type Adjust = typeof Adjust.Type

/** Asks for the balance. */
export const Balance = Schema.TaggedStruct("Balance", {})
/** Asks for the webhook public key, creating the key pair on first use. */
export const EnsureWebhookKey = Schema.TaggedStruct("EnsureWebhookKey", {})

/**
 * May this run start? Refused with `no_credit` when the balance is at or below the minimum, with
 * `memory_limit` when the memory held by the account's queued and running runs plus `memory_mib`
 * would pass `limit_mib` (the account's `limits.memory_mib`, sent by the asker). When ok, the
 * memory is held for `run` until `Release` (asking again for the same run answers ok, holds once).
 */
export const MayStart = Schema.TaggedStruct("MayStart", {
  run: RunId,
  memory_mib: Count,
  limit_mib: Count,
})
export type MayStart = typeof MayStart.Type
/** The run no longer holds memory (ended, or never created). */
export const Release = Schema.TaggedStruct("Release", { run: RunId })
/**
 * Debits `amount_usd_nanos` (positive: the amount charged) for minutes `from_minute`…`through_minute`
 * (1-based, inclusive) of a run and appends one `compute` entry with id `entry_id`, once.
 */
export const Charge = Schema.TaggedStruct("Charge", {
  entry_id: LedgerEntryId,
  amount_usd_nanos: Count,
  effective_at: Timestamp,
  run: RunId,
  function: FunctionId,
  version: Count,
  size: Size,
  provider: Schema.String,
  started_by: ActorRef,
  external_reference: Schema.optional(Schema.String),
  from_minute: Count,
  through_minute: Count,
  memory_mib: Count,
  rate_usd_nanos_per_gib_hour: Count,
})
export type Charge = typeof Charge.Type

/** Every message of the account actor. */
export const AccountMessage = Schema.Union(Adjust, Balance, EnsureWebhookKey, MayStart, Release, Charge)
export type AccountMessage = typeof AccountMessage.Type

/** The reply to `Adjust`: the balance after it. */
export const Adjusted = Schema.Struct({ balance_usd_nanos: UsdNanos })
export type Adjusted = typeof Adjusted.Type
/** The reply to `Balance`; `available` = balance − minimum. */
export const BalanceReply = Schema.Struct({
  balance_usd_nanos: UsdNanos,
  minimum_balance_usd_nanos: UsdNanos,
  available_usd_nanos: UsdNanos,
})
export type BalanceReply = typeof BalanceReply.Type
/** The reply to `EnsureWebhookKey`. */
export const WebhookKeyReply = Schema.Struct({ public_key: Schema.String })
export type WebhookKeyReply = typeof WebhookKeyReply.Type

/** The reply to `MayStart`. */
export const MayStartReply = Schema.Union(
  Schema.Struct({ ok: Schema.Literal(true) }),
  Schema.Struct({ refused: Schema.Literal("no_credit", "memory_limit") }),
)
export type MayStartReply = typeof MayStartReply.Type

// Untagged replies decode to the first member that fits, so the widest struct goes first.
/** Every reply of the account actor. */
export const AccountReply = Schema.Union(BalanceReply, WebhookKeyReply, Adjusted, MayStartReply)
export type AccountReply = typeof AccountReply.Type

/** The webhook key pair: the raw 32-byte public key in base64, the PKCS#8 private key sealed (base64). */
export const WebhookKey = Schema.Struct({ public: Schema.String, sealed_private: Schema.String })
export type WebhookKey = typeof WebhookKey.Type

/** How many applied entry ids the state remembers (idempotency beyond the stream's duplicate window). */
export const appliedLimit = 1_000

/** The account actor's state. */
export const AccountActorState = Schema.Struct({
  balance_usd_nanos: UsdNanos,
  minimum_balance_usd_nanos: UsdNanos,
  /** The last `appliedLimit` entry ids applied, oldest first. */
  applied: Schema.Array(Schema.String),
  /** Memory of queued and running runs (the sum of `holds`). */
  memory_held_mib: Count,
  /** Memory held per run (`MayStart` adds, `Release` removes). */
  holds: Schema.optionalWith(Schema.Record({ key: Schema.String, value: Count }), { default: () => ({}) }),
  webhook_key: Schema.optional(WebhookKey),
})
export type AccountActorState = typeof AccountActorState.Type

/** The state of an account that has never been sent anything. */
export const initialState: AccountActorState = {
  balance_usd_nanos: 0,
  minimum_balance_usd_nanos: 0,
  applied: [],
  memory_held_mib: 0,
  holds: {},
}

/** The balance reply for a state. */
export const balanceOf = (s: AccountActorState): BalanceReply => ({
  balance_usd_nanos: s.balance_usd_nanos,
  minimum_balance_usd_nanos: s.minimum_balance_usd_nanos,
  available_usd_nanos: s.balance_usd_nanos - s.minimum_balance_usd_nanos,
})

/** The `whpk_` form of a stored webhook key. */
export const publicKeyOf = (key: WebhookKey): string => `whpk_${key.public}`

/**
 * The account actor as senders and readers see it (`Mailbox.send/ask`, `State.read`): same type
 * name and schemas as the worker's, but its handler only runs in the actors role (`Account.ts`).
 */
export const Account = Actor.make({
  name: "account",
  state: AccountActorState,
  initial: initialState,
  message: AccountMessage,
  reply: AccountReply,
  handler: () => Effect.dieMessage("the account actor's handler runs in the actors role (Account.ts)"),
})

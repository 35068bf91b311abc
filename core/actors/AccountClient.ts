/**
 * What the gateway and operator commands ask of the account actor. Balances are read from the
 * actor's stored record (KV `actors`): the record is written before an `Adjust` is answered, so
 * this is as fresh as an ask, costs one KV read, and works while the actors role restarts. Only a
 * webhook key that does not exist yet needs the actor (`EnsureWebhookKey`).
 */
import { type Duration, Effect, Layer, Option } from "effect"
import {
  Account,
  type AccountActorState,
  type Adjust,
  type AdjustKind,
  type BalanceReply,
  balanceOf,
  initialState,
  type MayStartReply,
  publicKeyOf,
} from "../../schema/actors/Account.ts"
import { timestamp } from "../../schema/Common.ts"
import type { LedgerEntryId, RunId } from "../../schema/Ids.ts"
import { makeId } from "../Ids.ts"
import type { Nats } from "../Nats.ts"
import type { Storage } from "../Storage.ts"
import * as Mailbox from "./Mailbox.ts"
import { ActorSettings } from "./Settings.ts"
import * as State from "./State.ts"

/** A mailbox client with the actor settings from `HANGAR_ACTOR_*` (same partitions as the workers). */
export const mailboxLayer: Layer.Layer<Mailbox.Mailbox, never, Nats | Storage> = Mailbox.layer.pipe(
  Layer.provide(ActorSettings.layerFromEnv),
)

/** The actor's stored state (the initial state for an account never sent anything). */
export const state = (account: string) =>
  Effect.map(State.read(Account, account), (r) =>
    Option.match(r, { onNone: () => initialState, onSome: (x) => x.state as AccountActorState }),
  )

/** The account's balance, minimum and available amount. */
export const balance = (account: string): Effect.Effect<BalanceReply, unknown, Nats | Storage> =>
  Effect.map(state(account), balanceOf)

/** The account's webhook public key (`whpk_…`), asking the actor to make it on first use. */
export const webhookKey = (account: string, timeout: Duration.DurationInput = "5 seconds") =>
  Effect.gen(function* () {
    const s = yield* state(account)
    if (s.webhook_key !== undefined) return publicKeyOf(s.webhook_key)
    const reply = yield* Mailbox.ask(Account, account, { _tag: "EnsureWebhookKey" }, { timeout }).pipe(
      Effect.provide(mailboxLayer),
    )
    if (!("public_key" in reply)) return yield* Effect.dieMessage("EnsureWebhookKey answered without a key")
    return reply.public_key
  })

/** Asks the actor for the balance (what `Balance` answers). */
export const askBalance = (account: string, timeout: Duration.DurationInput = "5 seconds") =>
  Effect.flatMap(Mailbox.ask(Account, account, { _tag: "Balance" }, { timeout }), (reply) =>
    "minimum_balance_usd_nanos" in reply
      ? Effect.succeed(reply as BalanceReply)
      : Effect.dieMessage("Balance answered without a balance"),
  )

/**
 * Sends an `Adjust` with a fresh `led_` id (msgId = entry id) and waits for the new balance.
 * Returns the message sent (its entry) and the balance after it.
 */
export const adjust = (
  account: string,
  kind: AdjustKind,
  amountUsdNanos: number,
  options: { readonly reference?: string; readonly timeout?: Duration.DurationInput } = {},
) =>
  Effect.gen(function* () {
    const message: Adjust = {
      _tag: "Adjust",
      entry_id: makeId("led") as LedgerEntryId,
      kind,
      amount_usd_nanos: amountUsdNanos,
      effective_at: timestamp(Date.now()),
      ...(options.reference === undefined ? {} : { reference: options.reference }),
    }
    const reply = yield* Mailbox.ask(Account, account, message, {
      timeout: options.timeout ?? "10 seconds",
      msgId: message.entry_id,
    })
    if (!("balance_usd_nanos" in reply)) return yield* Effect.dieMessage("Adjust answered without a balance")
    return { message, balance_usd_nanos: reply.balance_usd_nanos }
  })

/**
 * May `run` start with `memoryMib` under the account's memory limit `limitMib`? `{ok: true}` holds
 * the memory for the run until `Release` (asking again for the same run holds once); otherwise
 * `{refused: "no_credit" | "memory_limit"}`.
 */
export const mayStart = (
  account: string,
  run: RunId,
  memoryMib: number,
  limitMib: number,
  timeout: Duration.DurationInput = "5 seconds",
) =>
  Effect.flatMap(
    Mailbox.ask(
      Account,
      account,
      { _tag: "MayStart", run, memory_mib: memoryMib, limit_mib: limitMib },
      { timeout },
    ),
    (reply): Effect.Effect<MayStartReply> =>
      "ok" in reply || "refused" in reply
        ? Effect.succeed(reply as MayStartReply)
        : Effect.dieMessage("MayStart answered without a decision"),
  )

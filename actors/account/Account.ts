/**
 * The account actor's handler (type `account`, id = account id): balance and minimum, the ids of
 * recently applied ledger entries, the memory held by queued and running runs, and the account's
 * webhook key. Contract in `schema/actors/Account.ts`.
 *
 * Memory holds. `MayStart` holds a run's memory (per run, so asking twice holds once) and
 * `Release` drops it (a run never held, or released before, changes nothing). The gateway asks
 * before creating the run; the run actor releases when the run ends. The account's limit comes
 * with the question (it lives in the account record, which the gateway has read anyway).
 *
 * Ledger writes. The runtime's outbox only targets actor mailboxes (a handler returns
 * `Actor.to(...)`), not a plain stream subject like `ledger.<account>`, so `Adjust` and `Charge`
 * (a `compute` debit) append their entry themselves, as the last step of the handler, just before
 * the runtime stores the new state:
 *
 * - the publish carries `Nats-Msg-Id` = `entry_id`, so a handler run again for the same message
 *   (crash or lost lease between publish and state write, a retry) stores nothing new;
 * - the state remembers the last `appliedLimit` entry ids, so an `Adjust` or `Charge` sent twice
 *   (two sends, two msgIds) is applied to the balance once, and publishes nothing the second time;
 * - a publish failure is `Retryable`: the message stays, the balance is unchanged until it works.
 * Readers of the ledger keep the first copy of an id (`core/Ledger.ts`), so even a repeat past
 * the 2-minute duplicate window does not count twice. The order (ledger, then balance) means the
 * ledger may briefly hold an entry the balance does not show yet, never the other way round.
 */
import { createPrivateKey, generateKeyPairSync } from "node:crypto"
import { Data, Effect, Layer } from "effect"
import * as Ledger from "../../core/Ledger.ts"
import { Nats } from "../../core/Nats.ts"
import { Seal, type SealService } from "../../core/Seal.ts"
import { Storage } from "../../core/Storage.ts"
import type { LedgerEntry } from "../../schema/Account.ts"
import {
  type AccountActorState,
  type Adjust,
  appliedLimit,
  balanceOf,
  type Charge,
  Account as Definition,
  publicKeyOf,
  type WebhookKey,
} from "../../schema/actors/Account.ts"
import * as Actor from "../../schema/actors/Actor.ts"
import type { AccountId } from "../../schema/Ids.ts"

export { Account } from "../../schema/actors/Account.ts"

/** What the handler reaches besides its state. */
export interface AccountDeps {
  readonly nats: Nats["Type"]
  readonly storage: Storage["Type"]
  readonly seal: SealService
}

/** An `Adjust` that would take the balance past ±(2^53 − 1) nanodollars; nothing is written. */
export class BalanceOutOfRange extends Data.TaggedError("BalanceOutOfRange")<{
  readonly entry_id: string
  readonly message: string
}> {}

/** Associated data of the sealed webhook private key (binds it to this purpose). */
export const webhookKeyAad = "webhook-key"

/** The ledger entry an `Adjust` writes. */
export const entryOf = (account: string, m: Adjust): LedgerEntry => ({
  id: m.entry_id,
  account: account as AccountId,
  kind: m.kind,
  amount_usd_nanos: m.amount_usd_nanos,
  effective_at: m.effective_at,
  ...(m.reference === undefined ? {} : { external_reference: m.reference }),
})

/** The `compute` ledger entry a `Charge` writes: a debit of `amount_usd_nanos` with the run's fields. */
export const computeEntryOf = (account: string, m: Charge): LedgerEntry => ({
  id: m.entry_id,
  account: account as AccountId,
  kind: "compute",
  amount_usd_nanos: -m.amount_usd_nanos,
  effective_at: m.effective_at,
  run: m.run,
  function: m.function,
  // The run's version is at least 1 (the contract's `Count` is wider than the entry's field).
  version: Math.max(1, m.version),
  size: m.size,
  provider: m.provider,
  started_by: m.started_by,
  ...(m.external_reference === undefined ? {} : { external_reference: m.external_reference }),
  from_minute: Math.max(1, m.from_minute),
  through_minute: Math.max(1, m.through_minute),
  memory_mib: m.memory_mib,
  rate_usd_nanos_per_gib_hour: m.rate_usd_nanos_per_gib_hour,
})

/** A fresh Ed25519 key pair: the raw public key in base64 and the PKCS#8 DER private key. */
const newKeyPair = () => {
  const { publicKey, privateKey } = generateKeyPairSync("ed25519")
  const x = publicKey.export({ format: "jwk" }).x!
  return {
    public: Buffer.from(x, "base64url").toString("base64"),
    private: new Uint8Array(privateKey.export({ format: "der", type: "pkcs8" })),
  }
}

/** Opens the sealed private key of an account's webhook key (for signing webhooks, later). */
export const openWebhookKey = (seal: SealService, account: string, key: WebhookKey) =>
  Effect.map(seal.open(account, webhookKeyAad, Buffer.from(key.sealed_private, "base64")), (der) =>
    createPrivateKey({ key: Buffer.from(der), format: "der", type: "pkcs8" }),
  )

const retryable = (what: string) => (cause: unknown) =>
  new Actor.Retryable({ message: `${what} failed`, cause })

/** The account actor with its dependencies. */
export const make = (deps: AccountDeps) => {
  /**
   * Adds `amount` (negative debits) to the balance and appends `entry`, once per `entryId`: an id
   * already applied changes nothing and answers the current balance.
   */
  const apply = (state: AccountActorState, entryId: string, amount: number, entry: LedgerEntry) =>
    Effect.gen(function* () {
      if (state.applied.includes(entryId))
        return { state, reply: { balance_usd_nanos: state.balance_usd_nanos } }
      const balance = state.balance_usd_nanos + amount
      // Checked before the append, so a refused entry leaves nothing in the ledger.
      if (!Number.isSafeInteger(balance))
        return yield* new BalanceOutOfRange({
          entry_id: entryId,
          message: "the balance would pass the largest safe integer of nanodollars",
        })
      yield* Ledger.append(entry).pipe(
        Effect.provideService(Nats, deps.nats),
        Effect.provideService(Storage, deps.storage),
        Effect.mapError(retryable("ledger append")),
      )
      const next: AccountActorState = {
        ...state,
        balance_usd_nanos: balance,
        applied: [...state.applied, entryId].slice(-appliedLimit),
      }
      return { state: next, reply: { balance_usd_nanos: balance } }
    })

  return Actor.make({
    name: Definition.name,
    state: Definition.state,
    initial: Definition.initial,
    message: Definition.message,
    reply: Definition.reply,
    handler: (state: AccountActorState, message, ctx) =>
      Effect.gen(function* () {
        switch (message._tag) {
          case "Adjust":
            return yield* apply(state, message.entry_id, message.amount_usd_nanos, entryOf(ctx.id, message))
          case "Charge":
            return yield* apply(
              state,
              message.entry_id,
              -message.amount_usd_nanos,
              computeEntryOf(ctx.id, message),
            )
          case "MayStart": {
            // Asking again for a run that holds memory answers ok and holds nothing more.
            if (state.holds[message.run] !== undefined) return { state, reply: { ok: true as const } }
            if (state.balance_usd_nanos <= state.minimum_balance_usd_nanos)
              return { state, reply: { refused: "no_credit" as const } }
            if (state.memory_held_mib + message.memory_mib > message.limit_mib)
              return { state, reply: { refused: "memory_limit" as const } }
            const next: AccountActorState = {
              ...state,
              memory_held_mib: state.memory_held_mib + message.memory_mib,
              holds: { ...state.holds, [message.run]: message.memory_mib },
            }
            return { state: next, reply: { ok: true as const } }
          }
          case "Release": {
            const held = state.holds[message.run]
            if (held === undefined) return { state }
            const { [message.run]: _released, ...holds } = state.holds
            return { state: { ...state, memory_held_mib: Math.max(0, state.memory_held_mib - held), holds } }
          }
          case "Balance":
            return { state, reply: balanceOf(state) }
          case "EnsureWebhookKey": {
            if (state.webhook_key !== undefined)
              return { state, reply: { public_key: publicKeyOf(state.webhook_key) } }
            // A key made here and lost to a failed state write was never shown to anyone.
            const pair = newKeyPair()
            const sealed = yield* deps.seal
              .seal(ctx.id, webhookKeyAad, pair.private)
              .pipe(Effect.mapError(retryable("sealing the webhook key")))
            pair.private.fill(0)
            const webhook_key = {
              public: pair.public,
              sealed_private: Buffer.from(sealed).toString("base64"),
            }
            return { state: { ...state, webhook_key }, reply: { public_key: publicKeyOf(webhook_key) } }
          }
        }
      }),
  })
}

/** The account actor built from the process's connection, storage and seal. */
export const actor = Effect.gen(function* () {
  return make({ nats: yield* Nats, storage: yield* Storage, seal: yield* Seal })
})

/** Builds a layer from the account actor (e.g. `actorLayer((a) => Worker.layer([a]))`). */
export const actorLayer = <A, E, R>(f: (account: ReturnType<typeof make>) => Layer.Layer<A, E, R>) =>
  Layer.unwrapEffect(Effect.map(actor, f))

/**
 * What `GET /v1/account` shows of each account actor's stored state (its balance and webhook key),
 * in memory: a `core/KvCache.ts` over the account actors' records in KV `actors`, kept current by
 * a watch, so the route reads no KV per request. The actor writes its record before it answers, and
 * the watch brings the write here as soon as NATS pushes it: a balance read just after a change
 * made elsewhere is at most that moment behind. Only the shown part of a record is kept (records
 * carry up to a thousand applied entry ids).
 */
import { Context, Effect, Layer, Option, Schema } from "effect"
import * as Kv from "../../core/Kv.ts"
import * as KvCache from "../../core/KvCache.ts"
import type { NatsError } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import {
  Account,
  AccountActorState,
  type BalanceReply,
  balanceOf,
  initialState,
  publicKeyOf,
} from "../../schema/actors/Account.ts"
import { kvKeys } from "../../schema/Subjects.ts"

/** The part of an account actor's state the account route shows. */
export interface Shown {
  readonly balance: BalanceReply
  /** The webhook public key (`whpk_…`), once the actor made it. */
  readonly webhookKey: string | undefined
}

// What is decoded of a stored record (`core/actors/Record.ts`): a struct schema passes over the
// fields it does not name, so the applied ids and the outbox of every watched write are not decoded.
const ShownRecord = Schema.Struct({
  state: AccountActorState.pipe(Schema.pick("balance_usd_nanos", "minimum_balance_usd_nanos", "webhook_key")),
})
type ShownState = Pick<AccountActorState, "balance_usd_nanos" | "minimum_balance_usd_nanos" | "webhook_key">

const shownOf = (state: ShownState): Shown => ({
  // `balanceOf` reads the balance fields only; the rest of a state is not decoded here.
  balance: balanceOf({ ...initialState, ...state }),
  webhookKey: state.webhook_key === undefined ? undefined : publicKeyOf(state.webhook_key),
})

// An account never sent anything has no record: it shows the initial state.
const initial = shownOf(initialState)

/** The account actors' shown states, cached. */
export class AccountStates extends Context.Tag("gateway/AccountStates")<
  AccountStates,
  {
    /** The account's shown state, from memory while the watch is live, else from KV. */
    readonly get: (account: string) => Effect.Effect<Shown, NatsError | Kv.KvValueInvalid>
    /** The same from memory only, synchronously; `undefined` when it would have to read KV. */
    readonly now: (account: string) => Shown | undefined
  }
>() {}

/** Starts the watch on the account actors' records for the life of the layer. */
export const make = Effect.gen(function* () {
  const { names } = yield* Storage
  const records = yield* Kv.make(names.kv.actors.name, ShownRecord)
  const cache = yield* KvCache.make(records, kvKeys.actorsOf(Account.name), (r) => shownOf(r.state))
  return {
    get: (account) =>
      Effect.map(
        cache.get(kvKeys.actor(Account.name, account)),
        Option.getOrElse(() => initial),
      ),
    now: (account) => {
      const known = cache.peek(kvKeys.actor(Account.name, account))
      return known === undefined ? undefined : Option.getOrElse(known, () => initial)
    },
  } satisfies Context.Tag.Service<AccountStates>
})

/** The cache as a layer; needs NATS and the storage map. */
export const layer = Layer.scoped(AccountStates, make)

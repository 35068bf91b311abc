/**
 * `GET /v1/usage`: the account's balance and the last 30 days of its ledger (by `effective_at`),
 * oldest first.
 */
import { Effect } from "effect"
import * as Client from "../../core/actors/AccountClient.ts"
import { both } from "../../core/Concurrent.ts"
import * as Ledger from "../../core/Ledger.ts"
import type { Balance } from "../../schema/Account.ts"
import type { BalanceReply } from "../../schema/actors/Account.ts"
import type { AccountId } from "../../schema/Ids.ts"
import { authRoute } from "../auth/Route.ts"
import { json } from "../Response.ts"

/** How far back `GET /v1/usage` reaches. */
export const usageWindowMs = 30 * 24 * 60 * 60 * 1000

/** The API's `Balance` of an account from what the account actor reports. */
export const apiBalance = (account: AccountId, b: BalanceReply): Balance => ({
  account,
  balance_usd_nanos: b.balance_usd_nanos,
  minimum_balance_usd_nanos: b.minimum_balance_usd_nanos,
  currency: "usd",
  available_usd_nanos: b.available_usd_nanos,
})

/** The API's `Balance` of an account, read from its account actor's stored state. */
export const balanceOf = (account: AccountId) =>
  Effect.map(Client.balance(account), (b) => apiBalance(account, b))

/** The usage route. */
export const routes = [
  authRoute({
    method: "GET",
    path: "/v1/usage",
    access: "person",
    handler: ({ principal }) =>
      Effect.gen(function* () {
        const account = principal.account.id
        const since = Date.now() - usageWindowMs
        const [balance, entries] = yield* both(balanceOf(account), Ledger.read(account, since))
        return json({ balance, entries })
      }),
  }),
]

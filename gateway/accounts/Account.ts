/**
 * `GET /v1/account` and `GET /v1/members`, `DELETE /v1/members/{user}`.
 *
 * The balance and the webhook key come from the account actor (`actors/account`): the balance from
 * its stored state (watched in memory, `States.ts`), the key too once made; a key not made yet is
 * asked for, and left out of the answer if the actor does not answer within a few seconds (the
 * actors role is down or starting).
 */
import { Context, Effect, Option, Schema } from "effect"
import { type AccountRecord, Accounts, computeRate } from "../../core/Accounts.ts"
import * as Client from "../../core/actors/AccountClient.ts"
import type { Role } from "../../schema/Account.ts"
import type { BalanceReply } from "../../schema/actors/Account.ts"
import { ApiError } from "../../schema/Errors.ts"
import { UserId } from "../../schema/Ids.ts"
import type { AccountPerson } from "../auth/Access.ts"
import { KeyCache } from "../auth/KeyCache.ts"
import { authRoute } from "../auth/Route.ts"
import { json, type Reply } from "../Response.ts"
import { AccountStates, type Shown } from "./States.ts"
import { apiBalance } from "./Usage.ts"

const isUserId = Schema.is(UserId)

/** How long a removal waits to see itself in this gateway's membership cache. */
const REMOVE_SETTLE_MS = 2_000

const accountReply = (principal: AccountPerson, balance: BalanceReply, key: Option.Option<string>) => {
  const a = principal.account
  return json({
    id: a.id,
    name: a.name,
    state: a.state,
    limits: a.limits,
    ...(Option.isSome(key) ? { webhook_public_key: key.value } : {}),
    balance: apiBalance(a.id, balance),
    role: principal.role,
    compute_rate_usd_nanos_per_gib_hour: computeRate,
  })
}

// The answer last made from each shown state, with the account record and role it was made for.
// The caches hold one object per stored value, so the same objects are the same answer: a steady
// account's answer is serialized once, not on every request.
const answered = new WeakMap<
  Shown,
  { readonly account: AccountRecord; readonly role: Role; readonly reply: Reply }
>()

/** The account and membership routes. */
export const routes = [
  authRoute({
    method: "GET",
    path: "/v1/account",
    access: "person",
    handler: ({ principal }) =>
      Effect.gen(function* () {
        const a = principal.account
        // One read of the actor's state serves the balance and, once made, the webhook key.
        const shown = yield* (yield* AccountStates).get(a.id)
        const key =
          shown.webhookKey !== undefined
            ? Option.some(shown.webhookKey)
            : yield* Client.webhookKey(a.id).pipe(
                Effect.map(Option.some),
                Effect.catchTag("AskTimeout", () =>
                  Effect.as(
                    Effect.logWarning("account actor did not answer; webhook key left out").pipe(
                      Effect.annotateLogs({ account: a.id }),
                    ),
                    Option.none<string>(),
                  ),
                ),
              )
        return accountReply(principal, shown.balance, key)
      }),
    // From memory once the actor's state is cached and its webhook key made.
    now: ({ principal }, services) => {
      const shown = Context.get(services, AccountStates).now(principal.account.id)
      if (shown === undefined || shown.webhookKey === undefined) return undefined
      const last = answered.get(shown)
      if (last !== undefined && last.account === principal.account && last.role === principal.role)
        return last.reply
      const reply = accountReply(principal, shown.balance, Option.some(shown.webhookKey))
      answered.set(shown, { account: principal.account, role: principal.role, reply })
      return reply
    },
  }),
  authRoute({
    method: "GET",
    path: "/v1/members",
    access: "person",
    handler: ({ principal }) =>
      Effect.map(Accounts, (a) => a.members(principal.account.id)).pipe(
        Effect.flatten,
        Effect.map((members) => json({ members })),
      ),
  }),
  authRoute({
    method: "DELETE",
    path: "/v1/members/:user",
    access: "owner",
    // Removing people reduces access, which a suspended account may still want.
    whileSuspended: true,
    handler: ({ principal, params }) =>
      Effect.gen(function* () {
        if (!isUserId(params.user)) return yield* Effect.fail(ApiError.notFound("member"))
        const accounts = yield* Accounts
        yield* accounts.removeMember(principal.account.id, params.user)
        // Answered once this gateway's membership cache has it, as a key revocation is (Keys.ts):
        // the removed person's next request is refused.
        yield* (yield* KeyCache).memberGone(principal.account.id, params.user, REMOVE_SETTLE_MS)
        return json({ removed: params.user })
      }),
  }),
]

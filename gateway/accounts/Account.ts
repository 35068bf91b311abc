/**
 * `GET /v1/account` and `GET /v1/members`, `DELETE /v1/members/{user}`.
 *
 * The balance is a placeholder until the ledger and the account actor exist: every amount is 0
 * (no credit can be bought yet). `webhook_public_key` is left out until account webhook keys exist.
 */
import { Effect, Schema } from "effect"
import { Accounts, computeRate } from "../../core/Accounts.ts"
import { ApiError } from "../../schema/Errors.ts"
import { UserId } from "../../schema/Ids.ts"
import { authRoute } from "../auth/Route.ts"
import { json } from "../Response.ts"

const isUserId = Schema.is(UserId)

/** The account and membership routes. */
export const routes = [
  authRoute({
    method: "GET",
    path: "/v1/account",
    access: "person",
    handler: ({ principal }) => {
      const a = principal.account
      return Effect.succeed(
        json({
          id: a.id,
          name: a.name,
          state: a.state,
          limits: a.limits,
          ...(a.webhook_public_key === undefined ? {} : { webhook_public_key: a.webhook_public_key }),
          balance: {
            account: a.id,
            balance_usd_nanos: 0,
            minimum_balance_usd_nanos: 0,
            currency: "usd",
            available_usd_nanos: 0,
          },
          role: principal.role,
          compute_rate_usd_nanos_per_gib_hour: computeRate,
        }),
      )
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
        return json({ removed: params.user })
      }),
  }),
]

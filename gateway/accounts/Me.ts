/**
 * `GET /v1/me` and `POST /v1/invites/{account}/accept`: what a signed-in person sees outside any
 * account. Accepting needs an invite for the person's e-mail that has not expired.
 */
import { Effect, Option, Schema } from "effect"
import { Accounts } from "../../core/Accounts.ts"
import { both } from "../../core/Concurrent.ts"
import type { Me } from "../../schema/Account.ts"
import { ApiError } from "../../schema/Errors.ts"
import { AccountId } from "../../schema/Ids.ts"
import { authRoute } from "../auth/Route.ts"
import { json } from "../Response.ts"

const isAccountId = Schema.is(AccountId)

/** The person's own routes. */
export const routes = [
  authRoute({
    method: "GET",
    path: "/v1/me",
    access: "signed in",
    handler: ({ principal }) =>
      Effect.gen(function* () {
        const accounts = yield* Accounts
        const [memberships, invites] = yield* both(
          accounts.memberships(principal.user),
          accounts.invitesFor(principal.email),
        )
        const listed = yield* Effect.forEach(
          memberships,
          (m) =>
            Effect.map(accounts.account(m.account), (a) =>
              Option.map(a, (acc) => ({ account: acc.id, name: acc.name, state: acc.state, role: m.role })),
            ),
          { concurrency: 8 },
        )
        const me: Me = {
          user: principal.user,
          email: principal.email,
          accounts: listed.flatMap((o) => (Option.isSome(o) ? [o.value] : [])),
          invites,
        }
        return json(me)
      }),
  }),
  authRoute({
    method: "POST",
    // The router needs one parameter name per position: `/v1/invites/:invite` names an e-mail.
    path: "/v1/invites/:invite/accept",
    access: "signed in",
    // Suspension is checked against the account in the path, not a Service-Account header.
    whileSuspended: true,
    handler: ({ principal, params }) =>
      Effect.gen(function* () {
        if (!isAccountId(params.invite)) return yield* Effect.fail(ApiError.notFound("invite"))
        const accounts = yield* Accounts
        const user = yield* accounts.ensureUser(principal.email)
        return json(yield* accounts.acceptInvite(params.invite, user))
      }),
  }),
]

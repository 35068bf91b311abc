/**
 * `GET /v1/invites`, `POST /v1/invites`, `DELETE /v1/invites/{email}` (owners). An invite lasts 7
 * days; expired ones are neither listed nor cancellable (404), even before KV's max age drops them.
 */
import { Effect } from "effect"
import { Accounts } from "../../core/Accounts.ts"
import { CreateInviteRequest } from "../../schema/Account.ts"
import { authRoute } from "../auth/Route.ts"
import { json } from "../Response.ts"

/** Request bodies of these routes are small; 16 KiB is far above any valid one. */
export const inviteBodyLimit = 16 * 1024

/** The invite routes. */
export const routes = [
  authRoute({
    method: "GET",
    path: "/v1/invites",
    access: "owner",
    handler: ({ principal }) =>
      Effect.flatMap(Accounts, (a) => a.invites(principal.account.id)).pipe(
        Effect.map((invites) => json({ invites })),
      ),
  }),
  authRoute({
    method: "POST",
    path: "/v1/invites",
    access: "owner",
    body: CreateInviteRequest,
    bodyLimit: inviteBodyLimit,
    handler: ({ principal, body }) =>
      Effect.flatMap(Accounts, (a) =>
        a.invite(principal.account, body.email, body.role, principal.user),
      ).pipe(Effect.map((invite) => json(invite, { status: 201 }))),
  }),
  authRoute({
    method: "DELETE",
    path: "/v1/invites/:invite",
    access: "owner",
    whileSuspended: true,
    handler: ({ principal, params }) =>
      Effect.flatMap(Accounts, (a) => a.cancelInvite(principal.account.id, params.invite)).pipe(
        Effect.as(json({ cancelled: params.invite.toLowerCase() })),
      ),
  }),
]

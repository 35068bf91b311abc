/**
 * `GET /v1/keys`, `POST /v1/keys`, `DELETE /v1/keys/{id}` (owners). The token is returned once by
 * `POST`; only its SHA-256 is stored. Revoking is idempotent and reaches every gateway at once
 * through the key cache's watch.
 */
import { Effect, Schema } from "effect"
import { Accounts } from "../../core/Accounts.ts"
import { makeId } from "../../core/Ids.ts"
import { hashToken, newToken } from "../../core/KeyTokens.ts"
import { CreateKeyRequest, type Key } from "../../schema/Account.ts"
import { timestamp } from "../../schema/Common.ts"
import { ApiError } from "../../schema/Errors.ts"
import { KeyId } from "../../schema/Ids.ts"
import { KeyCache } from "../auth/KeyCache.ts"
import { authRoute } from "../auth/Route.ts"
import { json } from "../Response.ts"

/** Request bodies of these routes are small; 16 KiB is far above any sensible one. */
export const keyBodyLimit = 16 * 1024

const isKeyId = Schema.is(KeyId)

/** How long a revocation waits to see itself in this gateway's key cache. */
const REVOKE_SETTLE_MS = 2_000

/** The key routes. */
export const routes = [
  authRoute({
    method: "GET",
    path: "/v1/keys",
    access: "owner",
    handler: ({ principal }) =>
      Effect.flatMap(Accounts, (a) => a.keys(principal.account.id)).pipe(
        Effect.map((keys) => json({ keys })),
      ),
  }),
  authRoute({
    method: "POST",
    path: "/v1/keys",
    access: "owner",
    // The token is shown once: an Idempotency-Key retry is refused, never answered it again.
    answerHoldsSecret: true,
    body: CreateKeyRequest,
    bodyLimit: keyBodyLimit,
    handler: ({ principal, body }) =>
      Effect.gen(function* () {
        const accounts = yield* Accounts
        const token = newToken()
        const key: Key = {
          id: makeId("key") as KeyId,
          account: principal.account.id,
          name: body.name,
          scope: body.scope,
          functions: body.scope === "admin" ? ["*"] : [...(body.functions ?? [])],
          created_at: timestamp(Date.now()),
          created_by: principal.user,
        }
        yield* accounts.createKey(key, hashToken(token))
        return json({ key, token }, { status: 201 })
      }),
  }),
  authRoute({
    method: "DELETE",
    path: "/v1/keys/:id",
    access: "owner",
    // Revoking must work most of all when something is wrong with the account.
    whileSuspended: true,
    handler: ({ principal, params }) =>
      Effect.gen(function* () {
        if (!isKeyId(params.id)) return yield* Effect.fail(ApiError.notFound("key"))
        const accounts = yield* Accounts
        const { hash } = yield* accounts.revokeKey(principal.account.id, params.id, principal.user)
        // Answered once this gateway's key cache has it. The other gateways' watches get the
        // change from the server at the same moment, so the caller's next request, wherever it
        // lands, finds the key revoked (unless that gateway's process is far behind on its events).
        yield* (yield* KeyCache).revoked(hash, REVOKE_SETTLE_MS)
        return json({ revoked: params.id })
      }),
  }),
]

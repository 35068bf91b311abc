/**
 * `POST /v1/cli-logins` and `GET /v1/cli-logins/{id}` (anyone, spec "Authentication" 7), and the
 * approval the spec leaves open (DESIGN.md decision): `POST /v1/cli-logins/{id}/approve`, owners
 * only (only owners create keys), body `{code}` — the code the console showed and the person
 * compared with the CLI's — in the account named by `Service-Account`. It answers 200 with the
 * login as `GET` reads it.
 */
import { Effect, Schema } from "effect"
import { CliLogin, CliLoginCreated, CliLoginRequest } from "../../schema/Account.ts"
import { NonEmptyString } from "../../schema/Common.ts"
import { authRoute } from "../auth/Route.ts"
import { documented } from "../openapi/OpenApi.ts"
import { json } from "../Response.ts"
import { CliLoginSettings, CliLogins } from "./CliLogins.ts"

/** Bodies of these routes are tiny. */
export const loginBodyLimit = 4 * 1024

/** `POST /v1/cli-logins/{id}/approve`: the code shown with the login. */
export const ApproveRequest = Schema.Struct({
  code: NonEmptyString.pipe(Schema.maxLength(32, { message: () => "must be at most 32 characters" })),
}).annotations({ identifier: "ApproveCliLoginRequest" })

/** The login routes. */
export const routes = [
  documented(
    authRoute({
      method: "POST",
      path: "/v1/cli-logins",
      access: "anyone",
      body: CliLoginRequest,
      bodyLimit: loginBodyLimit,
      handler: ({ body }) =>
        Effect.gen(function* () {
          const logins = yield* CliLogins
          const { consoleUrl } = yield* CliLoginSettings.Tag
          const r = yield* logins.create(body)
          const url = `${consoleUrl.replace(/\/+$/, "")}/cli-logins/${r.id}?code=${encodeURIComponent(r.code)}`
          return json({ id: r.id, code: r.code, url, expires_at: r.expires_at }, { status: 201 })
        }),
    }),
    {
      summary: "Start a CLI login with the SHA-256 of the key the CLI made",
      body: CliLoginRequest,
      response: { status: 201, schema: CliLoginCreated },
    },
  ),
  documented(
    authRoute({
      method: "GET",
      path: "/v1/cli-logins/:id",
      access: "anyone",
      handler: ({ params }) =>
        Effect.flatMap(CliLogins, (l) => l.read(params.id)).pipe(Effect.map((v) => json(v))),
    }),
    {
      summary: "Read a CLI login: pending, approved (with account and key) or expired",
      response: { status: 200, schema: CliLogin },
    },
  ),
  documented(
    authRoute({
      method: "POST",
      path: "/v1/cli-logins/:id/approve",
      access: "owner",
      body: ApproveRequest,
      bodyLimit: loginBodyLimit,
      handler: ({ params, body, principal }) =>
        Effect.flatMap(CliLogins, (l) =>
          l.approve(params.id, body.code, { account: principal.account.id, user: principal.user }),
        ).pipe(Effect.map((v) => json(v))),
    }),
    {
      summary:
        "Approve a CLI login with the code the console showed: makes an admin key named after the machine",
      body: ApproveRequest,
      response: { status: 200, schema: CliLogin },
    },
  ),
]

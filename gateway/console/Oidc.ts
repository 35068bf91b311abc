/**
 * Console sign-in through the configured OIDC issuer (`HANGAR_OIDC_ISSUER`): the authorization-code
 * flow with PKCE (S256) and a nonce.
 *
 * - `GET /console/oidc/start`: a fresh state, PKCE verifier and nonce (stored hashed by state in KV
 *   `console`, 10 minutes, used once), then `303` to the issuer's authorization endpoint (from its
 *   discovery document) for `openid email`, client id `HANGAR_OIDC_AUDIENCE`, redirect
 *   `<console URL>/console/oidc/callback`;
 * - `GET /console/oidc/callback?code&state`: uses the state once, trades the code and the verifier
 *   at the token endpoint (with `HANGAR_OIDC_CLIENT_SECRET` when set), verifies the ID token exactly
 *   as the API does (`IdTokens`: signature, issuer, audience, expiry, verified email) and its nonce,
 *   then makes a session as a console link does. Any failure lands on `/sign-in?problem=oidc`.
 *
 * In local mode (no issuer) both answer `404`, and people sign in with links.
 */
import { createHash, randomBytes } from "node:crypto"
import { Data, Effect, Redacted } from "effect"
import { decodeJwt } from "jose"
import { ConsoleSessions, ConsoleSettings } from "../../core/ConsoleSessions.ts"
import { IssuerSettings } from "../../core/LocalIssuer.ts"
import { ApiError } from "../../schema/Errors.ts"
import { IdTokens } from "../auth/IdTokens.ts"
import { error, json } from "../Response.ts"
import { route } from "../Router.ts"
import { redirect, secureCookie, sessionCookie } from "./Cookies.ts"

/** A step of the OIDC sign-in that failed (logged; the person sees the sign-in page). */
export class OidcFailed extends Data.TaggedError("OidcFailed")<{ readonly message: string }> {}

const fail = (message: string) => new OidcFailed({ message })

const STATE_MS = 10 * 60_000

interface Endpoints {
  readonly authorization: string
  readonly token: string
}

let discovered: { readonly issuer: string; readonly endpoints: Promise<Endpoints> } | undefined

/** The issuer's endpoints from its discovery document, fetched once per process (again after a failure). */
const endpointsOf = (issuer: string): Promise<Endpoints> => {
  if (discovered?.issuer === issuer) return discovered.endpoints
  const endpoints = fetch(`${issuer.replace(/\/$/, "")}/.well-known/openid-configuration`)
    .then(async (res) => {
      if (!res.ok) throw fail(`discovery answered ${res.status}`)
      const doc = (await res.json()) as { authorization_endpoint?: unknown; token_endpoint?: unknown }
      if (typeof doc.authorization_endpoint !== "string" || typeof doc.token_endpoint !== "string")
        throw fail("the discovery document names no authorization or token endpoint")
      return { authorization: doc.authorization_endpoint, token: doc.token_endpoint }
    })
    .catch((e) => {
      discovered = undefined
      throw e
    })
  discovered = { issuer, endpoints }
  return endpoints
}

const b64url = (bytes: Buffer) => bytes.toString("base64url")

/** The cookie that ties a sign-in under way to the browser that started it. */
const STATE_COOKIE = "hangar_oidc_state"
const stateCookie = (state: string, secure: boolean) =>
  `${STATE_COOKIE}=${state}; Path=/console/oidc; HttpOnly; SameSite=Lax; Max-Age=${STATE_MS / 1000}${secure ? "; Secure" : ""}`
const stateOf = (cookie: string | undefined): string | undefined => {
  for (const part of (cookie ?? "").split(";")) {
    const [name, value] = part.trim().split("=", 2)
    if (name === STATE_COOKIE) return value
  }
  return undefined
}
const callbackOf = (consoleUrl: string) => `${consoleUrl.replace(/\/+$/, "")}/console/oidc/callback`
const failed = redirect("/sign-in?problem=oidc")

/** The OIDC routes, and what the sign-in page asks to know which way to offer. */
export const routes = [
  route({
    method: "GET",
    path: "/console/config",
    storeless: true,
    handler: () =>
      Effect.map(IssuerSettings.Tag, (s) =>
        json({ oidc: s.issuer !== "", issuer: s.issuer }, { headers: { "cache-control": "no-store" } }),
      ),
  }),
  route({
    method: "GET",
    path: "/console/oidc/start",
    handler: () =>
      Effect.gen(function* () {
        const issuer = yield* IssuerSettings.Tag
        if (issuer.issuer === "") return error(ApiError.notFound())
        const settings = yield* ConsoleSettings.Tag
        const endpoints = yield* Effect.tryPromise({
          try: () => endpointsOf(issuer.issuer),
          catch: (e) => fail(String(e)),
        })
        const verifier = b64url(randomBytes(32))
        const nonce = b64url(randomBytes(32))
        const state = yield* (yield* ConsoleSessions).createState(verifier, nonce, STATE_MS)
        const url = new URL(endpoints.authorization)
        url.searchParams.set("response_type", "code")
        url.searchParams.set("client_id", issuer.audience)
        url.searchParams.set("redirect_uri", callbackOf(settings.consoleUrl))
        url.searchParams.set("scope", "openid email")
        url.searchParams.set("state", state)
        url.searchParams.set("nonce", nonce)
        url.searchParams.set("code_challenge", b64url(createHash("sha256").update(verifier).digest()))
        url.searchParams.set("code_challenge_method", "S256")
        // The state is also kept in this browser, so a callback made for another browser (an
        // attacker's own sign-in, sent to a victim) signs nobody in here.
        return redirect(url.href, { "set-cookie": stateCookie(state, secureCookie(settings.consoleUrl)) })
      }).pipe(
        Effect.catchTag("OidcFailed", (e) =>
          Effect.as(Effect.logError("console OIDC sign-in could not start", e), failed),
        ),
      ),
  }),
  route({
    method: "GET",
    path: "/console/oidc/callback",
    handler: ({ query, headers }) =>
      Effect.gen(function* () {
        const issuer = yield* IssuerSettings.Tag
        if (issuer.issuer === "") return error(ApiError.notFound())
        const settings = yield* ConsoleSettings.Tag
        const sessions = yield* ConsoleSessions
        if (query.error !== undefined) return yield* fail(`the issuer answered ${query.error}`)
        if (query.state === undefined || stateOf(headers.cookie) !== query.state)
          return yield* fail("the callback's state is not the one this browser started")
        const state = yield* sessions.useState(query.state)
        if (typeof state === "string") return yield* fail(`state ${state}`)
        const code = query.code ?? ""
        if (code === "") return yield* fail("the callback carries no code")
        const endpoints = yield* Effect.tryPromise({
          try: () => endpointsOf(issuer.issuer),
          catch: (e) => fail(String(e)),
        })
        const form = new URLSearchParams({
          grant_type: "authorization_code",
          code,
          redirect_uri: callbackOf(settings.consoleUrl),
          client_id: issuer.audience,
          code_verifier: state.verifier,
        })
        const secret = Redacted.value(settings.oidcClientSecret)
        if (secret !== "") form.set("client_secret", secret)
        const answer = yield* Effect.tryPromise({
          try: async () => {
            const res = await fetch(endpoints.token, {
              method: "POST",
              headers: { "content-type": "application/x-www-form-urlencoded", accept: "application/json" },
              body: form,
            })
            if (!res.ok) throw fail(`the token endpoint answered ${res.status}`)
            return (await res.json()) as { id_token?: unknown }
          },
          catch: (e) => (e instanceof OidcFailed ? e : fail(String(e))),
        })
        if (typeof answer.id_token !== "string") return yield* fail("the token answer has no id_token")
        const identity = yield* Effect.mapError((yield* IdTokens).verify(answer.id_token), (e) =>
          fail(`the ID token was refused: ${e.message}`),
        )
        if (decodeJwt(answer.id_token).nonce !== state.nonce)
          return yield* fail("the ID token's nonce is not the one sent")
        const sessionId = yield* sessions.createSession(identity.email, settings.sessionMs)
        yield* Effect.logInfo("console sign-in").pipe(
          Effect.annotateLogs({ email: identity.email, via: "oidc" }),
        )
        // The state cookie is left to end by itself: it lives 10 minutes and names a used state.
        return redirect("/", { "set-cookie": sessionCookie(sessionId, settings) })
      }).pipe(
        Effect.catchTag("OidcFailed", (e) =>
          Effect.as(Effect.logWarning("console OIDC sign-in refused", e.message), failed),
        ),
      ),
  }),
]

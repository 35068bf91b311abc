/**
 * The web console's own routes (issue 26), outside `/v1`: its pages and assets, and sign-in,
 * session and sign-out. Everything else the console does goes through the public API with the
 * session cookie standing for the person (`gateway/auth/Auth.ts`), so it can never do more than
 * that person may.
 *
 * - `GET /`, `/runs`, `/runs/:id`, `/cli-logins/:id`, … : the one page (the front end routes by
 *   path), `no-cache`, with a strict Content-Security-Policy (scripts and styles from this origin
 *   only: no inline script, no `eval`);
 * - `GET /assets/:file`: hashed bundle files, cached for a year (`immutable`);
 * - `GET /console/sign-in?link=…`: uses a one-time link (`hangar admin console-link`), sets the
 *   session cookie and sends the browser home; a used, expired or unknown link goes to the sign-in
 *   page saying which;
 * - `GET /console/session`: the signed-in person and the session's CSRF token, or 401;
 * - `POST /console/sign-out` (with the CSRF token): ends the session and clears the cookie;
 * - the OIDC sign-in (`Oidc.ts`) when an issuer is configured.
 */
import { Effect, Option } from "effect"
import {
  ConsoleSessions,
  ConsoleSettings,
  CSRF_HEADER,
  csrfMatches,
  csrfOf,
  sessionIdOf,
} from "../../core/ConsoleSessions.ts"
import { relayUrlOf, TerminalSettings } from "../../core/TerminalSettings.ts"
import { ApiError } from "../../schema/Errors.ts"
import { bytes, error, json } from "../Response.ts"
import { route } from "../Router.ts"
import { ConsoleAssets } from "./Assets.ts"
import { clearedCookie, redirect, sessionCookie } from "./Cookies.ts"
import * as Oidc from "./Oidc.ts"

/** The pages the front end draws; each answers the same HTML. */
export const pagePaths = [
  "/",
  "/sign-in",
  "/runs",
  "/runs/:id",
  "/runs/:id/terminal",
  "/cli-logins/:id",
  "/keys",
  "/members",
  "/functions",
  "/functions/:id",
  "/providers",
  "/usage",
  "/credit",
] as const

/**
 * The Content-Security-Policy of a page: scripts from this origin only (no inline script, no
 * `eval`), connections to this origin and the terminal relay only. Styles too come from this
 * origin only, except on the terminal's page, where xterm.js writes `<style>` elements.
 */
export const contentSecurityPolicy = (relayUrl: string, inlineStyles: boolean) => {
  let relay = ""
  try {
    relay = new URL(relayUrl).origin
  } catch {
    relay = ""
  }
  return [
    "default-src 'none'",
    "script-src 'self'",
    `style-src 'self'${inlineStyles ? " 'unsafe-inline'" : ""}`,
    "img-src 'self' data:",
    "font-src 'self'",
    `connect-src 'self'${relay === "" || relay === "null" ? "" : ` ${relay}`}`,
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
  ].join("; ")
}

const pageHeaders = (csp: string) => ({
  "cache-control": "no-cache",
  "content-security-policy": csp,
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "x-frame-options": "DENY",
})

const assetHeaders = {
  "cache-control": "public, max-age=31536000, immutable",
  "x-content-type-options": "nosniff",
}

const page = (path: string) =>
  Effect.gen(function* () {
    const built = yield* Effect.orDie(Effect.flatMap(ConsoleAssets, (a) => a.built))
    const relay = relayUrlOf(yield* TerminalSettings.Tag)
    const csp = contentSecurityPolicy(relay, path.endsWith("/terminal"))
    return bytes(built.html, { contentType: "text/html; charset=utf-8", headers: pageHeaders(csp) })
  })

/** The console's routes. */
export const routes = [
  ...pagePaths.map((path) => route({ method: "GET", path, storeless: true, handler: () => page(path) })),
  route({
    method: "GET",
    path: "/assets/:file",
    storeless: true,
    handler: ({ params }) =>
      Effect.flatMap(ConsoleAssets, (a) => a.built).pipe(
        Effect.orDie,
        Effect.map((built) => {
          const asset = built.assets.get(params.file)
          return asset === undefined
            ? error(ApiError.notFound("asset"))
            : bytes(asset.body, { contentType: asset.contentType, headers: assetHeaders })
        }),
      ),
  }),
  route({
    method: "GET",
    path: "/console/sign-in",
    handler: ({ query }) =>
      Effect.gen(function* () {
        const sessions = yield* ConsoleSessions
        const settings = yield* ConsoleSettings.Tag
        const used = yield* sessions.useLink(query.link ?? "", settings.sessionMs)
        if (typeof used === "string") return redirect(`/sign-in?problem=${used}`)
        yield* Effect.logInfo("console sign-in").pipe(Effect.annotateLogs({ email: used.email, via: "link" }))
        return redirect("/", { "set-cookie": sessionCookie(used.sessionId, settings) })
      }),
  }),
  route({
    method: "GET",
    path: "/console/session",
    handler: ({ headers }) =>
      Effect.gen(function* () {
        const id = sessionIdOf(headers.cookie)
        if (id === undefined) return error(ApiError.unauthenticated("not signed in"))
        const email = yield* (yield* ConsoleSessions).session(id)
        if (Option.isNone(email)) return error(ApiError.unauthenticated("the console session has ended"))
        return json({ email: email.value, csrf: csrfOf(id) }, { headers: { "cache-control": "no-store" } })
      }),
  }),
  route({
    method: "POST",
    path: "/console/sign-out",
    handler: ({ headers }) =>
      Effect.gen(function* () {
        const id = sessionIdOf(headers.cookie)
        if (id === undefined) return error(ApiError.unauthenticated("not signed in"))
        if (!csrfMatches(id, headers[CSRF_HEADER])) return error(ApiError.csrfToken())
        yield* (yield* ConsoleSessions).end(id)
        const settings = yield* ConsoleSettings.Tag
        return json({ signed_out: true }, { headers: { "set-cookie": clearedCookie(settings) } })
      }),
  }),
  ...Oidc.routes,
]

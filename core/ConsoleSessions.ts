/**
 * The web console's sign-in links and sessions (issue 26), in KV `console`. Only hashes of the
 * secrets are stored, so a copy of the bucket signs nobody in:
 *
 * - `link.<sha256 hex of the link secret>` → `{email, expires_at_ms, used}`: made by `hangar admin
 *   console-link`, used once (compare-and-set from unused to used: of two openings at once, one wins);
 * - `session.<sha256 hex of the session id>` → `{email, expires_at_ms}`: made when a link is used
 *   (or an OIDC sign-in ends), deleted on sign-out, refused once past its expiry (and aged out of
 *   the bucket later);
 * - `oidc.<sha256 hex of the state>` → `{verifier, nonce, expires_at_ms, used}`: an OIDC sign-in
 *   under way (authorization code with PKCE), used once by its callback.
 *
 * The session id travels only in the `HttpOnly` cookie. The CSRF token the console sends with each
 * request that changes something is derived from the session id (`csrfOf`): a page that cannot read
 * the cookie cannot compute it, and the token does not reveal the id.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto"
import { Clock, Context, Effect, Layer, Option, Redacted, Schema } from "effect"
import { defineSettings, env } from "./Config.ts"
import * as Kv from "./Kv.ts"
import type { Nats, NatsError } from "./Nats.ts"
import { Storage } from "./Storage.ts"

/** The console's address and how long its links and sessions last. */
export const ConsoleSettings = defineSettings(
  "hangar/ConsoleSettings",
  {
    /** Where people open the console (links printed by `hangar admin console-link` start with it). */
    consoleUrl: "http://127.0.0.1:8080",
    /** How long a sign-in link may wait to be opened (10 minutes). */
    linkMs: 600_000,
    /** How long a session lasts from sign-in (12 hours). */
    sessionMs: 12 * 3600_000,
    /** The console's client secret at the OIDC issuer, if it has one (PKCE is used either way). */
    oidcClientSecret: Redacted.make(""),
  } as {
    readonly consoleUrl: string
    readonly linkMs: number
    readonly sessionMs: number
    readonly oidcClientSecret: Redacted.Redacted<string>
  },
  (d) => ({
    consoleUrl: env.string("CONSOLE_URL", d.consoleUrl),
    linkMs: env.integer("CONSOLE_LINK_MS", d.linkMs),
    sessionMs: env.integer("CONSOLE_SESSION_MS", d.sessionMs),
    oidcClientSecret: env.redacted("OIDC_CLIENT_SECRET", ""),
  }),
)

/** A stored link or session. */
export const ConsoleRecord = Schema.Struct({
  email: Schema.String,
  expires_at_ms: Schema.Number,
  used: Schema.optional(Schema.Boolean),
  /** An OIDC sign-in's PKCE verifier and nonce. */
  verifier: Schema.optional(Schema.String),
  nonce: Schema.optional(Schema.String),
})
export type ConsoleRecord = typeof ConsoleRecord.Type

/** The cookie that carries the session id. */
export const SESSION_COOKIE = "hangar_session"
/** The header that carries the CSRF token on requests that change something. */
export const CSRF_HEADER = "x-csrf-token"

const sha256hex = (s: string) => createHash("sha256").update(s).digest("hex")
const secret = () => randomBytes(32).toString("base64url")
const secretShape = /^[A-Za-z0-9_-]{43}$/

/** The CSRF token of a session id. */
export const csrfOf = (sessionId: string): string =>
  createHash("sha256").update(`hangar-console-csrf\0${sessionId}`).digest("base64url")

/** Whether `token` is the CSRF token of `sessionId` (constant time). */
export const csrfMatches = (sessionId: string, token: string | undefined): boolean => {
  if (token === undefined) return false
  const want = Buffer.from(csrfOf(sessionId))
  const got = Buffer.from(token)
  return want.length === got.length && timingSafeEqual(want, got)
}

/** The session id in a `Cookie` header, when it has one of the right shape. */
export const sessionIdOf = (cookie: string | undefined): string | undefined => {
  if (cookie === undefined) return undefined
  for (const part of cookie.split(";")) {
    const [name, value] = part.trim().split("=", 2)
    if (name === SESSION_COOKIE && value !== undefined && secretShape.test(value)) return value
  }
  return undefined
}

/** The key of a session id in the bucket. */
export const sessionKey = (sessionId: string) => `session.${sha256hex(sessionId)}`

type StoreError = NatsError | Kv.KvValueInvalid

/** Why a link did not sign anyone in. */
export type LinkRefused = "unknown" | "used" | "expired"

/** The console's sign-in store. */
export class ConsoleSessions extends Context.Tag("hangar/ConsoleSessions")<
  ConsoleSessions,
  {
    /** Makes a one-time link secret for `email`, valid `validMs`. */
    readonly createLink: (
      email: string,
      validMs: number,
    ) => Effect.Effect<string, StoreError | Kv.StateConflict>
    /**
     * Uses a link once: answers a new session id for its person, valid `sessionMs`, or why not.
     * Two uses at once: the compare-and-set lets one through.
     */
    readonly useLink: (
      link: string,
      sessionMs: number,
    ) => Effect.Effect<
      { readonly sessionId: string; readonly email: string } | LinkRefused,
      StoreError | Kv.StateConflict
    >
    /** Makes a session for `email`, valid `sessionMs`; answers its id. */
    readonly createSession: (
      email: string,
      sessionMs: number,
    ) => Effect.Effect<string, StoreError | Kv.StateConflict>
    /** Starts an OIDC sign-in: a fresh state, stored with its PKCE verifier and nonce for `validMs`. */
    readonly createState: (
      verifier: string,
      nonce: string,
      validMs: number,
    ) => Effect.Effect<string, StoreError | Kv.StateConflict>
    /** Uses an OIDC state once: its verifier and nonce, or why not. */
    readonly useState: (
      state: string,
    ) => Effect.Effect<
      { readonly verifier: string; readonly nonce: string } | LinkRefused,
      StoreError | Kv.StateConflict
    >
    /** The person of a live session, or none (unknown, signed out or expired). */
    readonly session: (sessionId: string) => Effect.Effect<Option.Option<string>, StoreError>
    /** Ends a session (idempotent). */
    readonly end: (sessionId: string) => Effect.Effect<void, NatsError | Kv.StateConflict>
    /** The bucket (tests move expiries into the past). */
    readonly kv: Kv.Kv<ConsoleRecord>
  }
>() {}

/** Builds the store over KV `console`. */
export const make = Effect.gen(function* () {
  const { names } = yield* Storage
  const kv = yield* Kv.make(names.kv.console.name, ConsoleRecord)

  const createLink: Context.Tag.Service<ConsoleSessions>["createLink"] = (email, validMs) =>
    Effect.gen(function* () {
      const link = secret()
      const now = yield* Clock.currentTimeMillis
      yield* kv.create(`link.${sha256hex(link)}`, { email, expires_at_ms: now + validMs })
      return link
    })

  // Uses a stored one-time record once: a second use at once loses the compare-and-set.
  const useOnce = (key: string) =>
    Effect.gen(function* () {
      const found = yield* kv.get(key)
      if (Option.isNone(found)) return "unknown" as const
      const record = found.value.value
      if (record.used === true) return "used" as const
      const now = yield* Clock.currentTimeMillis
      if (now >= record.expires_at_ms) return "expired" as const
      const won = yield* kv.update(key, { ...record, used: true }, found.value.revision).pipe(
        Effect.as(true),
        Effect.catchTag("StateConflict", () => Effect.succeed(false)),
      )
      return won ? record : ("used" as const)
    })

  const createSession: Context.Tag.Service<ConsoleSessions>["createSession"] = (email, sessionMs) =>
    Effect.gen(function* () {
      const sessionId = secret()
      const now = yield* Clock.currentTimeMillis
      yield* kv.create(sessionKey(sessionId), { email, expires_at_ms: now + sessionMs })
      return sessionId
    })

  const useLink: Context.Tag.Service<ConsoleSessions>["useLink"] = (link, sessionMs) =>
    Effect.gen(function* () {
      if (!secretShape.test(link)) return "unknown" as const
      const record = yield* useOnce(`link.${sha256hex(link)}`)
      if (typeof record === "string") return record
      return { sessionId: yield* createSession(record.email, sessionMs), email: record.email }
    })

  const createState: Context.Tag.Service<ConsoleSessions>["createState"] = (verifier, nonce, validMs) =>
    Effect.gen(function* () {
      const state = secret()
      const now = yield* Clock.currentTimeMillis
      yield* kv.create(`oidc.${sha256hex(state)}`, {
        email: "",
        expires_at_ms: now + validMs,
        verifier,
        nonce,
      })
      return state
    })

  const useState: Context.Tag.Service<ConsoleSessions>["useState"] = (state) =>
    Effect.gen(function* () {
      if (!secretShape.test(state)) return "unknown" as const
      const record = yield* useOnce(`oidc.${sha256hex(state)}`)
      if (typeof record === "string") return record
      return { verifier: record.verifier ?? "", nonce: record.nonce ?? "" }
    })

  const session: Context.Tag.Service<ConsoleSessions>["session"] = (sessionId) =>
    Effect.gen(function* () {
      const found = yield* kv.get(sessionKey(sessionId))
      if (Option.isNone(found)) return Option.none()
      const now = yield* Clock.currentTimeMillis
      return now < found.value.value.expires_at_ms ? Option.some(found.value.value.email) : Option.none()
    })

  const end: Context.Tag.Service<ConsoleSessions>["end"] = (sessionId) => kv.delete(sessionKey(sessionId))

  return { createLink, useLink, createSession, createState, useState, session, end, kv }
})

/** The store as a layer. */
export const layer: Layer.Layer<ConsoleSessions, NatsError, Nats | Storage> = Layer.effect(
  ConsoleSessions,
  make,
)

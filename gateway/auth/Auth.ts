/**
 * The auth step: one function from (access label, request headers) to the principal the label
 * promises, or the spec's refusal (see `Access.ts` for the table). Order of checks, so each
 * request gets the most basic problem first: credential (401) → credential kind for the label
 * (`people_only`, `key_scope`) → `Service-Account` (400 `account_required`) → membership (403
 * `not_a_member`) → role (`owners_only`) → account state (`suspended`).
 *
 * A bearer value starting with `hgr_` is an account key; anything else is tried as an ID token.
 * Without `Authorization`, the web console's session cookie (`core/ConsoleSessions.ts`) stands for
 * its person exactly as an ID token would; a request it signs in that is not a `GET` must also carry
 * the session's CSRF token (`x-csrf-token`), or is refused 403 `csrf_token` before anything is read.
 */
import { Context, Effect, Layer, Option, Schema } from "effect"
import {
  type AccountRecord,
  Accounts,
  layer as accountsLayer,
  type KeyRecord,
  type UserRecord,
} from "../../core/Accounts.ts"
import {
  ConsoleSessions,
  CSRF_HEADER,
  layer as consoleSessionsLayer,
  csrfMatches,
  sessionIdOf,
} from "../../core/ConsoleSessions.ts"
import { hashToken, isKeyToken, sameHash, tokenPrefix } from "../../core/KeyTokens.ts"
import type { Member } from "../../schema/Account.ts"
import { ApiError } from "../../schema/Errors.ts"
import { AccountId } from "../../schema/Ids.ts"
import { layer as accountStatesLayer } from "../accounts/States.ts"
import {
  type Access,
  type AccountKey,
  type AccountPerson,
  type Person,
  type Principal,
  peopleOnlyForKeys,
} from "./Access.ts"
import { bearerOf } from "./Bearer.ts"
import { type Identity, IdTokens, layer as idTokensLayer } from "./IdTokens.ts"
import { KeyCache, layer as keyCacheLayer } from "./KeyCache.ts"

/** What the auth step needs beyond the headers. */
export interface ResolveOptions {
  /** Whether the route serves a suspended account (default: `GET` routes only). */
  readonly whileSuspended: boolean
  /** The request's method: a console session's request that is not a `GET` needs its CSRF token. */
  readonly method?: string
}

/** The auth step as a service. */
export class Auth extends Context.Tag("gateway/Auth")<
  Auth,
  {
    /** The principal for `access`, or the refusal as an `ApiError`. */
    readonly resolve: (
      access: Access,
      headers: Readonly<Record<string, string>>,
      options: ResolveOptions,
    ) => Effect.Effect<Principal, ApiError>
    /**
     * What `resolve` answers, decided from memory alone (verified tokens, the watched caches), for a
     * request answered inside uWS's callback; `undefined` when it needs a read or a signature check.
     */
    readonly resolveNow: (
      access: Access,
      headers: Readonly<Record<string, string>>,
      options: ResolveOptions,
    ) => Principal | ApiError | undefined
    /** The person a bearer ID token names, created on first sight; for routes that take an account from the path. */
    readonly person: (
      headers: Readonly<Record<string, string>>,
      options?: ResolveOptions,
    ) => Effect.Effect<Person, ApiError>
  }
>() {}

const isAccountId = Schema.is(AccountId)
const unauthenticated = ApiError.unauthenticated()

// Store failures are outages: logged, answered 500 without detail.
const orInternal = <A, E>(fx: Effect.Effect<A, E>): Effect.Effect<A, ApiError> =>
  Effect.catchAll(fx, (e) =>
    e instanceof ApiError
      ? Effect.fail(e)
      : Effect.zipRight(Effect.logError("auth store read failed", e), Effect.fail(ApiError.internal())),
  )

/** A read the decision needs and memory does not hold; the effectful path makes it and decides again. */
class Need {
  constructor(
    readonly what: "key" | "account" | "identity" | "user" | "member" | "session",
    readonly id: string,
    readonly other = "",
  ) {}
}

/** What the decision reads: each answer, or `undefined` when it is not at hand. */
interface Known {
  readonly key: (hash: string) => Option.Option<KeyRecord> | undefined
  readonly account: (id: string) => Option.Option<AccountRecord> | undefined
  readonly identity: (token: string) => Identity | undefined
  /** The person by e-mail; none is a person never seen, whom the effectful path creates. */
  readonly user: (email: string) => Option.Option<UserRecord> | undefined
  readonly member: (account: string, user: string) => Option.Option<Member> | undefined
  /** The person (e-mail) of a live console session, none for an unknown or expired one. */
  readonly session: (id: string) => Option.Option<string> | undefined
}

type Decided<A> = A | ApiError | Need

const keyPrincipal = (token: string, known: Known): Decided<AccountKey> => {
  if (!isKeyToken(token)) return unauthenticated
  const hash = hashToken(token)
  const found = known.key(hash)
  if (found === undefined) return new Need("key", hash)
  if (Option.isNone(found) || !sameHash(found.value.hash, hash)) return unauthenticated
  const key = found.value.key
  if (key.revoked_at !== undefined) return unauthenticated
  const account = known.account(key.account)
  if (account === undefined) return new Need("account", key.account)
  if (Option.isNone(account)) return unauthenticated
  return { _tag: "AccountKey", key, account: account.value }
}

const personByEmail = (email: string, known: Known): Decided<Person> => {
  // A person seen before is read from memory; the first sight of one writes the record.
  const user = known.user(email)
  if (user === undefined || Option.isNone(user)) return new Need("user", email)
  return { _tag: "Person", user: user.value.user, email: user.value.email }
}

const personOf = (token: string, known: Known): Decided<Person> => {
  const identity = known.identity(token)
  if (identity === undefined) return new Need("identity", token)
  return personByEmail(identity.email, known)
}

const safeMethods: ReadonlySet<string> = new Set(["GET", "HEAD"])

/** The person of the console's session cookie (checked for its CSRF token first), or 401. */
const sessionPerson = (
  headers: Readonly<Record<string, string>>,
  options: ResolveOptions,
  known: Known,
): Decided<Person> => {
  const id = sessionIdOf(headers.cookie)
  if (id === undefined) return unauthenticated
  if (!safeMethods.has(options.method ?? "POST") && !csrfMatches(id, headers[CSRF_HEADER]))
    return ApiError.csrfToken()
  const email = known.session(id)
  if (email === undefined) return new Need("session", id)
  if (Option.isNone(email)) return ApiError.unauthenticated("the console session has ended; sign in again")
  return personByEmail(email.value, known)
}

const personOnly = (
  headers: Readonly<Record<string, string>>,
  options: ResolveOptions,
  known: Known,
): Decided<Person> => {
  const token = bearerOf(headers.authorization)
  if (token === undefined) return sessionPerson(headers, options, known)
  if (token.startsWith(tokenPrefix)) {
    const principal = keyPrincipal(token, known)
    return principal instanceof Need || principal instanceof ApiError
      ? principal
      : ApiError.peopleOnly(peopleOnlyForKeys)
  }
  return personOf(token, known)
}

const suspendedIn = (account: AccountRecord, options: ResolveOptions) =>
  account.state === "suspended" && !options.whileSuspended

// The one decision, in the order of the module comment, over whatever `known` holds.
const decide = (
  access: Access,
  headers: Readonly<Record<string, string>>,
  options: ResolveOptions,
  known: Known,
): Decided<Principal> => {
  if (access === "anyone") return { _tag: "Anyone" }
  const token = bearerOf(headers.authorization)

  if (token?.startsWith(tokenPrefix)) {
    const principal = keyPrincipal(token, known)
    if (principal instanceof Need || principal instanceof ApiError) return principal
    if (access === "signed in" || access === "person" || access === "owner")
      return ApiError.peopleOnly(peopleOnlyForKeys)
    if (access === "member (admin keys)" && principal.key.scope !== "admin") return ApiError.keyScope()
    // A key carries its account; naming another one is asking for an account it is not in.
    const named = headers["service-account"]
    if (named !== undefined && named !== principal.account.id)
      return ApiError.notAMember("this key belongs to another account")
    if (suspendedIn(principal.account, options)) return ApiError.suspended()
    return principal
  }

  const who = token === undefined ? sessionPerson(headers, options, known) : personOf(token, known)
  if (who instanceof Need || who instanceof ApiError) return who
  if (access === "signed in") return who
  const named = headers["service-account"]
  if (named === undefined || named === "") return ApiError.accountRequired()
  if (!isAccountId(named)) return ApiError.notAMember()
  const account = known.account(named)
  if (account === undefined) return new Need("account", named)
  const membership = known.member(named, who.user)
  if (membership === undefined) return new Need("member", named, who.user)
  if (Option.isNone(account) || Option.isNone(membership)) return ApiError.notAMember()
  if (access === "owner" && membership.value.role !== "owner") return ApiError.ownersOnly()
  if (suspendedIn(account.value, options)) return ApiError.suspended()
  return {
    _tag: "AccountPerson",
    user: who.user,
    email: who.email,
    account: account.value,
    role: membership.value.role,
  } satisfies AccountPerson
}

/** Builds the auth step. */
export const make = Effect.gen(function* () {
  const accounts = yield* Accounts
  const cache = yield* KeyCache
  const idTokens = yield* IdTokens
  const sessions = yield* ConsoleSessions

  const inMemory: Known = {
    key: cache.now.lookup,
    account: cache.now.account,
    identity: idTokens.known,
    user: cache.now.user,
    member: cache.now.member,
    // Sessions are read from KV each time, so a sign-out on any gateway ends them at once.
    session: () => undefined,
  }

  const read = (need: Need): Effect.Effect<unknown, ApiError> => {
    switch (need.what) {
      case "key":
        return orInternal(cache.lookup(need.id))
      case "account":
        return orInternal(cache.account(need.id))
      case "identity":
        return idTokens.verify(need.id)
      case "user":
        return Effect.flatMap(orInternal(cache.user(need.id)), (known) =>
          Option.isSome(known)
            ? Effect.succeed(known)
            : Effect.map(orInternal(accounts.ensureUser(need.id)), Option.some),
        )
      case "member":
        return orInternal(cache.member(need.id, need.other))
      case "session":
        return orInternal(sessions.session(need.id))
    }
  }

  // Decides from memory; each read memory lacks is made (KV, a signature check, a first sight's
  // write) and kept for this request, and the decision is taken again, until it is made.
  const settle = <A>(decideWith: (known: Known) => Decided<A>): Effect.Effect<A, ApiError> =>
    Effect.suspend(() => {
      const got = new Map<string, unknown>()
      const keyOf = (what: Need["what"], id: string, other = "") => `${what}\0${id}\0${other}`
      const lookup =
        <T>(what: Need["what"], memory: (id: string, other: string) => T | undefined) =>
        (id: string, other = ""): T | undefined => {
          const k = keyOf(what, id, other)
          return got.has(k) ? (got.get(k) as T) : memory(id, other)
        }
      const known: Known = {
        key: lookup("key", inMemory.key),
        account: lookup("account", inMemory.account),
        identity: lookup("identity", inMemory.identity),
        user: lookup("user", inMemory.user),
        member: lookup("member", inMemory.member),
        session: lookup("session", inMemory.session),
      }
      const step = (): Effect.Effect<A, ApiError> => {
        const decided = decideWith(known)
        if (decided instanceof ApiError) return Effect.fail(decided)
        if (!(decided instanceof Need)) return Effect.succeed(decided)
        return Effect.flatMap(read(decided), (value) => {
          got.set(keyOf(decided.what, decided.id, decided.other), value)
          return step()
        })
      }
      return step()
    })

  const resolve: Context.Tag.Service<Auth>["resolve"] = (access, headers, options) =>
    settle((known) => decide(access, headers, options, known))

  const resolveNow: Context.Tag.Service<Auth>["resolveNow"] = (access, headers, options) => {
    const decided = decide(access, headers, options, inMemory)
    return decided instanceof Need ? undefined : decided
  }

  const person: Context.Tag.Service<Auth>["person"] = (headers, options = { whileSuspended: true }) =>
    settle((known) => personOnly(headers, options, known))

  return { resolve, resolveNow, person }
})

/** The auth step as a layer. */
export const layer = Layer.effect(Auth, make)

/**
 * The auth step with everything it stands on: the account store and the key cache (also provided
 * to the routes), the cache's watches, and the ID token verifier; with them, the account actors'
 * watched states that `GET /v1/account` shows (`accounts/States.ts`), so every gateway built on
 * this has every watched cache. Needs NATS, the storage map and `IssuerSettings`.
 */
export const layerAll = layer.pipe(
  Layer.provideMerge(Layer.mergeAll(keyCacheLayer, idTokensLayer, accountStatesLayer, consoleSessionsLayer)),
  Layer.provideMerge(accountsLayer),
)

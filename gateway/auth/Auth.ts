/**
 * The auth step: one function from (access label, request headers) to the principal the label
 * promises, or the spec's refusal (see `Access.ts` for the table). Order of checks, so each
 * request gets the most basic problem first: credential (401) → credential kind for the label
 * (`people_only`, `key_scope`) → `Service-Account` (400 `account_required`) → membership (403
 * `not_a_member`) → role (`owners_only`) → account state (`suspended`).
 *
 * A bearer value starting with `hgr_` is an account key; anything else is tried as an ID token.
 */
import { Context, Effect, Layer, Option, Schema } from "effect"
import { type AccountRecord, Accounts, layer as accountsLayer } from "../../core/Accounts.ts"
import { hashToken, isKeyToken, sameHash, tokenPrefix } from "../../core/KeyTokens.ts"
import { ApiError } from "../../schema/Errors.ts"
import { AccountId } from "../../schema/Ids.ts"
import {
  type Access,
  type AccountKey,
  type AccountPerson,
  type Person,
  type Principal,
  peopleOnlyForKeys,
} from "./Access.ts"
import { IdTokens, layer as idTokensLayer } from "./IdTokens.ts"
import { KeyCache, layer as keyCacheLayer } from "./KeyCache.ts"

/** What the auth step needs beyond the headers. */
export interface ResolveOptions {
  /** Whether the route serves a suspended account (default: `GET` routes only). */
  readonly whileSuspended: boolean
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
    /** The person a bearer ID token names, created on first sight; for routes that take an account from the path. */
    readonly person: (headers: Readonly<Record<string, string>>) => Effect.Effect<Person, ApiError>
  }
>() {}

const isAccountId = Schema.is(AccountId)
const unauthenticated = ApiError.unauthenticated()

/** The bearer value of `Authorization`, or none when missing or malformed. */
export const bearerOf = (headers: Readonly<Record<string, string>>): string | undefined => {
  const m = /^Bearer ([\x21-\x7e]+)$/i.exec(headers.authorization ?? "")
  return m?.[1]
}

// Store failures are outages: logged, answered 500 without detail.
const orInternal = <A, E>(fx: Effect.Effect<A, E>): Effect.Effect<A, ApiError> =>
  Effect.catchAll(fx, (e) =>
    e instanceof ApiError
      ? Effect.fail(e)
      : Effect.zipRight(Effect.logError("auth store read failed", e), Effect.fail(ApiError.internal())),
  )

/** Builds the auth step. */
export const make = Effect.gen(function* () {
  const accounts = yield* Accounts
  const cache = yield* KeyCache
  const idTokens = yield* IdTokens

  const keyPrincipal = (token: string): Effect.Effect<AccountKey, ApiError> =>
    Effect.gen(function* () {
      if (!isKeyToken(token)) return yield* Effect.fail(unauthenticated)
      const hash = hashToken(token)
      const found = yield* orInternal(cache.lookup(hash))
      if (Option.isNone(found) || !sameHash(found.value.hash, hash))
        return yield* Effect.fail(unauthenticated)
      const key = found.value.key
      if (key.revoked_at !== undefined) return yield* Effect.fail(unauthenticated)
      const account = yield* orInternal(cache.account(key.account))
      if (Option.isNone(account)) return yield* Effect.fail(unauthenticated)
      return { _tag: "AccountKey", key, account: account.value } as const
    })

  const personOf = (token: string): Effect.Effect<Person, ApiError> =>
    Effect.gen(function* () {
      const identity = yield* idTokens.verify(token)
      // A person seen before is read from memory; the first sight of one writes the record.
      const known = yield* orInternal(cache.user(identity.email.toLowerCase()))
      const user = Option.isSome(known) ? known.value : yield* orInternal(accounts.ensureUser(identity.email))
      return { _tag: "Person", user: user.user, email: user.email } as const
    })

  const person: Context.Tag.Service<Auth>["person"] = (headers) => {
    const token = bearerOf(headers)
    if (token === undefined) return Effect.fail(unauthenticated)
    if (token.startsWith(tokenPrefix))
      return Effect.zipRight(keyPrincipal(token), Effect.fail(ApiError.peopleOnly(peopleOnlyForKeys)))
    return personOf(token)
  }

  const checkState = (account: AccountRecord, options: ResolveOptions) =>
    account.state === "suspended" && !options.whileSuspended ? Effect.fail(ApiError.suspended()) : Effect.void

  const resolve: Context.Tag.Service<Auth>["resolve"] = (access, headers, options) =>
    Effect.gen(function* () {
      if (access === "anyone") return { _tag: "Anyone" } as const
      const token = bearerOf(headers)
      if (token === undefined) return yield* Effect.fail(unauthenticated)

      if (token.startsWith(tokenPrefix)) {
        const principal = yield* keyPrincipal(token)
        if (access === "signed in" || access === "person" || access === "owner")
          return yield* Effect.fail(ApiError.peopleOnly(peopleOnlyForKeys))
        if (access === "member (admin keys)" && principal.key.scope !== "admin")
          return yield* Effect.fail(ApiError.keyScope())
        // A key carries its account; naming another one is asking for an account it is not in.
        const named = headers["service-account"]
        if (named !== undefined && named !== principal.account.id)
          return yield* Effect.fail(ApiError.notAMember("this key belongs to another account"))
        yield* checkState(principal.account, options)
        return principal
      }

      const who = yield* personOf(token)
      if (access === "signed in") return who
      const named = headers["service-account"]
      if (named === undefined || named === "") return yield* Effect.fail(ApiError.accountRequired())
      if (!isAccountId(named)) return yield* Effect.fail(ApiError.notAMember())
      const [account, membership] = yield* orInternal(
        Effect.all([cache.account(named), cache.member(named, who.user)], { concurrency: 2 }),
      )
      if (Option.isNone(account) || Option.isNone(membership))
        return yield* Effect.fail(ApiError.notAMember())
      if (access === "owner" && membership.value.role !== "owner")
        return yield* Effect.fail(ApiError.ownersOnly())
      yield* checkState(account.value, options)
      const principal: AccountPerson = {
        _tag: "AccountPerson",
        user: who.user,
        email: who.email,
        account: account.value,
        role: membership.value.role,
      }
      return principal
    })

  return { resolve, person }
})

/** The auth step as a layer. */
export const layer = Layer.effect(Auth, make)

/**
 * The auth step with everything it stands on: the account store and the key cache (also provided
 * to the routes), the cache's watches, and the ID token verifier. Needs NATS, the storage map and
 * `IssuerSettings`.
 */
export const layerAll = layer.pipe(
  Layer.provideMerge(Layer.mergeAll(keyCacheLayer, idTokensLayer)),
  Layer.provideMerge(accountsLayer),
)

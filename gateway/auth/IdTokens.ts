/**
 * Verifies people's OIDC ID tokens with `jose`: signature against the issuer's keys, `iss`,
 * `aud`, `exp` (and `nbf`/`iat` when present), and an `email` claim that is not marked unverified.
 *
 * Keys: the configured issuer's JWKS (`IssuerSettings.jwksUrl`, else `jwks_uri` from the issuer's
 * discovery document, fetched once), cached and refreshed by `createRemoteJWKSet`; in local mode
 * (no issuer configured) the local issuer's public key from `core/LocalIssuer.ts`. A token that
 * fails any check is `401 unauthenticated`; an issuer whose keys cannot be fetched is `500
 * internal` (an outage, not the caller's fault).
 */
import { Context, Effect, Layer, Schema } from "effect"
import { createRemoteJWKSet, errors, type JWTPayload, type JWTVerifyGetKey, jwtVerify } from "jose"
import { IssuerSettings, loadKey, localIssuerName } from "../../core/LocalIssuer.ts"
import { Email } from "../../schema/Account.ts"
import { ApiError } from "../../schema/Errors.ts"

/** What a verified token says about its bearer. */
export interface Identity {
  /** The e-mail address, lower-cased. */
  readonly email: string
}

/** The ID token verifier. */
export class IdTokens extends Context.Tag("gateway/IdTokens")<
  IdTokens,
  {
    readonly verify: (token: string) => Effect.Effect<Identity, ApiError>
    /** The identity of a token verified before and not expired, from memory; else `undefined`. */
    readonly known: (token: string) => Identity | undefined
  }
>() {}

const isEmail = Schema.is(Email)

/** How many verified tokens a gateway remembers (one entry per signed-in person and token). */
const VERIFIED_MAX = 10_000

// Network and JWKS-availability failures are ours; everything else means the token is bad.
const isOutage = (e: unknown): boolean =>
  e instanceof errors.JWKSTimeout ||
  (e instanceof errors.JOSEError && e.code === "ERR_JOSE_GENERIC") ||
  !(e instanceof errors.JOSEError)

const identityOf = (payload: JWTPayload): Effect.Effect<Identity, ApiError> => {
  const email = payload.email
  if (typeof email !== "string" || !isEmail(email) || payload.email_verified === false) {
    return Effect.fail(ApiError.unauthenticated("the ID token carries no verified email"))
  }
  return Effect.succeed({ email: email.toLowerCase() })
}

const discover = async (issuer: string): Promise<URL> => {
  const res = await fetch(`${issuer.replace(/\/$/, "")}/.well-known/openid-configuration`)
  if (!res.ok) throw new Error(`discovery answered ${res.status}`)
  const doc = (await res.json()) as { jwks_uri?: unknown }
  if (typeof doc.jwks_uri !== "string") throw new Error("discovery document has no jwks_uri")
  return new URL(doc.jwks_uri)
}

/** Builds the verifier from `IssuerSettings` (loading or creating the local key in local mode). */
export const make = Effect.gen(function* () {
  const settings = yield* IssuerSettings.Tag
  const local = settings.issuer === ""
  const issuer = local ? localIssuerName : settings.issuer
  let keys: Promise<JWTVerifyGetKey | { readonly key: unknown }> | undefined
  if (local) {
    const key = yield* loadKey(settings.keyFile)
    keys = Promise.resolve({ key: key.publicKey })
  }
  const keysOf = () => {
    // A failed discovery is forgotten, so the next request tries again.
    keys ??= (settings.jwksUrl !== "" ? Promise.resolve(new URL(settings.jwksUrl)) : discover(issuer))
      .then((url) => createRemoteJWKSet(url))
      .catch((e) => {
        keys = undefined
        throw e
      })
    return keys
  }
  const algorithms = local
    ? ["EdDSA"]
    : ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "EdDSA"]

  // Verified tokens, by the whole token (its signature included, so an altered token never hits),
  // until their own expiry: a signature check costs more than the rest of a request, and a
  // verified token stays valid until `exp` whatever we do. Bounded; the oldest entry goes first.
  const verified = new Map<string, { readonly identity: Identity; readonly expMs: number }>()
  const remember = (token: string, identity: Identity, expMs: number) => {
    if (verified.size >= VERIFIED_MAX) verified.delete(verified.keys().next().value as string)
    verified.set(token, { identity, expMs })
  }

  const known = (token: string): Identity | undefined => {
    const hit = verified.get(token)
    if (hit === undefined) return undefined
    if (Date.now() < hit.expMs) return hit.identity
    verified.delete(token)
    return undefined
  }

  const verify = (token: string): Effect.Effect<Identity, ApiError> =>
    Effect.suspend(() => {
      const hit = known(token)
      return hit !== undefined ? Effect.succeed(hit) : verifyNow(token)
    })

  const verifyNow = (token: string): Effect.Effect<Identity, ApiError> =>
    Effect.tryPromise({
      try: async () => {
        const k = await keysOf()
        const options = { issuer, audience: settings.audience, algorithms, requiredClaims: ["exp"] }
        const { payload } =
          typeof k === "function"
            ? await jwtVerify(token, k, options)
            : await jwtVerify(token, k.key as Parameters<typeof jwtVerify>[1], options)
        return payload
      },
      catch: (e) => e,
    }).pipe(
      Effect.catchAll((e) =>
        isOutage(e)
          ? Effect.zipRight(Effect.logError("ID token keys unavailable", e), Effect.fail(ApiError.internal()))
          : Effect.fail(ApiError.unauthenticated()),
      ),
      Effect.flatMap((payload) =>
        Effect.tap(identityOf(payload), (identity) =>
          Effect.sync(() => remember(token, identity, (payload.exp ?? 0) * 1000)),
        ),
      ),
    )

  return { verify, known }
})

/** The verifier as a layer. */
export const layer = Layer.effect(IdTokens, make)

/**
 * Request rate limits: a token bucket per credential. Each bucket holds at most `burst` tokens
 * and refills at `perSecond`; a request takes one token, and a request finding less than one is
 * refused with `429 rate_limited` and `Retry-After` (whole seconds until a token is back).
 *
 * Buckets live in this gateway's memory: with N gateways behind a balancer a caller can get up to
 * N times the rate. That is accepted (the limit protects each gateway, not a billing quota) and
 * keeps the hot path free of network round trips. Full buckets are dropped by a periodic sweep,
 * so memory follows the number of recently active credentials.
 *
 * The key is the credential: the SHA-256 of the bearer token, or the client address for requests
 * without one (or with an `Authorization` that is not a bearer token).
 *
 * A made-up token would be a credential of its own, with a full bucket: a client could send as
 * many requests as it makes up tokens. So a request whose credential is refused (`401`) also
 * takes a token from its address's bucket of refusals (same size and rate), and a request with a
 * token from an address whose refusals' bucket is empty is refused `429` before anything else,
 * whatever its token: an address guessing tokens gets as many tries as one without any. While no
 * address has been refused lately, no request pays for the check.
 */
import { Config, Context, Duration, Effect, Layer, Schedule } from "effect"
import { defineSettings, env } from "../core/Config.ts"
import { hashToken } from "../core/KeyTokens.ts"
import { bearerOf } from "./auth/Bearer.ts"

/**
 * Rate limit settings: `HANGAR_RATE_LIMIT_PER_SECOND` (refill, may be fractional) and
 * `HANGAR_RATE_LIMIT_BURST` (bucket size, the requests a fresh credential may make at once).
 */
export const RateLimitSettings = defineSettings(
  "gateway/RateLimitSettings",
  { perSecond: 50, burst: 100 },
  (d) => ({
    perSecond: Config.number("HANGAR_RATE_LIMIT_PER_SECOND").pipe(Config.withDefault(d.perSecond)),
    burst: env.integer("RATE_LIMIT_BURST", d.burst),
  }),
)

interface Bucket {
  tokens: number
  at: number
}

/** In-memory token buckets; `take` is synchronous because it runs on uWS's request path. */
export class Buckets {
  private readonly buckets = new Map<string, Bucket>()

  constructor(
    readonly perSecond: number,
    readonly burst: number,
  ) {}

  /** Takes a token for `key` at time `nowMs`: `0` when allowed, else the seconds to wait (≥ 1). */
  take(key: string, nowMs: number): number {
    let bucket = this.buckets.get(key)
    if (!bucket) {
      bucket = { tokens: this.burst, at: nowMs }
      this.buckets.set(key, bucket)
    } else {
      bucket.tokens = this.tokensAt(bucket, nowMs)
      bucket.at = nowMs
    }
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1
      return 0
    }
    return this.waitFor(bucket.tokens)
  }

  /** As `take`, without taking the token. */
  peek(key: string, nowMs: number): number {
    const bucket = this.buckets.get(key)
    const tokens = bucket === undefined ? this.burst : this.tokensAt(bucket, nowMs)
    return tokens >= 1 ? 0 : this.waitFor(tokens)
  }

  /** Drops buckets that have refilled completely by `nowMs` (they equal a fresh bucket). */
  sweep(nowMs: number): void {
    for (const [key, bucket] of this.buckets)
      if (this.tokensAt(bucket, nowMs) >= this.burst) this.buckets.delete(key)
  }

  // The tokens `bucket` holds at `nowMs`, refilled since it was last taken from.
  private tokensAt(bucket: Bucket, nowMs: number): number {
    return Math.min(this.burst, bucket.tokens + (Math.max(0, nowMs - bucket.at) / 1000) * this.perSecond)
  }

  // The whole seconds until a bucket holding `tokens` has one.
  private waitFor(tokens: number): number {
    return Math.max(1, Math.ceil((1 - tokens) / this.perSecond))
  }

  /** How many buckets are held (for tests). */
  get size(): number {
    return this.buckets.size
  }
}

/** The rate limiter of one gateway process. */
export class RateLimit extends Context.Tag("gateway/RateLimit")<
  RateLimit,
  {
    /**
     * Takes one request now, of the credential in `authorization` (or of the client's address,
     * asked for only when needed): `0` when allowed, else `Retry-After` seconds.
     */
    readonly take: (authorization: string | undefined, remoteAddress: () => string) => number
    /** A request with a bearer token was refused `401`: its address takes from its refusals' bucket. */
    readonly refused: (remoteAddress: () => string) => void
  }
>() {}

/**
 * The bucket key of a request: the SHA-256 of its bearer token (the stored form of a key, which the
 * auth step then finds already made), else `ip:` and the client's address, asked for only then.
 */
export const keyOf = (authorization: string | undefined, remoteAddress: () => string): string => {
  const token = bearerOf(authorization)
  return token === undefined ? `ip:${remoteAddress()}` : `tok:${hashToken(token)}`
}

/** The rate limiter over `buckets` and `refusals` (each address's refused credentials), at `now`. */
export const limiter = (
  buckets: Buckets,
  refusals: Buckets,
  now: () => number = Date.now,
): Context.Tag.Service<RateLimit> => ({
  take: (authorization, remoteAddress) => {
    const key = keyOf(authorization, remoteAddress)
    if (refusals.size > 0 && key.startsWith("tok:")) {
      const wait = refusals.peek(remoteAddress(), now())
      if (wait > 0) return wait
    }
    return buckets.take(key, now())
  },
  refused: (remoteAddress) => {
    refusals.take(remoteAddress(), now())
  },
})

/** The rate limiter from settings, with a sweep every minute while the layer lives. */
export const layer: Layer.Layer<RateLimit, never, "gateway/RateLimitSettings"> = Layer.scoped(
  RateLimit,
  Effect.gen(function* () {
    const settings = yield* RateLimitSettings.Tag
    const buckets = new Buckets(settings.perSecond, settings.burst)
    const refusals = new Buckets(settings.perSecond, settings.burst)
    yield* Effect.forkScoped(
      Effect.sync(() => {
        buckets.sweep(Date.now())
        refusals.sweep(Date.now())
      }).pipe(Effect.repeat(Schedule.spaced(Duration.minutes(1)))),
    )
    return limiter(buckets, refusals)
  }),
)

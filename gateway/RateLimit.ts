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
 * without one.
 */
import { Config, Context, Duration, Effect, Layer, Schedule } from "effect"
import { defineSettings, env } from "../core/Config.ts"
import { hashToken } from "../core/KeyTokens.ts"

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
      const elapsed = Math.max(0, nowMs - bucket.at) / 1000
      bucket.tokens = Math.min(this.burst, bucket.tokens + elapsed * this.perSecond)
      bucket.at = nowMs
    }
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1
      return 0
    }
    return Math.max(1, Math.ceil((1 - bucket.tokens) / this.perSecond))
  }

  /** Drops buckets that have refilled completely by `nowMs` (they equal a fresh bucket). */
  sweep(nowMs: number): void {
    for (const [key, bucket] of this.buckets) {
      if (bucket.tokens + ((nowMs - bucket.at) / 1000) * this.perSecond >= this.burst)
        this.buckets.delete(key)
    }
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
    /** Takes one request for `key` now: `0` when allowed, else `Retry-After` seconds. */
    readonly take: (key: string) => number
  }
>() {}

/**
 * The bucket key of a request: the SHA-256 of its bearer token (the stored form of a key, which the
 * auth step then finds already made), else `ip:` and the client's address, asked for only then.
 */
export const keyOf = (authorization: string | undefined, remoteAddress: () => string): string => {
  if (authorization !== undefined && authorization.length > 7 && /^bearer /i.test(authorization)) {
    return `tok:${hashToken(authorization.slice(7).trim())}`
  }
  return `ip:${remoteAddress()}`
}

/** The rate limiter from settings, with a sweep every minute while the layer lives. */
export const layer: Layer.Layer<RateLimit, never, "gateway/RateLimitSettings"> = Layer.scoped(
  RateLimit,
  Effect.gen(function* () {
    const settings = yield* RateLimitSettings.Tag
    const buckets = new Buckets(settings.perSecond, settings.burst)
    yield* Effect.forkScoped(
      Effect.sync(() => buckets.sweep(Date.now())).pipe(Effect.repeat(Schedule.spaced(Duration.minutes(1)))),
    )
    return { take: (key: string) => buckets.take(key, Date.now()) }
  }),
)

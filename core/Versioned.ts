/**
 * Appending numbered, immutable versions under a head record (functions and providers). A version
 * is written with the bucket's `create` at `<...>.<n>`, so a number is taken at most once and a
 * version never changes; the head (`latest`) then follows by compare-and-set.
 *
 * Concurrent publishers read the same `latest = k`: one creates `k+1`, the others find `k+1` taken
 * and try `k+2`, `k+3`, … so each gets its own consecutive number; the head is moved forward only
 * (a publisher whose number is already covered by the head leaves it). A publisher that died
 * between the two writes leaves a version the head does not count yet; the next publish skips past
 * it and moves the head beyond it, so nothing is lost and no number is reused.
 */
import { Effect, Option } from "effect"
import { ApiError } from "../schema/Errors.ts"
import { retryConflicts } from "./Accounts.ts"
import type * as Kv from "./Kv.ts"
import type { NatsError } from "./Nats.ts"

/** How many taken numbers one publish skips before answering `409 conflict`. */
export const maxSkips = 64

/**
 * Writes version `latest + 1` (or the first free number after it) made by `make(n)` under
 * `versionKey(n)`, then moves the head at `headKey` to it with `advance`. Fails `not_found` (with
 * `what`) when there is no head.
 */
export const appendVersion = <H, V>(options: {
  readonly what: string
  readonly heads: Kv.Kv<H>
  readonly headKey: string
  /** The head's newest version number. */
  readonly latestOf: (head: H) => number
  readonly versions: Kv.Kv<V>
  readonly versionKey: (n: number) => string
  readonly make: (n: number) => V
  readonly advance: (head: H, n: number, version: V) => H
}): Effect.Effect<V, ApiError | NatsError | Kv.KvValueInvalid> =>
  Effect.gen(function* () {
    const found = yield* options.heads.get(options.headKey)
    if (Option.isNone(found)) return yield* Effect.fail(ApiError.notFound(options.what))
    let n = options.latestOf(found.value.value) + 1
    let version: V | undefined
    for (let skips = 0; version === undefined; skips++) {
      if (skips > maxSkips) return yield* Effect.fail(ApiError.conflict())
      const candidate = options.make(n)
      const created = yield* options.versions.create(options.versionKey(n), candidate).pipe(
        Effect.as(true),
        Effect.catchTag("StateConflict", () => Effect.succeed(false)),
      )
      if (created) version = candidate
      else n++
    }
    const written = version
    const taken = n
    yield* retryConflicts(
      Effect.gen(function* () {
        const head = yield* options.heads.get(options.headKey)
        if (Option.isNone(head)) return yield* Effect.fail(ApiError.notFound(options.what))
        if (options.latestOf(head.value.value) >= taken) return
        yield* options.heads.update(
          options.headKey,
          options.advance(head.value.value, taken, written),
          head.value.revision,
        )
      }),
      16,
    )
    return written
  })

/** The values of the keys matching `filter` (keys deleted meanwhile are left out). */
export const valuesOf = <A>(
  kv: Kv.Kv<A>,
  filter: string,
): Effect.Effect<ReadonlyArray<A>, NatsError | Kv.KvValueInvalid> =>
  Effect.flatMap(kv.keys(filter), (keys) => Effect.forEach(keys, (k) => kv.get(k), { concurrency: 16 })).pipe(
    Effect.map((found) => found.flatMap((o) => (Option.isSome(o) ? [o.value.value] : []))),
  )

/**
 * Key records by token hash, cached in this gateway's memory and kept current by a KV watch on
 * `keys` (`hash.>`), so a revocation written by any gateway reaches every gateway as soon as the
 * server pushes the write (no expiry-based staleness window).
 *
 * Correctness rules:
 * - the cache is used only while the watch is subscribed (`live`); a read that starts before the
 *   watch is subscribed, or after it broke, goes to KV and is not cached;
 * - every watched write is applied (newer revision wins), and a KV read is cached only if no newer
 *   revision got there first, so a slow read can never put a revoked key back;
 * - when the watch fails the cache is dropped and the watch restarted.
 */
import { Context, Deferred, Effect, Layer, Option, Schedule, Stream } from "effect"
import { Accounts, type KeyRecord, keysOf } from "../../core/Accounts.ts"
import type { KvValueInvalid } from "../../core/Kv.ts"
import type { NatsError } from "../../core/Nats.ts"

interface Cached {
  readonly revision: number
  readonly record: KeyRecord | undefined
}

/** The key cache. */
export class KeyCache extends Context.Tag("gateway/KeyCache")<
  KeyCache,
  {
    /** The key stored under `hash`, or none; from memory while the watch is live, else from KV. */
    readonly lookup: (hash: string) => Effect.Effect<Option.Option<KeyRecord>, NatsError | KvValueInvalid>
  }
>() {}

const hashOf = (kvKey: string) => kvKey.slice("hash.".length)

/** Builds the cache and starts its watch for the life of the layer. */
export const make = Effect.gen(function* () {
  const accounts = yield* Accounts
  const cache = new Map<string, Cached>()
  let live = false
  let generation = 0
  const ready = yield* Deferred.make<void>()

  const apply = (hash: string, next: Cached) => {
    const seen = cache.get(hash)
    if (!seen || seen.revision < next.revision) cache.set(hash, next)
  }

  // One watch at a time: while it runs the cache is live; when it ends or fails the cache is
  // dropped and a new watch starts after a second. Interrupting it (layer release) stops the watch.
  const watchOnce = Effect.scoped(
    Effect.gen(function* () {
      const changes = yield* accounts.views.keys.watchScoped(keysOf.keyHash(">"), { include: "updates" })
      live = true
      yield* Deferred.succeed(ready, undefined)
      yield* Stream.runForEach(changes, (c) =>
        Effect.sync(() =>
          apply(hashOf(c.key), { revision: c.revision, record: c._tag === "Put" ? c.value : undefined }),
        ),
      )
    }),
  ).pipe(
    Effect.ensuring(
      Effect.sync(() => {
        live = false
        generation++
        cache.clear()
      }),
    ),
    Effect.tapError((e) => Effect.logWarning("key cache watch failed; restarting", e)),
  )
  yield* Effect.forkScoped(watchOnce.pipe(Effect.retry(Schedule.spaced("1 second")), Effect.forever))
  // Subscribed before the layer is ready, so the first requests are already served from memory.
  yield* Deferred.await(ready)

  const lookup: Context.Tag.Service<KeyCache>["lookup"] = (hash) =>
    Effect.suspend(() => {
      if (live) {
        const hit = cache.get(hash)
        if (hit) return Effect.succeed(Option.fromNullable(hit.record))
      }
      const cacheable = live
      const started = generation
      return Effect.map(accounts.keyByHash(hash), (found) => {
        if (cacheable && live && generation === started && Option.isSome(found)) {
          apply(hash, { revision: found.value.revision, record: found.value.value })
        }
        return Option.map(found, (e) => e.value)
      })
    })

  return { lookup }
})

/** The cache as a layer (its watch runs until the layer's scope closes). */
export const layer = Layer.scoped(KeyCache, make)

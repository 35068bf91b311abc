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
import { Context, Deferred, Effect, Exit, Fiber, Layer, Option, Schedule, Scope, Stream } from "effect"
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

  // The watch's scope is closed by hand, before its consumer is stopped: interrupting a stream
  // over the NATS watch iterator while a `next()` is pending hangs (the async generator's
  // `return()` waits for that `next()`), whereas stopping the watch first ends the stream cleanly.
  let current: Scope.CloseableScope | undefined
  let stopping = false
  const watchOnce = Effect.gen(function* () {
    const scope = yield* Scope.make()
    current = scope
    const changes = yield* Scope.extend(
      accounts.views.keys.watchScoped(keysOf.keyHash(">"), { include: "updates" }),
      scope,
    )
    live = true
    yield* Deferred.succeed(ready, undefined)
    yield* Stream.runForEach(changes, (c) =>
      Effect.sync(() =>
        apply(hashOf(c.key), { revision: c.revision, record: c._tag === "Put" ? c.value : undefined }),
      ),
    )
  }).pipe(
    Effect.ensuring(
      Effect.suspend(() => {
        live = false
        generation++
        cache.clear()
        const scope = current
        current = undefined
        return scope ? Scope.close(scope, Exit.void) : Effect.void
      }),
    ),
    Effect.tapError((e) => Effect.logWarning("key cache watch failed; restarting", e)),
  )

  const loop = watchOnce.pipe(
    Effect.retry({ schedule: Schedule.spaced("1 second"), while: () => !stopping }),
    Effect.repeat({ while: () => !stopping }),
  )
  const fiber = yield* Effect.forkDaemon(loop)
  yield* Effect.addFinalizer(() =>
    Effect.gen(function* () {
      stopping = true
      const scope = current
      if (scope) yield* Scope.close(scope, Exit.void)
      const ended = yield* Fiber.await(fiber).pipe(Effect.timeout("2 seconds"), Effect.option)
      if (ended._tag === "None") yield* Effect.forkDaemon(Fiber.interrupt(fiber))
    }),
  )
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

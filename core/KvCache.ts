/**
 * A KV bucket's values under a filter, cached in this process's memory and kept current by a KV
 * watch, so a hot path (every authenticated request) reads them without a round trip, and a write
 * made anywhere (a revoked key, a suspended account) reaches every process as soon as NATS pushes
 * it, with no expiry-based staleness.
 *
 * Correctness rules:
 * - the cache is used only while its watch is subscribed (`live`); a read that starts before the
 *   watch is subscribed, or after it broke, goes to KV and is not cached;
 * - every watched write is applied (newer revision wins), and a KV read is cached only if no newer
 *   revision got there first, so a slow read can never put an old value back;
 * - when the watch fails the cache is dropped and a new watch starts a second later.
 *
 * The watch delivers updates only; values enter the cache when first read. Memory grows with the
 * number of distinct keys read, which for accounts, people, memberships and keys is small.
 *
 * With `complete`, every key under the filter is read once the watch is subscribed (and again after
 * each restart of the watch), so the cache holds the whole view and `all` answers it from memory:
 * for a small set read whole on a hot path (the hosts, for the scheduler).
 */
import { Deferred, Effect, Option, Schedule, type Scope, Stream } from "effect"
import type { Kv, KvValueInvalid } from "./Kv.ts"
import type { NatsError } from "./Nats.ts"

/** Cached reads of one KV view. */
export interface KvCache<A> {
  /** The value at `key` (absent when deleted), from memory while the watch is live, else from KV. */
  readonly get: (key: string) => Effect.Effect<Option.Option<A>, NatsError | KvValueInvalid>
  /**
   * What `get` would answer from memory, synchronously (for a request answered inside a socket
   * callback); `undefined` when it would have to read KV (not cached, or the watch is not live).
   */
  readonly peek: (key: string) => Option.Option<A> | undefined
  /**
   * Completes once the watch has brought this process a value at `key` that `test` accepts
   * (`undefined`: deleted), at once while the cache is not live, and after `timeoutMs` at the
   * latest: a writer waits for its own change to take effect here before it answers.
   */
  readonly settled: (
    key: string,
    test: (value: A | undefined) => boolean,
    timeoutMs: number,
  ) => Effect.Effect<void>
  /**
   * Every present value under the filter, by key, from memory: only with `complete`, while the
   * watch is live and the keys it found on subscribing are all read; `undefined` otherwise (read KV).
   */
  readonly all: () => ReadonlyMap<string, A> | undefined
}

/** How a cache is kept. */
export interface KvCacheOptions {
  /** Read every key under the filter when the watch starts, so `all` can answer (default false). */
  readonly complete?: boolean
}

interface Cached<A> {
  readonly revision: number
  readonly value: A | undefined
}

/**
 * Starts the cache's watch for the life of the scope; ready once the watch is subscribed. With
 * `view`, what is kept and answered is `view` of each stored value (the part a reader needs, when
 * the records are large).
 */
export const make = <S, A = S>(
  kv: Kv<S>,
  filter = ">",
  view: (stored: S) => A = (stored) => stored as unknown as A,
  options: KvCacheOptions = {},
): Effect.Effect<KvCache<A>, never, Scope.Scope> =>
  Effect.gen(function* () {
    const cache = new Map<string, Cached<A>>()
    let live = false
    let loaded = false
    let generation = 0
    const ready = yield* Deferred.make<void>()

    const waiters = new Map<string, Set<() => void>>()
    const apply = (key: string, next: Cached<A>) => {
      const seen = cache.get(key)
      if (!seen || seen.revision < next.revision) cache.set(key, next)
      const waiting = waiters.get(key)
      if (waiting !== undefined) for (const wake of [...waiting]) wake()
    }

    const watchOnce = Effect.scoped(
      Effect.gen(function* () {
        const changes = yield* kv.watchScoped(filter, { include: "updates" })
        live = true
        yield* Deferred.succeed(ready, undefined)
        if (options.complete === true) {
          // Every key there now, read after subscribing: a write from here on also comes by the
          // watch, and the newer revision wins whichever arrives first.
          yield* Effect.forEach(
            yield* kv.keys(filter),
            (key) =>
              Effect.map(kv.get(key), (found) => {
                if (Option.isSome(found))
                  apply(key, { revision: found.value.revision, value: view(found.value.value) })
              }),
            { concurrency: 8, discard: true },
          )
          loaded = true
        }
        yield* Stream.runForEach(changes, (c) =>
          Effect.sync(() =>
            apply(c.key, { revision: c.revision, value: c._tag === "Put" ? view(c.value) : undefined }),
          ),
        )
      }),
    ).pipe(
      Effect.ensuring(
        Effect.sync(() => {
          live = false
          loaded = false
          generation++
          cache.clear()
        }),
      ),
      Effect.tapError((e) =>
        Effect.logWarning("KV cache watch failed; restarting", e).pipe(
          Effect.annotateLogs({ bucket: kv.bucket }),
        ),
      ),
    )
    yield* Effect.forkScoped(watchOnce.pipe(Effect.retry(Schedule.spaced("1 second")), Effect.forever))
    yield* Deferred.await(ready)

    const get: KvCache<A>["get"] = (key) =>
      Effect.suspend(() => {
        if (live) {
          const hit = cache.get(key)
          if (hit) return Effect.succeed(Option.fromNullable(hit.value))
        }
        const cacheable = live
        const started = generation
        return Effect.map(kv.get(key), (found) => {
          const value = Option.map(found, (e) => view(e.value))
          if (cacheable && live && generation === started && Option.isSome(found) && Option.isSome(value)) {
            apply(key, { revision: found.value.revision, value: value.value })
          }
          return value
        })
      })

    const peek: KvCache<A>["peek"] = (key) => {
      if (!live) return undefined
      const hit = cache.get(key)
      return hit === undefined ? undefined : Option.fromNullable(hit.value)
    }

    const settled: KvCache<A>["settled"] = (key, test, timeoutMs) =>
      Effect.async<void>((resume) => {
        const done = () => {
          const seen = cache.get(key)
          return !live || (seen !== undefined && test(seen.value))
        }
        if (done()) return resume(Effect.void)
        let waiting = waiters.get(key)
        if (waiting === undefined) {
          waiting = new Set()
          waiters.set(key, waiting)
        }
        const forget = () => {
          clearTimeout(timer)
          waiting.delete(wake)
          if (waiting.size === 0) waiters.delete(key)
        }
        const wake = () => {
          if (!done()) return
          forget()
          resume(Effect.void)
        }
        const timer = setTimeout(() => {
          forget()
          resume(Effect.void)
        }, timeoutMs)
        waiting.add(wake)
        return Effect.sync(forget)
      })

    const all: KvCache<A>["all"] = () => {
      if (!live || !loaded) return undefined
      const present = new Map<string, A>()
      for (const [key, c] of cache) if (c.value !== undefined) present.set(key, c.value)
      return present
    }

    return { get, peek, settled, all }
  })

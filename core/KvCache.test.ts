import { expect, layer } from "@effect/vitest"
import { Clock, Effect, Fiber, Option, Schema } from "effect"
import { layerAll } from "../test/harness/NatsServer.ts"
import { uniqueName } from "../test/harness/names.ts"
import * as Kv from "./Kv.ts"
import * as KvCache from "./KvCache.ts"
import { Storage } from "./Storage.ts"

const Value = Schema.Struct({ n: Schema.Number })
const bucket = Effect.flatMap(Storage, (s) => Kv.make(s.names.kv.accounts.name, Value))

// Waits (on the real clock) until `read` satisfies `ok`: the watch delivers writes asynchronously.
const eventually = <A, E, R>(read: Effect.Effect<A, E, R>, ok: (a: A) => boolean) =>
  Effect.gen(function* () {
    for (let i = 0; i < 200; i++) {
      const a = yield* read
      if (ok(a)) return a
      yield* Effect.sleep("10 millis")
    }
    return yield* read
  }).pipe(Effect.withClock(Clock.make()))

layer(layerAll())("KvCache", (it) => {
  it.scoped("settled waits until the watch brought a write here, or for its time at most", () =>
    Effect.gen(function* () {
      const writer = yield* bucket
      const cache = yield* KvCache.make(yield* bucket, ">")
      const key = uniqueName("k")
      yield* writer.put(key, { n: 1 })
      // Answered by the watch, not by a read: no get of the key was made.
      yield* cache.settled(key, (v) => v?.n === 1, 60_000)
      const waiting = yield* Effect.fork(cache.settled(key, (v) => v === undefined, 60_000))
      yield* writer.delete(key)
      yield* Fiber.join(waiting)
      expect(Option.isNone(yield* cache.get(key))).toBe(true)
      // A write it does not accept leaves it waiting; the one it accepts ends it.
      const nine = yield* Effect.fork(cache.settled(key, (v) => v?.n === 9, 60_000))
      yield* writer.put(key, { n: 5 })
      yield* cache.settled(key, (v) => v?.n === 5, 60_000)
      expect(yield* Fiber.poll(nine)).toEqual(Option.none())
      yield* writer.put(key, { n: 9 })
      yield* Fiber.join(nine)
      // Nothing comes: it ends after its time.
      yield* cache.settled(key, (v) => v?.n === 10, 30)
    }),
  )

  it.scoped("serves a read from memory, and writes made elsewhere replace it", () =>
    Effect.gen(function* () {
      const writer = yield* bucket
      const cache = yield* KvCache.make(yield* bucket, ">")
      const key = uniqueName("k")
      expect(Option.isNone(yield* cache.get(key))).toBe(true)
      const r1 = yield* writer.create(key, { n: 1 })
      expect(yield* cache.get(key)).toEqual(Option.some({ n: 1 }))
      yield* writer.update(key, { n: 2 }, r1)
      expect(yield* eventually(cache.get(key), (v) => Option.getOrUndefined(v)?.n === 2)).toEqual(
        Option.some({ n: 2 }),
      )
      yield* writer.delete(key)
      expect(Option.isNone(yield* eventually(cache.get(key), Option.isNone))).toBe(true)
    }),
  )

  it.scoped("a watched write newer than a cached read wins; the cache never goes back", () =>
    Effect.gen(function* () {
      const writer = yield* bucket
      const cache = yield* KvCache.make(yield* bucket, ">")
      const key = uniqueName("k")
      let revision = yield* writer.create(key, { n: 0 })
      expect(yield* cache.get(key)).toEqual(Option.some({ n: 0 }))
      for (let n = 1; n <= 20; n++) revision = yield* writer.update(key, { n }, revision)
      const last = yield* eventually(cache.get(key), (v) => Option.getOrUndefined(v)?.n === 20)
      expect(last).toEqual(Option.some({ n: 20 }))
      // Once at the newest value it stays there.
      expect(yield* cache.get(key)).toEqual(Option.some({ n: 20 }))
    }),
  )

  it.scoped("peek answers only what get would answer from memory, and follows the watch", () =>
    Effect.gen(function* () {
      const writer = yield* bucket
      const cache = yield* KvCache.make(yield* bucket, ">")
      const key = uniqueName("k")
      yield* writer.create(key, { n: 1 })
      // Never read here: only KV knows it.
      expect(cache.peek(key)).toBeUndefined()
      expect(yield* cache.get(key)).toEqual(Option.some({ n: 1 }))
      expect(cache.peek(key)).toEqual(Option.some({ n: 1 }))
      yield* writer.put(key, { n: 2 })
      yield* cache.settled(key, (v) => v?.n === 2, 60_000)
      expect(cache.peek(key)).toEqual(Option.some({ n: 2 }))
      yield* writer.delete(key)
      yield* cache.settled(key, (v) => v === undefined, 60_000)
      expect(cache.peek(key)).toEqual(Option.none())
    }),
  )

  it.scoped("with a view, keeps and answers the view of each value, read or watched", () =>
    Effect.gen(function* () {
      const writer = yield* bucket
      const cache = yield* KvCache.make(yield* bucket, ">", (v) => `n=${v.n}`)
      const key = uniqueName("k")
      yield* writer.create(key, { n: 1 })
      expect(yield* cache.get(key)).toEqual(Option.some("n=1"))
      yield* writer.put(key, { n: 2 })
      yield* cache.settled(key, (v) => v === "n=2", 60_000)
      expect(cache.peek(key)).toEqual(Option.some("n=2"))
    }),
  )

  it.scoped(
    "complete: all holds every key under the filter, those there before and those written after",
    () =>
      Effect.gen(function* () {
        const writer = yield* bucket
        const prefix = uniqueName("all")
        yield* writer.put(`${prefix}.a`, { n: 1 })
        yield* writer.put(`${prefix}.b`, { n: 2 })
        yield* writer.put(`${uniqueName("other")}.c`, { n: 3 })
        const plain = yield* KvCache.make(yield* bucket, `${prefix}.*`)
        // Without `complete` there is no whole view to answer from.
        expect(plain.all()).toBeUndefined()
        const cache = yield* KvCache.make(yield* bucket, `${prefix}.*`, (v) => v.n, { complete: true })
        const seen = (want: Record<string, number>) =>
          eventually(
            Effect.sync(() => cache.all()),
            (m) => m !== undefined && JSON.stringify(Object.fromEntries(m)) === JSON.stringify(want),
          ).pipe(Effect.map((m) => (m === undefined ? undefined : Object.fromEntries(m))))
        expect(yield* seen({ [`${prefix}.a`]: 1, [`${prefix}.b`]: 2 })).toEqual({
          [`${prefix}.a`]: 1,
          [`${prefix}.b`]: 2,
        })
        yield* writer.put(`${prefix}.c`, { n: 4 })
        yield* writer.delete(`${prefix}.a`)
        yield* writer.put(`${prefix}.b`, { n: 5 })
        expect(yield* seen({ [`${prefix}.b`]: 5, [`${prefix}.c`]: 4 })).toEqual({
          [`${prefix}.b`]: 5,
          [`${prefix}.c`]: 4,
        })
      }),
  )
})

import { describe, expect, it, layer } from "@effect/vitest"
import { Chunk, Clock, Context, Deferred, Effect, Either, Fiber, Layer, Option, Schema, Stream } from "effect"
import { layerAll, NatsServer } from "../test/harness/NatsServer.ts"
import { uniqueName } from "../test/harness/names.ts"
import { tcpProxy } from "../test/harness/TcpProxy.ts"
import * as Kv from "./Kv.ts"
import { attempt, layerUrl, Nats } from "./Nats.ts"
import { kvStreamConfig, Storage } from "./Storage.ts"

const Counter = Schema.Struct({ n: Schema.Number, by: Schema.String })

const actors = Effect.flatMap(Storage, (s) => Kv.make(s.names.kv.actors.name, Counter))

// The connection's live subscriptions (nats.js keeps them in its protocol handler).
const subscriptions = (connection: unknown): number =>
  (connection as { protocol: { subscriptions: { size: () => number } } }).protocol.subscriptions.size()
const untilSubscribed = (connection: unknown, before: number) =>
  Effect.yieldNow().pipe(Effect.repeat({ until: () => subscriptions(connection) > before }))

// A key holding `{n: 1}` and `wait` on it, forked and subscribed (every later write reaches it);
// `extra()` counts the connection's subscriptions beyond those before the wait.
const subscribedWait = <A, E>(wait: (kv: Kv.Kv<typeof Counter.Type>, key: string) => Effect.Effect<A, E>) =>
  Effect.gen(function* () {
    const kv = yield* actors
    const { connection } = yield* Nats
    const key = `${uniqueName("a")}.k`
    const revision = yield* kv.put(key, { n: 1, by: "a" })
    const before = subscriptions(connection)
    const waiting = yield* Effect.fork(wait(kv, key))
    yield* untilSubscribed(connection, before)
    return { kv, key, revision, waiting, extra: () => subscriptions(connection) - before }
  })

layer(layerAll())("Kv", (it) => {
  it.effect("create stores a value; a second create of the same key is a StateConflict", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const key = uniqueName("k")
      const rev = yield* kv.create(key, { n: 1, by: "a" })
      expect(yield* kv.get(key)).toEqual(Option.some({ value: { n: 1, by: "a" }, revision: rev }))
      const conflict = yield* kv.create(key, { n: 2, by: "b" }).pipe(Effect.flip)
      expect(conflict).toBeInstanceOf(Kv.StateConflict)
      expect(conflict).toMatchObject({ _tag: "StateConflict", bucket: kv.bucket, key, expectedRevision: 0 })
      expect(Option.getOrThrow(yield* kv.get(key)).value).toEqual({ n: 1, by: "a" })
    }),
  )

  it.effect(
    "creating sends at once and answers later: both stored; a taken key conflicts, a deleted one is free",
    () =>
      Effect.gen(function* () {
        const kv = yield* actors
        const [a, b, taken, deleted] = ["a", "b", "taken", "deleted"].map((k) => uniqueName(k))
        yield* kv.create(taken!, { n: 0, by: "first" })
        yield* kv.create(deleted!, { n: 0, by: "first" })
        yield* kv.delete(deleted!)
        const writes = [
          yield* kv.creating(a!, { n: 1, by: "a" }),
          yield* kv.creating(b!, { n: 2, by: "b" }),
          yield* kv.creating(taken!, { n: 3, by: "late" }),
          yield* kv.creating(deleted!, { n: 4, by: "again" }),
        ]
        // Awaited last to first: each answer was kept until asked for.
        const [againRev, conflict, bRev, aRev] = [
          yield* writes[3]!,
          yield* Effect.flip(writes[2]!),
          yield* writes[1]!,
          yield* writes[0]!,
        ]
        expect(yield* kv.get(a!)).toEqual(Option.some({ value: { n: 1, by: "a" }, revision: aRev }))
        expect(yield* kv.get(b!)).toEqual(Option.some({ value: { n: 2, by: "b" }, revision: bRev }))
        expect(conflict).toMatchObject({ _tag: "StateConflict", key: taken, expectedRevision: 0 })
        expect(Option.getOrThrow(yield* kv.get(taken!)).value).toEqual({ n: 0, by: "first" })
        expect(yield* kv.get(deleted!)).toEqual(
          Option.some({ value: { n: 4, by: "again" }, revision: againRev }),
        )
        // A bad key or value is refused before anything is sent.
        expect(yield* kv.creating("bad key", { n: 5, by: "x" }).pipe(Effect.flip)).toMatchObject({
          _tag: "NatsError",
          message: "invalid key: bad key",
        })
        const invalid = yield* kv.creating(uniqueName("c"), { n: "x", by: "x" } as never).pipe(Effect.flip)
        expect(invalid).toMatchObject({ _tag: "KvValueInvalid", direction: "encode" })
      }),
  )

  it.effect("concurrent updates with the same revision: exactly one wins, the others conflict", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const key = uniqueName("k")
      const rev = yield* kv.create(key, { n: 0, by: "init" })
      const writers = Array.from({ length: 8 }, (_, i) => `w${i}`)
      const results = yield* Effect.forEach(
        writers,
        (by) => Effect.either(kv.update(key, { n: 1, by }, rev)),
        { concurrency: "unbounded" },
      )
      const wins = results.filter(Either.isRight)
      const losses = results.filter(Either.isLeft)
      expect(wins).toHaveLength(1)
      expect(losses).toHaveLength(7)
      for (const l of losses)
        expect(l.left).toMatchObject({ _tag: "StateConflict", key, expectedRevision: rev })
      const stored = Option.getOrThrow(yield* kv.get(key))
      expect(stored.revision).toBe(wins[0]!.right)
      expect(writers).toContain(stored.value.by)
    }),
  )

  it.effect("update with a stale revision conflicts; with revision 0 it behaves as create", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const key = uniqueName("k")
      const r1 = yield* kv.update(key, { n: 1, by: "a" }, 0)
      const r2 = yield* kv.update(key, { n: 2, by: "a" }, r1)
      expect(r2).toBeGreaterThan(r1)
      expect((yield* kv.update(key, { n: 3, by: "a" }, r1).pipe(Effect.flip))._tag).toBe("StateConflict")
      expect((yield* kv.update(key, { n: 3, by: "a" }, 0).pipe(Effect.flip))._tag).toBe("StateConflict")
    }),
  )

  it.effect("delete makes a key absent, is idempotent, and a deleted key can be created again", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const key = uniqueName("k")
      const rev = yield* kv.create(key, { n: 1, by: "a" })
      expect((yield* kv.delete(key, { revision: rev + 1000 }).pipe(Effect.flip))._tag).toBe("StateConflict")
      yield* kv.delete(key, { revision: rev })
      expect(yield* kv.get(key)).toEqual(Option.none())
      yield* kv.delete(key)
      yield* kv.create(key, { n: 2, by: "b" })
      expect(Option.getOrThrow(yield* kv.get(key)).value.n).toBe(2)
    }),
  )

  it.effect(
    "get: a key never written is none; a key no bucket can hold is a NatsError naming it, read or written",
    () =>
      Effect.gen(function* () {
        const kv = yield* actors
        expect(yield* kv.get(uniqueName("never"))).toEqual(Option.none())
        for (const bad of ["a.*", "a..b", ".a", "a b", "a.>"]) {
          const error = yield* kv.get(bad).pipe(Effect.flip)
          expect(error).toMatchObject({ _tag: "NatsError", message: `invalid key: ${bad}` })
          const refused = yield* kv.put(bad, { n: 1, by: "a" }).pipe(Effect.flip)
          expect(refused).toMatchObject({ _tag: "NatsError", message: `invalid key: ${bad}` })
        }
      }),
  )

  it.effect("keys lists current keys under a filter", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const p = uniqueName("p")
      yield* kv.put(`${p}.a`, { n: 1, by: "a" })
      yield* kv.put(`${p}.b`, { n: 1, by: "a" })
      yield* kv.put(`${p}.c`, { n: 1, by: "a" })
      yield* kv.delete(`${p}.c`)
      expect([...(yield* kv.keys(`${p}.*`))].sort()).toEqual([`${p}.a`, `${p}.b`])
    }),
  )

  it.effect("making a view asks the server nothing: a missing bucket's view is made, its reads fail", () =>
    Effect.gen(function* () {
      const kv = yield* Kv.make(uniqueName("missing"), Counter)
      expect((yield* kv.get("a").pipe(Effect.flip))._tag).toBe("NatsError")
    }),
  )

  it.effect("a view made again on the same connection is the one made before (per bucket and schema)", () =>
    Effect.gen(function* () {
      const storage = yield* Storage
      const bucket = storage.names.kv.actors.name
      const first = yield* Kv.make(bucket, Counter)
      expect(yield* Kv.make(bucket, Counter)).toBe(first)
      expect(yield* Kv.make(bucket, Schema.Unknown)).not.toBe(first)
      expect(yield* Kv.make(storage.names.kv.runs.name, Counter)).not.toBe(first)
    }),
  )

  it.effect(
    "a single node's bucket is read with direct gets; a replicated one from its stream's leader",
    () =>
      Effect.gen(function* () {
        const { connection, jsm } = yield* Nats
        const single = uniqueName("single")
        const leader = uniqueName("leader")
        yield* attempt("add", () =>
          jsm.streams.add(kvStreamConfig({ name: single, history: 1, maxAgeMs: 0 })),
        )
        yield* attempt("add", () =>
          jsm.streams.add({
            ...kvStreamConfig({ name: leader, history: 1, maxAgeMs: 0 }, 3),
            num_replicas: 1,
          }),
        )
        // The API requests as they go by (a client may listen to them like any subject).
        const seen: Array<string> = []
        const sub = connection.subscribe("$JS.API.>", {
          callback: (_e, m) => {
            if (m.subject.includes(".GET.")) seen.push(m.subject)
          },
        })
        yield* attempt("flush", () => connection.flush())
        for (const bucket of [single, leader]) {
          const kv = yield* Kv.make(bucket, Counter)
          yield* kv.put("a", { n: 1, by: "a" })
          expect(Option.getOrThrow(yield* kv.get("a")).value).toEqual({ n: 1, by: "a" })
        }
        yield* attempt("flush", () => connection.flush())
        sub.unsubscribe()
        expect(seen).toEqual([
          `$JS.API.DIRECT.GET.KV_${single}.$KV.${single}.a`,
          `$JS.API.STREAM.MSG.GET.KV_${leader}`,
        ])
      }),
  )

  it.effect(
    "a replicated bucket (no direct gets) is read from its stream's leader: get, deletions, keys, CAS",
    () =>
      Effect.gen(function* () {
        // The stream as Storage makes it for R3, with one replica: what this single server can hold.
        const bucket = uniqueName("leader")
        const { jsm } = yield* Nats
        const config = { ...kvStreamConfig({ name: bucket, history: 1, maxAgeMs: 0 }, 3), num_replicas: 1 }
        expect(config.allow_direct).toBe(false)
        yield* attempt("add", () => jsm.streams.add(config))
        const kv = yield* Kv.make(bucket, Counter)
        expect(yield* kv.get("never")).toEqual(Option.none())
        const rev = yield* kv.create("a", { n: 1, by: "a" })
        expect(yield* kv.get("a")).toEqual(Option.some({ value: { n: 1, by: "a" }, revision: rev }))
        expect((yield* kv.create("a", { n: 2, by: "b" }).pipe(Effect.flip))._tag).toBe("StateConflict")
        const rev2 = yield* kv.update("a", { n: 2, by: "b" }, rev)
        expect(Option.getOrThrow(yield* kv.get("a")).revision).toBe(rev2)
        yield* kv.put("b", { n: 1, by: "a" })
        yield* kv.put("c", { n: 1, by: "a" })
        yield* kv.delete("c")
        expect(yield* kv.get("c")).toEqual(Option.none())
        expect([...(yield* kv.keys())]).toEqual(["a", "b"])
        const raw = yield* Kv.make(bucket, Schema.Unknown)
        yield* raw.put("bad", { n: "not a number" })
        expect((yield* kv.get("bad").pipe(Effect.flip))._tag).toBe("KvValueInvalid")
      }),
  )

  it.effect("a stored value the schema rejects is a KvValueInvalid, not a crash", () =>
    Effect.gen(function* () {
      const storage = yield* Storage
      const raw = yield* Kv.make(storage.names.kv.actors.name, Schema.Unknown)
      const kv = yield* actors
      const key = uniqueName("k")
      yield* raw.put(key, { n: "not a number" })
      const error = yield* kv.get(key).pipe(Effect.flip)
      expect(error).toMatchObject({ _tag: "KvValueInvalid", key, direction: "decode" })
      expect(error.message).toContain("n")
    }),
  )

  it.effect(
    "a value decoded is kept by its text, for every reader of the schema; a changed or refused one is not",
    () =>
      Effect.gen(function* () {
        const storage = yield* Storage
        // A schema of this test alone, so what other tests decode does not push its values out.
        const Note = Schema.Struct({ text: Schema.String })
        const kv = yield* Kv.make(storage.names.kv.actors.name, Note)
        const raw = yield* Kv.make(storage.names.kv.actors.name, Schema.Unknown)
        const key = uniqueName("kept")
        const stored = Effect.map(kv.get(key), (e) => Option.getOrThrow(e).value)
        yield* kv.put(key, { text: "one" })
        const first = yield* stored
        expect(first).toEqual({ text: "one" })
        // The same text: the same value, not decoded again.
        expect(yield* stored).toBe(first)
        yield* kv.put(key, { text: "two" })
        expect(yield* stored).toEqual({ text: "two" })
        // Back to the first text: the value kept for it.
        yield* kv.put(key, { text: "one" })
        expect(yield* stored).toBe(first)
        // A text the schema refuses is refused every time.
        yield* raw.put(key, { text: 1 })
        expect((yield* kv.get(key).pipe(Effect.flip))._tag).toBe("KvValueInvalid")
        expect((yield* kv.get(key).pipe(Effect.flip))._tag).toBe("KvValueInvalid")
        // A longText text is decoded each time (not kept), and correctly.
        const longText = "x".repeat(Kv.DECODED_KEPT_CHARS)
        yield* kv.put(key, { text: longText })
        const once = yield* stored
        expect(once).toEqual({ text: longText })
        expect(yield* stored).not.toBe(once)
        expect(yield* stored).toEqual(once)
        // The oldest goes first: after DECODED_KEPT other texts, the first is decoded afresh.
        for (let i = 0; i < Kv.DECODED_KEPT; i++) {
          yield* kv.put(key, { text: `other ${i}` })
          yield* stored
        }
        yield* kv.put(key, { text: "one" })
        const again = yield* stored
        expect(again).toEqual(first)
        expect(again).not.toBe(first)
      }),
  )

  it.scoped("watch delivers every change after subscription, in revision order", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const p = uniqueName("w")
      const changes = yield* kv.watchScoped(`${p}.>`, { include: "updates" })
      const collected = yield* changes.pipe(Stream.take(6), Stream.runCollect, Effect.fork)
      const r1 = yield* kv.create(`${p}.a`, { n: 1, by: "a" })
      const r2 = yield* kv.update(`${p}.a`, { n: 2, by: "a" }, r1)
      yield* kv.put(`${p}.b`, { n: 1, by: "b" })
      yield* kv.update(`${p}.a`, { n: 3, by: "a" }, r2)
      yield* kv.delete(`${p}.b`)
      yield* kv.put(`${p}.a`, { n: 4, by: "a" })
      const seen = Chunk.toReadonlyArray(yield* Fiber.join(collected))
      expect(
        seen.map((c) =>
          c._tag === "Put" ? `${c.key.slice(p.length + 1)}=${c.value.n}` : `-${c.key.slice(p.length + 1)}`,
        ),
      ).toEqual(["a=1", "a=2", "b=1", "a=3", "-b", "a=4"])
      const revisions = seen.map((c) => c.revision)
      expect([...revisions].sort((x, y) => x - y)).toEqual(revisions)
    }),
  )

  it.scoped("interrupting a consumer that waits for a change ends it (the watch is stopped)", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const p = uniqueName("w")
      const changes = yield* kv.watchScoped(`${p}.>`, { include: "updates" })
      const consumer = yield* changes.pipe(Stream.runDrain, Effect.fork)
      // Let the consumer reach its pending `next()` on a subject nobody writes to.
      yield* Effect.sleep("100 millis")
      // Without the stop-on-return the interruption never completes; the bound only keeps a
      // regression from hanging the file.
      const interrupted = yield* Fiber.interrupt(consumer).pipe(Effect.timeout("10 seconds"), Effect.option)
      expect(Option.isSome(interrupted)).toBe(true)
    }).pipe(Effect.withClock(Clock.make())),
  )

  it.scoped("watch with the default include starts with the current values", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const p = uniqueName("w")
      yield* kv.put(`${p}.a`, { n: 1, by: "a" })
      yield* kv.put(`${p}.a`, { n: 2, by: "a" })
      const first = yield* kv.watch(`${p}.>`).pipe(Stream.take(1), Stream.runCollect)
      expect(Chunk.toReadonlyArray(first)).toMatchObject([{ _tag: "Put", key: `${p}.a`, value: { n: 2 } }])
    }),
  )

  it.effect("watchEach hands over current values then changes, one at a time, until interrupted", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const p = uniqueName("we")
      yield* kv.put(`${p}.a`, { n: 1, by: "a" })
      const seen: Array<string> = []
      let busy = 0
      const first = yield* Deferred.make<void>()
      const all = yield* Deferred.make<void>()
      const fiber = yield* Effect.fork(
        kv.watchEach(`${p}.*`, {}, (change) =>
          Effect.gen(function* () {
            busy++
            expect(busy).toBe(1)
            yield* Effect.yieldNow()
            seen.push(change._tag === "Put" ? `${change.key}=${change.value.n}` : `${change.key} deleted`)
            busy--
            if (seen.length === 1) yield* Deferred.succeed(first, undefined)
            if (seen.length === 4) yield* Deferred.succeed(all, undefined)
          }),
        ),
      )
      // The current value first; the writes below then come as changes.
      yield* Deferred.await(first)
      yield* kv.put(`${p}.b`, { n: 2, by: "a" })
      yield* kv.delete(`${p}.a`)
      yield* kv.put(`${p}.b`, { n: 3, by: "a" })
      yield* Deferred.await(all)
      yield* Fiber.interrupt(fiber)
      expect(seen).toEqual([`${p}.a=1`, `${p}.b=2`, `${p}.a deleted`, `${p}.b=3`])
    }),
  )

  it.effect("watchEach passes over the changes `skip` names, undecoded", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const storage = yield* Storage
      const raw = yield* Kv.make(storage.names.kv.actors.name, Schema.Unknown)
      const p = uniqueName("ws")
      // Not a Counter: decoding it would fail the watch.
      const skipped = yield* raw.put(`${p}.bad`, { n: "not a number" })
      const seen = yield* Deferred.make<string>()
      const fiber = yield* Effect.fork(
        kv.watchEach(`${p}.*`, { skip: (_key, revision) => revision === skipped }, (change) =>
          Deferred.succeed(seen, change.key).pipe(Effect.asVoid),
        ),
      )
      yield* kv.put(`${p}.good`, { n: 1, by: "a" })
      expect(yield* Deferred.await(seen)).toBe(`${p}.good`)
      yield* Fiber.interrupt(fiber)
    }),
  )

  it.effect("awaitValue answers a current value that passes at once", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const key = `${uniqueName("a")}.k`
      yield* kv.put(key, { n: 3, by: "a" })
      expect(yield* kv.awaitValue(key, (v) => v.n >= 3)).toEqual({ n: 3, by: "a" })
    }),
  )

  it.effect(
    "awaitValue skips values that fail the test and deletions, and answers the first that passes",
    () =>
      Effect.gen(function* () {
        const { kv, key, waiting, extra } = yield* subscribedWait((kv, key) =>
          kv.awaitValue(key, (v) => v.n === 3),
        )
        // Subscribed: every write below reaches it.
        yield* kv.put(key, { n: 2, by: "a" })
        yield* kv.delete(key)
        yield* kv.put(key, { n: 3, by: "b" })
        yield* kv.put(key, { n: 4, by: "a" })
        expect(yield* Fiber.join(waiting)).toEqual({ n: 3, by: "b" })
        expect(extra()).toBe(0)
      }),
  )

  it.effect("awaitValue answers only stored writes: a refused compare-and-set is never seen", () =>
    Effect.gen(function* () {
      const { kv, key, revision, waiting } = yield* subscribedWait((kv, key) =>
        kv.awaitValue(key, (v) => v.n === 2),
      )
      // Routed to the key's own subject before the stream refuses it.
      const refused = yield* kv.update(key, { n: 2, by: "refused" }, revision + 5).pipe(Effect.flip)
      expect(refused._tag).toBe("StateConflict")
      yield* kv.update(key, { n: 2, by: "stored" }, revision)
      expect(yield* Fiber.join(waiting)).toEqual({ n: 2, by: "stored" })
    }),
  )

  it.effect("awaitValueUpTo: none once its time is up, unsubscribed; a passing write in time answers", () =>
    Effect.gen(function* () {
      const { kv, key, waiting, extra } = yield* subscribedWait((kv, key) =>
        kv.awaitValueUpTo(key, (v) => v.n === 2, 60_000),
      )
      expect(yield* kv.awaitValueUpTo(key, (v) => v.n === 3, 50)).toEqual(Option.none())
      expect(extra()).toBe(1)
      yield* kv.put(key, { n: 2, by: "b" })
      expect(yield* Fiber.join(waiting)).toEqual(Option.some({ n: 2, by: "b" }))
      expect(extra()).toBe(0)
    }),
  )

  // Reads of the bucket's keys under `prefix` from now on: a second subscriber on the direct-get
  // subject sees each read request.
  const countReads = (bucket: string, prefix: string) =>
    Effect.gen(function* () {
      const { connection } = yield* Nats
      let reads = 0
      const spy = connection.subscribe(`$JS.API.DIRECT.GET.KV_${bucket}.$KV.${bucket}.${prefix}.>`, {
        callback: () => {
          reads++
        },
      })
      yield* Effect.promise(() => connection.flush())
      yield* Effect.addFinalizer(() => Effect.sync(() => spy.unsubscribe()))
      return {
        // The count once the reads sent before are in (taken after the flush, each time it runs).
        reads: () =>
          Effect.map(
            Effect.promise(() => connection.flush()),
            () => reads,
          ),
      }
    })

  // A follower of `filter`, closed with the test's scope.
  const following = (kv: Kv.Kv<typeof Counter.Type>, filter: string) =>
    Effect.acquireRelease(kv.follow(filter), (f) => Effect.sync(() => f.close()))

  it.scoped(
    "follow: a key first written after it started is answered from its writes alone, with no read",
    () =>
      Effect.gen(function* () {
        const kv = yield* actors
        const run = uniqueName("r")
        const { reads } = yield* countReads(kv.bucket, run)
        const follower = yield* following(kv, `${run}.*`)
        yield* kv.put(`${run}.2`, { n: 9, by: "other key" })
        yield* kv.put(`${run}.1`, { n: 1, by: "a" })
        yield* kv.put(`${run}.1`, { n: 2, by: "b" })
        expect(yield* follower.awaitValueUpTo(`${run}.1`, (v) => v.n === 2, 10_000)).toEqual(
          Option.some({ n: 2, by: "b" }),
        )
        // The latest write is the current value: one that does not pass waits for the next.
        expect(yield* follower.awaitValueUpTo(`${run}.1`, (v) => v.n === 1, 50)).toEqual(Option.none())
        expect(yield* follower.awaitValueUpTo(`${run}.2`, (v) => v.n === 9, 10_000)).toEqual(
          Option.some({ n: 9, by: "other key" }),
        )
        expect(yield* reads()).toBe(0)
      }),
  )

  it.scoped("follow: a key with no write since it started is read first, then waited on", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const run = uniqueName("r")
      yield* kv.put(`${run}.1`, { n: 5, by: "before" })
      const { reads } = yield* countReads(kv.bucket, run)
      const follower = yield* following(kv, `${run}.*`)
      expect(yield* follower.awaitValueUpTo(`${run}.1`, (v) => v.n === 5, 10_000)).toEqual(
        Option.some({ n: 5, by: "before" }),
      )
      expect(yield* reads()).toBe(1)
      // Not passing now: the wait goes on to the writes that come, and none of another key answers.
      const waiting = yield* Effect.fork(follower.awaitValueUpTo(`${run}.1`, (v) => v.n === 6, 10_000))
      yield* kv.put(`${run}.2`, { n: 6, by: "other key" })
      yield* kv.put(`${run}.1`, { n: 6, by: "after" })
      expect(yield* Fiber.join(waiting)).toEqual(Option.some({ n: 6, by: "after" }))
      // That wait read the key too (no write had come yet); once one has, no more reads.
      expect(yield* reads()).toBe(2)
      expect(yield* follower.awaitValueUpTo(`${run}.1`, (v) => v.n === 6, 10_000)).toEqual(
        Option.some({ n: 6, by: "after" }),
      )
      expect(yield* reads()).toBe(2)
      expect(yield* follower.awaitValueUpTo(`${run}.3`, () => true, 50)).toEqual(Option.none())
    }),
  )

  it.scoped("follow: waits on several keys at once each get their own key's writes, in order", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const { connection } = yield* Nats
      const run = uniqueName("r")
      const { reads } = yield* countReads(kv.bucket, run)
      const follower = yield* following(kv, `${run}.*`)
      const before = subscriptions(connection)
      const one = yield* Effect.fork(follower.awaitValueUpTo(`${run}.1`, (v) => v.n === 2, 10_000))
      const alsoOne = yield* Effect.fork(follower.awaitValueUpTo(`${run}.1`, (v) => v.n === 3, 10_000))
      const two = yield* Effect.fork(follower.awaitValueUpTo(`${run}.2`, (v) => v.n >= 1, 10_000))
      // Each wait has asked for its key (none there), after queueing its writes: the writes below,
      // sent after the reads on the same connection, all reach them.
      yield* reads().pipe(Effect.repeat({ until: (n) => n === 3 }))
      // An intermediate value passes the first wait although a later write came before it looked.
      yield* Effect.forEach([1, 2, 3], (n) => kv.put(`${run}.1`, { n, by: "one" }), { discard: true })
      yield* kv.put(`${run}.2`, { n: 1, by: "two" })
      expect(yield* Fiber.join(one)).toEqual(Option.some({ n: 2, by: "one" }))
      expect(yield* Fiber.join(alsoOne)).toEqual(Option.some({ n: 3, by: "one" }))
      expect(yield* Fiber.join(two)).toEqual(Option.some({ n: 1, by: "two" }))
      // No wait made a subscription of its own.
      expect(subscriptions(connection)).toBe(before)
    }),
  )

  // A follower of a fresh run whose key `<run>.1` is written, then pushed out of the kept values
  // by `count` writes of other keys (`others`): a wait on it then reads it.
  const pushedOut = (
    count: number,
    others: (kv: Kv.Kv<typeof Counter.Type>, key: string, i: number) => Effect.Effect<unknown, unknown>,
  ) =>
    Effect.gen(function* () {
      const kv = yield* actors
      const run = uniqueName("r")
      const { reads } = yield* countReads(kv.bucket, run)
      const follower = yield* following(kv, `${run}.*`)
      yield* kv.put(`${run}.1`, { n: 1, by: "early" })
      yield* Effect.forEach(
        Array.from({ length: count }, (_, i) => i + 2),
        (i) => others(kv, `${run}.${i}`, i),
        { concurrency: 16 },
      )
      expect(yield* follower.awaitValueUpTo(`${run}.1`, (v) => v.n === 1, 10_000)).toEqual(
        Option.some({ n: 1, by: "early" }),
      )
      expect(yield* reads()).toBe(1)
      return { run, follower, reads }
    })

  it.scoped("follow: past the values it keeps, a wait reads the key instead of trusting them", () =>
    Effect.gen(function* () {
      // 80 values of about 1 KiB go past the 64 KiB kept.
      const filler = "x".repeat(1024)
      const { run, follower, reads } = yield* pushedOut(80, (kv, key, n) => kv.put(key, { n, by: filler }))
      // The newest are still kept: no read for them.
      expect(yield* follower.awaitValueUpTo(`${run}.81`, (v) => v.n === 81, 10_000)).toEqual(
        Option.some({ n: 81, by: filler }),
      )
      expect(yield* reads()).toBe(1)
    }),
  )

  it.scoped("follow: deletions count against what it keeps too, so they cannot grow it without bound", () =>
    // About 90 bytes each: some 1,100 go past the 64 KiB.
    Effect.asVoid(pushedOut(1_100, (kv, key) => kv.delete(key))),
  )

  it.effect("follow keeps a copy of each value, not a view of the socket's read buffer it came in", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const nats = yield* Nats
      const run = uniqueName("r")
      const writes = Kv.followWrites(nats, Kv.republishedPrefix(kv.bucket), `${run}.*`, kv.bucket, 64 * 1024)
      try {
        yield* kv.put(`${run}.1`, { n: 1, by: "a" })
        yield* kv.put(`${run}.2`, { n: 2, by: "b" })
        yield* kv.delete(`${run}.2`)
        yield* attempt("flush", () => nats.connection.flush())
        const kept = writes.latest(`${run}.1`)
        expect(kept).toBeInstanceOf(Uint8Array)
        const bytes = kept as Uint8Array
        expect(JSON.parse(new TextDecoder().decode(bytes))).toEqual({ n: 1, by: "a" })
        expect(bytes.byteOffset).toBe(0)
        expect(bytes.buffer.byteLength).toBe(bytes.length)
        // A deletion is kept as one.
        expect(writes.latest(`${run}.2`)).toBeNull()
        expect(writes.latest(`${run}.3`)).toBeUndefined()
      } finally {
        writes.close()
      }
    }),
  )

  it.scoped("follow: after the connection went away and came back, what it kept is read again", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const nats = yield* Nats
      const run = uniqueName("r")
      const { reads } = yield* countReads(kv.bucket, run)
      const follower = yield* following(kv, `${run}.*`)
      yield* kv.put(`${run}.1`, { n: 1, by: "a" })
      expect(yield* follower.awaitValueUpTo(`${run}.1`, (v) => v.n === 1, 10_000)).toEqual(
        Option.some({ n: 1, by: "a" }),
      )
      expect(yield* reads()).toBe(0)
      // A write made while away would not have come: the kept one is no longer trusted.
      const changes = nats.changes()
      yield* attempt("reconnect", () => nats.connection.reconnect())
      yield* Effect.yieldNow().pipe(Effect.repeat({ until: () => nats.changes() >= changes + 2 }))
      yield* attempt("flush", () => nats.connection.flush())
      expect(follower.open()).toBe(true)
      expect(yield* follower.awaitValueUpTo(`${run}.1`, (v) => v.n === 1, 10_000)).toEqual(
        Option.some({ n: 1, by: "a" }),
      )
      expect(yield* reads()).toBe(1)
      // It still follows: a later write comes to it.
      const waiting = yield* Effect.fork(follower.awaitValueUpTo(`${run}.1`, (v) => v.n === 2, 10_000))
      yield* kv.put(`${run}.1`, { n: 2, by: "b" })
      expect(yield* Fiber.join(waiting)).toEqual(Option.some({ n: 2, by: "b" }))
    }),
  )

  it.scoped(
    "follow: a write made while the connection was away reaches a wait under way once it is back, whatever another reconnect listener does",
    () =>
      Effect.gen(function* () {
        const kv = yield* actors
        const server = yield* NatsServer
        const proxy = yield* Effect.acquireRelease(
          Effect.promise(() => tcpProxy(server.port)),
          (p) => Effect.promise(() => p.close()),
        )
        // The follower's own connection, through a proxy the test cuts.
        const away = yield* Layer.build(layerUrl(proxy.url, "hangar-test-away"))
        const awayNats = Context.get(away, Nats)
        // Another part of the process whose own listener fails: the follower's is still called.
        const stopFailing = awayNats.onReconnect(() => {
          throw new Error("a listener's own trouble")
        })
        yield* Effect.addFinalizer(() => Effect.sync(stopFailing))
        const awayKv = yield* Kv.make(kv.bucket, Counter).pipe(Effect.provide(away))
        const follower = yield* Effect.acquireRelease(awayKv.follow("w.*"), (f) =>
          Effect.sync(() => f.close()),
        )
        const key = `w.${uniqueName("k")}`
        const { reads } = yield* countReads(kv.bucket, "w")
        yield* kv.put(key, { n: 1, by: "a" })
        // Its republished write has come (sent before the answer to the flush).
        yield* attempt("flush", () => awayNats.connection.flush())
        // Waiting for the next write (far past the test's own time limit), having taken the kept one.
        const waiting = yield* Effect.fork(follower.awaitValueUpTo(key, (v) => v.n === 2, 10 * 60_000))
        yield* Effect.yieldNow().pipe(
          Effect.zipRight(Fiber.status(waiting)),
          Effect.repeat({ until: (s) => s._tag === "Suspended" }),
        )
        expect(yield* reads()).toBe(0)
        const pause = Effect.promise(() => new Promise((r) => setTimeout(r, 10)))
        proxy.cut()
        yield* pause.pipe(Effect.repeat({ until: () => !awayNats.reachable() }))
        // Stored while the follower's connection is away: its republished write never comes to it.
        yield* kv.put(key, { n: 2, by: "b" })
        proxy.mend()
        expect(yield* Fiber.join(waiting)).toEqual(Option.some({ n: 2, by: "b" }))
        // Read once, when the connection came back.
        expect(yield* reads()).toBe(1)
        expect(awayNats.reachable()).toBe(true)
      }),
  )

  it.scoped("follow: closing it unsubscribes and ends the waits under way, and fails those after", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const { connection } = yield* Nats
      const run = uniqueName("r")
      const { reads } = yield* countReads(kv.bucket, run)
      const before = subscriptions(connection)
      const follower = yield* kv.follow(`${run}.*`)
      expect(subscriptions(connection)).toBe(before + 1)
      expect(follower.open()).toBe(true)
      // A key whose write it keeps: once closed, that write may be old, and a wait on it fails.
      yield* kv.put(`${run}.2`, { n: 2, by: "kept" })
      expect(yield* follower.awaitValueUpTo(`${run}.2`, () => true, 10_000)).toEqual(
        Option.some({ n: 2, by: "kept" }),
      )
      const waiting = yield* Effect.fork(follower.awaitValueUpTo(`${run}.1`, () => true, 60_000))
      // Waiting for writes once it has read the key (none there).
      yield* reads().pipe(Effect.repeat({ until: (n) => n === 1 }))
      yield* Effect.yieldNow().pipe(Effect.repeat({ times: 20 }))
      follower.close()
      const ended = yield* Fiber.join(waiting).pipe(Effect.flip)
      expect(ended).toMatchObject({ _tag: "NatsError", message: "the subscription ended" })
      expect(follower.open()).toBe(false)
      expect(subscriptions(connection)).toBe(before)
      const after = yield* follower.awaitValueUpTo(`${run}.2`, () => true, 10_000).pipe(Effect.flip)
      expect(after).toMatchObject({ _tag: "NatsError", message: "the subscription ended" })
    }),
  )

  it.effect(
    "writesEach hands over stored writes from now on with their revisions, deletes as Deleted; skip passes over; it unsubscribes when interrupted",
    () =>
      Effect.gen(function* () {
        const kv = yield* actors
        const { connection } = yield* Nats
        const run = uniqueName("r")
        const before = yield* kv.put(`${run}.0`, { n: 0, by: "before" })
        const seen: Array<Kv.KvChange<typeof Counter.Type>> = []
        const skipped: Array<string> = []
        const got = yield* Deferred.make<void>()
        const subs = subscriptions(connection)
        const fiber = yield* Effect.fork(
          kv.writesEach(
            `${run}.*`,
            {
              skip: (key) => {
                const skip = key.endsWith(".skip")
                if (skip) skipped.push(key)
                return skip
              },
            },
            (change) =>
              Effect.suspend(() => {
                seen.push(change)
                return seen.length === 4 ? Deferred.succeed(got, undefined) : Effect.void
              }),
          ),
        )
        yield* untilSubscribed(connection, subs)
        const r1 = yield* kv.create(`${run}.1`, { n: 1, by: "a" })
        // A refused compare-and-set is not stored, so it is not handed over.
        yield* kv.update(`${run}.1`, { n: 9, by: "stale" }, before).pipe(Effect.flip)
        const r2 = yield* kv.update(`${run}.1`, { n: 2, by: "b" }, r1)
        yield* kv.put(`${run}.skip`, { n: 3, by: "skipped" })
        const r3 = yield* kv.put(`${run}.2`, { n: 4, by: "c" })
        yield* kv.delete(`${run}.2`)
        yield* Deferred.await(got)
        expect(seen.slice(0, 3)).toEqual([
          { _tag: "Put", key: `${run}.1`, value: { n: 1, by: "a" }, revision: r1 },
          { _tag: "Put", key: `${run}.1`, value: { n: 2, by: "b" }, revision: r2 },
          { _tag: "Put", key: `${run}.2`, value: { n: 4, by: "c" }, revision: r3 },
        ])
        expect(seen[3]).toMatchObject({ _tag: "Deleted", key: `${run}.2` })
        expect(skipped).toEqual([`${run}.skip`])
        yield* Fiber.interrupt(fiber)
        expect(subscriptions(connection)).toBe(subs)
      }),
  )

  it.effect("an interrupted awaitValue unsubscribes", () =>
    Effect.gen(function* () {
      const kv = yield* actors
      const { connection } = yield* Nats
      const before = subscriptions(connection)
      const waiting = yield* Effect.fork(kv.awaitValue(`${uniqueName("a")}.k`, () => true))
      yield* untilSubscribed(connection, before)
      yield* Fiber.interrupt(waiting)
      expect(subscriptions(connection)).toBe(before)
    }),
  )
})

describe("StateConflict", () => {
  it("round-trips through its schema (it crosses the bus)", () => {
    const e = new Kv.StateConflict({ bucket: "actors", key: "run.x", expectedRevision: 3 })
    const encoded = Schema.encodeSync(Kv.StateConflict)(e)
    expect(encoded).toEqual({ _tag: "StateConflict", bucket: "actors", key: "run.x", expectedRevision: 3 })
    expect(Schema.decodeUnknownSync(Kv.StateConflict)(encoded)).toBeInstanceOf(Kv.StateConflict)
  })
})

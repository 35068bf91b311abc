/**
 * Typed KV buckets: values are JSON encoded with a Schema, writes can be compare-and-set by
 * revision, and a watch is an ordered Effect `Stream`.
 *
 * The bucket must exist (`core/Storage.ts` creates every bucket at start-up). A conflicting
 * write fails with `StateConflict`; a stored value the schema rejects fails with `KvValueInvalid`
 * instead of throwing, so one bad record cannot crash a reader.
 */

import { type JetStreamClient, type JetStreamManager, PubHeaders } from "@nats-io/jetstream"
import type { KV, KvEntry as KvWatchEntry, KvWatchInclude } from "@nats-io/kv"
import { Kvm } from "@nats-io/kv"
import { type Msg, headers as natsHeaders, type Subscription } from "@nats-io/transport-node"
import type { Scope } from "effect"
import { Data, Effect, Either, Option, Schema, Stream } from "effect"
import type { ParseError } from "effect/ParseResult"
import { endingAtOnce } from "./Iterables.ts"
import { attempt, Nats, type NatsClients, NatsError } from "./Nats.ts"
import { publishVia, sendVia } from "./Stream.ts"

/**
 * A compare-and-set write lost: the key already existed (`create`) or its revision was no longer
 * `expectedRevision` (`update`, `delete`). Crosses the bus (a stale actor owner reports it).
 * Defined here because `schema/` has no errors file yet.
 */
export class StateConflict extends Schema.TaggedError<StateConflict>()("StateConflict", {
  bucket: Schema.String,
  key: Schema.String,
  /** The revision the writer expected; 0 means "absent" (create). */
  expectedRevision: Schema.Number,
}) {}

/** A value could not be encoded for, or decoded from, the bucket with its schema. */
export class KvValueInvalid extends Data.TaggedError("KvValueInvalid")<{
  readonly bucket: string
  readonly key: string
  readonly direction: "encode" | "decode"
  readonly message: string
}> {}

/** A current value with the revision to pass to `update`. */
export interface KvEntry<A> {
  readonly value: A
  readonly revision: number
}

/** One change seen by `watch`: a value written, or the key deleted/purged. */
export type KvChange<A> =
  | { readonly _tag: "Put"; readonly key: string; readonly value: A; readonly revision: number }
  | { readonly _tag: "Deleted"; readonly key: string; readonly revision: number }

/** Where a watch starts. */
export interface WatchOptions {
  /** `last` (default): the current value of each matching key first, then changes; `updates`: only changes; `history`: every kept revision, then changes. */
  readonly include?: "last" | "updates" | "history"
  /** Start at this revision (inclusive), e.g. one past the last seen by a restarted watcher. */
  readonly fromRevision?: number
}

/** A typed view of one bucket. */
export interface Kv<A> {
  readonly bucket: string
  /** The current value, or none when the key is absent or deleted. */
  readonly get: (key: string) => Effect.Effect<Option.Option<KvEntry<A>>, NatsError | KvValueInvalid>
  /** Writes a key that must not exist (a deleted key counts as absent); returns the new revision. */
  readonly create: (
    key: string,
    value: A,
  ) => Effect.Effect<number, StateConflict | NatsError | KvValueInvalid>
  /**
   * As `create`, in two steps: running it sends the write, and the effect it gives waits for its
   * outcome. Writes sent one after another before any is awaited leave in one socket write, with
   * no fiber each (the run actor's two creates of a command).
   */
  readonly creating: (
    key: string,
    value: A,
  ) => Effect.Effect<Effect.Effect<number, StateConflict | NatsError>, NatsError | KvValueInvalid>
  /** Writes only if the key's revision is still `revision` (0 = absent, as `create`); returns the new revision. */
  readonly update: (
    key: string,
    value: A,
    revision: number,
  ) => Effect.Effect<number, StateConflict | NatsError | KvValueInvalid>
  /** Writes unconditionally (last writer wins); returns the new revision. */
  readonly put: (key: string, value: A) => Effect.Effect<number, NatsError | KvValueInvalid>
  /** Deletes the key (idempotent); with `revision`, only if it is still at that revision. */
  readonly delete: (
    key: string,
    options?: { readonly revision?: number },
  ) => Effect.Effect<void, StateConflict | NatsError>
  /** Keys with a current value matching a subject-style filter (`>` = all, `run_x.*`). */
  readonly keys: (filter?: string) => Effect.Effect<ReadonlyArray<string>, NatsError>
  /**
   * Changes of keys matching `filter`, in revision order, for as long as the stream is consumed.
   * The stream fails with `KvValueInvalid` at a value the schema rejects.
   */
  readonly watch: (
    filter?: string,
    options?: WatchOptions,
  ) => Stream.Stream<KvChange<A>, NatsError | KvValueInvalid>
  /**
   * As `watch`, handing each change to `f` in turn (the next is taken once `f` is done), without a
   * `Stream`: for long-lived watchers on a hot path. Completes if the watch ends.
   */
  readonly watchEach: <E, R>(
    filter: string,
    options: WatchOptions & {
      /** Changes to pass over before they are decoded (say, the watcher's own writes). */
      readonly skip?: (key: string, revision: number) => boolean
    },
    f: (change: KvChange<A>) => Effect.Effect<void, E, R>,
  ) => Effect.Effect<void, NatsError | KvValueInvalid | E, R>
  /**
   * The writes of keys matching `filter` from now on, as the stream stores them, handed to `f` in
   * turn until interrupted: the stream's republished copies (a core subscription), which come with
   * the write's acknowledgement, before a watch's consumer delivers the same change. Not complete:
   * what is written while the connection is away is missed, and past 256 waiting for `f` the
   * oldest are let go; a watcher that must see every change uses it beside `watchEach`, not
   * instead. `skip` passes a write over before it is decoded. Fails with `NatsError` when its
   * subscription ends (the connection closed). The queue is a follower's (`followWrites`).
   */
  readonly writesEach: <E, R>(
    filter: string,
    options: { readonly skip?: (key: string, revision: number) => boolean },
    f: (change: KvChange<A>) => Effect.Effect<void, E, R>,
  ) => Effect.Effect<never, NatsError | KvValueInvalid | E, R>
  /**
   * The key's first value, current or to come, that `test` accepts; waits as long as it takes
   * (callers bound it). A core subscription on the key's republished writes (`republishedPrefix`)
   * is made before the current value is read, both on one connection, so no write is missed and
   * only stored values are seen; unlike a watch it costs the server no consumer, which matters
   * for the one-key waits of long polls (about 1 ms against 5).
   */
  readonly awaitValue: (
    key: string,
    test: (value: A) => boolean,
  ) => Effect.Effect<A, NatsError | KvValueInvalid>
  /** As `awaitValue`, giving up after `timeoutMs` (none). */
  readonly awaitValueUpTo: (
    key: string,
    test: (value: A) => boolean,
    timeoutMs: number,
  ) => Effect.Effect<Option.Option<A>, NatsError | KvValueInvalid>
  /**
   * Follows the stored writes of keys matching `filter` from now on (the core subscription of
   * `awaitValue`, on a subject filter) until closed, keeping the latest write of each key: waits on
   * those keys then need no subscription of their own, and none a read once a write of its key has
   * come (say, a record the caller is about to have written). A follower may be kept a long time
   * and serve many waits at once (`gateway/commands/Records.ts` keeps one per run).
   */
  readonly follow: (filter: string) => Effect.Effect<KvFollower<A>, NatsError>
  /**
   * As `watch`, but subscribed when the effect completes: every write after that point is in the
   * stream (subscribe, then read, then wait — no lost wake-up). Unsubscribes when the scope closes.
   */
  readonly watchScoped: (
    filter?: string,
    options?: WatchOptions,
  ) => Effect.Effect<Stream.Stream<KvChange<A>, NatsError | KvValueInvalid>, NatsError, Scope.Scope>
}

/** The writes a `Kv.follow` has seen, and waits on them. */
export interface KvFollower<A> {
  /**
   * As `Kv.awaitValueUpTo`, from the writes of `key` that have come: the current value is read
   * first only when none has (or the follower let it go: it keeps about 64 KiB of the newest
   * values, and none from before a disconnect, when writes may have been missed).
   */
  readonly awaitValueUpTo: (
    key: string,
    test: (value: A) => boolean,
    timeoutMs: number,
  ) => Effect.Effect<Option.Option<A>, NatsError | KvValueInvalid>
  /** False once closed, or once its subscription ended (the connection closed). */
  readonly open: () => boolean
  /** Unsubscribes; waits under way, and those asked for after, fail. */
  readonly close: () => void
}

const CONFLICT_CODES = new Set([10071, 10164])

/** Whether a stored message's `KV-Operation` header marks a deletion (the key then holds no value). */
const deletes = (operation: string | undefined): boolean => operation === "DEL" || operation === "PURGE"

/**
 * Where a bucket's stream republishes each write once stored (`core/Storage.ts`), key appended.
 * A write is routed to subscribers of its own subject before the stream stores it, and even when
 * the stream then refuses it (a lost compare-and-set), so waits listen here instead.
 */
export const republishedPrefix = (bucket: string): string => `$KVR.${bucket}.`

/** How long a read waits for the server. */
const GET_TIMEOUT_MS = 5_000
const empty = new Uint8Array(0)

/** The keys a bucket can hold: dot-separated tokens, none empty, no wildcards. */
const validKey = /^[-/=\w]+(?:\.[-/=\w]+)*$/

const isConflict = (error: NatsError): boolean => {
  const cause = error.cause as { code?: unknown; message?: unknown } | undefined
  return (
    (typeof cause?.code === "number" && CONFLICT_CODES.has(cause.code)) ||
    /wrong last sequence/i.test(error.message)
  )
}

// Subjects asked for at once in one batched direct get (the server answers at most 1,024).
const KEYS_BATCH = 512
// Keys of a replicated bucket asked of its stream's leader at once (one request each).
const LEADER_KEYS_AT_ONCE = 64

/** The answer of `$JS.API.STREAM.MSG.GET` (the stream's leader). */
interface MsgGetAnswer {
  readonly error?: { readonly code: number; readonly err_code?: number; readonly description?: string }
  readonly message?: { readonly seq: number; readonly hdrs?: string; readonly data?: string }
}

const includeOf: Record<NonNullable<WatchOptions["include"]>, KvWatchInclude> = {
  last: "",
  updates: "updates",
  history: "history",
}

/** The writes of one key (of every key followed), from when it was asked for, queued until taken. */
interface WritesQueue {
  /**
   * The next write not taken yet, waiting up to `deadline` (epoch ms); undefined once past it;
   * `MISSED` (a key's queue only) where the connection came back after it went away. Fails once
   * the subscription has ended.
   */
  readonly next: (deadline: number) => Effect.Effect<Msg | typeof MISSED | undefined, NatsError>
  /** Stops queueing. */
  readonly close: () => void
}

/** The stored writes of a subject filter as its core subscription brings them (`follow`, `awaitValue`, `writesEach`). */
export interface FollowedWrites {
  /**
   * The value of the latest write of `key` that came, while it is kept: its bytes, or null when it
   * deleted the key.
   */
  readonly latest: (key: string) => Uint8Array | null | undefined
  /** The writes of `key` (of every key when undefined) from now on. */
  readonly queue: (key: string | undefined) => WritesQueue
  readonly open: () => boolean
  readonly close: () => void
}

// Writes queued for one wait (or for `writesEach`) and not taken yet: past this the oldest go.
const WRITES_QUEUED = 256
// The latest writes a follower keeps, by the size of their values: past this the oldest key's goes,
// and a wait on that key reads it. A run's command record is a few hundred bytes (its arguments
// may make it up to about 130 KiB: one that large is not kept). A gateway keeps up to 1,024.
const FOLLOWED_BYTES = 64 * 1024

interface Queued {
  readonly msgs: Array<Msg | typeof MISSED>
  wake: (() => void) | undefined
}

/** In a key's queue: the connection came back after it went away, and writes of the key made meanwhile did not come. */
const MISSED: unique symbol = Symbol("writes missed")

/**
 * Subscribes to the stored writes of keys matching `filter` (republished under `prefix`), keeping
 * the latest value of each key up to `keptBytes` of values. Exported for its tests; callers use
 * `Kv.follow`, `awaitValue` or `writesEach`.
 */
export const followWrites = (
  nats: Pick<NatsClients, "connection" | "changes" | "onReconnect">,
  prefix: string,
  filter: string,
  bucket: string,
  keptBytes: number,
): FollowedWrites => {
  const operation = `kv.subscribe ${bucket}`
  // Copies: a message's data is a view of the socket's read buffer, which it would keep whole.
  const latest = new Map<string, Uint8Array | null>()
  let bytes = 0
  // The connection's disconnects and reconnects when the kept writes were last checked: writes
  // may be missed while it is away, so none kept from before one is trusted.
  let changes = nats.changes()
  const trust = () => {
    if (nats.changes() === changes) return
    changes = nats.changes()
    latest.clear()
    bytes = 0
  }
  // What an entry counts against `keptBytes`: its value, its key and a little for the entry (a
  // deletion too, so deletions alone cannot grow the map without bound).
  const sizeOf = (key: string, value: Uint8Array | null) => (value?.length ?? 0) + key.length + 64
  const keep = (key: string, msg: Msg) => {
    trust()
    const before = latest.get(key)
    if (before !== undefined) {
      bytes -= sizeOf(key, before)
      latest.delete(key)
    }
    // `new Uint8Array`, not `slice`: the data may be a Buffer, whose `slice` is a view.
    const value = deletes(msg.headers?.get("KV-Operation")) ? null : new Uint8Array(msg.data)
    latest.set(key, value)
    bytes += sizeOf(key, value)
    for (const [oldest, kept] of latest) {
      if (bytes <= keptBytes) break
      latest.delete(oldest)
      bytes -= sizeOf(oldest, kept)
    }
  }
  const queues = new Map<string | undefined, Set<Queued>>()
  const deliver = (to: Set<Queued> | undefined, msg: Msg | typeof MISSED) => {
    for (const q of to ?? []) {
      if (q.msgs.length >= WRITES_QUEUED) q.msgs.shift()
      q.msgs.push(msg)
      q.wake?.()
    }
  }
  let ended = false
  const sub: Subscription = nats.connection.subscribe(prefix + filter, {
    callback: (error, msg) => {
      if (error !== null) return
      const key = msg.subject.slice(prefix.length)
      if (keptBytes > 0) keep(key, msg)
      deliver(queues.get(key), msg)
      deliver(queues.get(undefined), msg)
    },
  })
  // A wait on a key reads it again (the queue of every key, `writesEach`'s, has a way back of its
  // caller's: the host agent's command watch).
  const stopListening = nats.onReconnect(() => {
    for (const [key, set] of queues) if (key !== undefined) deliver(set, MISSED)
  })
  void sub.closed.then(() => {
    ended = true
    stopListening()
    for (const set of queues.values()) for (const q of set) q.wake?.()
  })
  const queue = (key: string | undefined): WritesQueue => {
    const q: Queued = { msgs: [], wake: undefined }
    let set = queues.get(key)
    if (set === undefined) {
      set = new Set()
      queues.set(key, set)
    }
    set.add(q)
    const next = (deadline: number) =>
      Effect.async<Msg | typeof MISSED | undefined, NatsError>((resume) => {
        const ready = () => {
          const msg = q.msgs.shift()
          if (msg !== undefined) resume(Effect.succeed(msg))
          else if (ended) resume(Effect.fail(new NatsError({ operation, message: "the subscription ended" })))
          else return false
          return true
        }
        if (ready()) return
        const left = deadline - Date.now()
        if (left <= 0) return resume(Effect.succeed(undefined))
        const timer = Number.isFinite(left)
          ? setTimeout(() => {
              q.wake = undefined
              resume(Effect.succeed(undefined))
            }, left)
          : undefined
        q.wake = () => {
          if (!ready()) return
          q.wake = undefined
          clearTimeout(timer)
        }
        return Effect.sync(() => {
          q.wake = undefined
          clearTimeout(timer)
        })
      })
    const close = () => {
      const own = set as Set<Queued>
      own.delete(q)
      if (own.size === 0 && queues.get(key) === own) queues.delete(key)
    }
    return { next, close }
  }
  return {
    latest: (key) => {
      trust()
      return latest.get(key)
    },
    queue,
    open: () => !ended && !sub.isClosed(),
    close: () => {
      stopListening()
      sub.unsubscribe()
    },
  }
}

// Typed views are made freely (per request, per actor read), so each connection opens each bucket
// once and shares the handle, which holds nothing but names. A failed open is forgotten, so the
// next one tries again.
const openedBuckets = new WeakMap<JetStreamClient, Map<string, Promise<KV>>>()
const opened = (js: JetStreamClient, bucket: string): Promise<KV> => {
  let buckets = openedBuckets.get(js)
  if (buckets === undefined) {
    buckets = new Map()
    openedBuckets.set(js, buckets)
  }
  const known = buckets.get(bucket)
  if (known !== undefined) return known
  const opening = new Kvm(js).open(bucket)
  buckets.set(bucket, opening)
  opening.catch(() => buckets.delete(bucket))
  return opening
}

// Whether a bucket's stream allows direct gets, from its configuration (the client's `open` only
// binds to the name and reads nothing, so it cannot tell): asked once per connection and bucket, at
// the first read that needs it, so making a view never waits on the server. An answer that did not
// come is forgotten, so the next read asks again.
const directness = new WeakMap<JetStreamClient, Map<string, boolean | Promise<boolean>>>()
const directsOf = (js: JetStreamClient) => {
  let buckets = directness.get(js)
  if (buckets === undefined) {
    buckets = new Map()
    directness.set(js, buckets)
  }
  return buckets
}
const directOf = (js: JetStreamClient, jsm: JetStreamManager, bucket: string): boolean | Promise<boolean> => {
  const buckets = directsOf(js)
  const known = buckets.get(bucket)
  if (known !== undefined) return known
  const asking = jsm.streams.info(`KV_${bucket}`).then((info) => {
    const direct = info.config.allow_direct === true
    buckets.set(bucket, direct)
    return direct
  })
  buckets.set(bucket, asking)
  asking.catch(() => buckets.delete(bucket))
  return asking
}

interface Codecs {
  readonly encodeJson: (value: unknown) => Either.Either<string, ParseError>
  readonly decodeJson: (text: string) => Either.Either<unknown, ParseError>
}

/** How many decoded values each schema's codecs keep, by their text, and the longest text kept. */
export const DECODED_KEPT = 256
export const DECODED_KEPT_CHARS = 16_384

// Typed views are made freely (per request, per handler run); compiling a schema's JSON codecs is
// what costs (a third of a millisecond for a command record), so it happens once per schema.
// Synchronous codecs: our schemas have no async parts, and the `Either` forms take no fiber steps.
//
// A value decoded is kept by its text, the last `DECODED_KEPT` per schema, for texts of at most
// `DECODED_KEPT_CHARS` (so at most about 8 MB a schema). One process has several readers of a
// write (with every role in it: the gateway waiting on a command, the host's feed, the run actor),
// and decoding a command record costs 20–130 µs: `bench/runs.ts` saw about a third of its decodes
// answered from here. Decoding is a function of the text, so the kept value is what decoding would
// give; it is shared between readers, which never change what they read (the types are readonly).
const compiled = new WeakMap<Schema.Schema.Any, Codecs>()
const codecsOf = <A, I>(schema: Schema.Schema<A, I>) => {
  let codecs = compiled.get(schema)
  if (codecs === undefined) {
    const json = Schema.parseJson(schema)
    const decode = Schema.decodeEither(json)
    const kept = new Map<string, unknown>()
    codecs = {
      encodeJson: Schema.encodeEither(json) as Codecs["encodeJson"],
      decodeJson: (text) => {
        const keep = text.length <= DECODED_KEPT_CHARS
        const known = keep ? kept.get(text) : undefined
        if (known !== undefined) return Either.right(known)
        const decoded = decode(text)
        if (keep && Either.isRight(decoded) && decoded.right !== undefined) {
          if (kept.size >= DECODED_KEPT) kept.delete(kept.keys().next().value as string)
          kept.set(text, decoded.right)
        }
        return decoded
      },
    }
    compiled.set(schema, codecs)
  }
  return codecs as {
    readonly encodeJson: (value: A) => Either.Either<string, ParseError>
    readonly decodeJson: (text: string) => Either.Either<A, ParseError>
  }
}

// Typed views hold nothing but the connection's clients, names and compiled codecs, and callers
// make them where they use them (per request, per actor message), so each connection keeps the
// views it made, by bucket and schema: a view made again is the one made before, with no wait for
// the bucket's opening and nothing built. Keyed weakly, so a schema made on the fly goes with its view.
const madeViews = new WeakMap<JetStreamClient, Map<string, WeakMap<Schema.Schema.Any, Kv<unknown>>>>()

/** Opens the typed view of an existing bucket (once per connection, bucket and schema). */
export const make = <A, I>(
  bucket: string,
  schema: Schema.Schema<A, I>,
): Effect.Effect<Kv<A>, NatsError, Nats> =>
  Effect.flatMap(Nats, (nats) => {
    let byBucket = madeViews.get(nats.js)
    const known = byBucket?.get(bucket)?.get(schema)
    if (known !== undefined) return Effect.succeed(known as Kv<A>)
    return Effect.map(build(nats, bucket, schema), (view) => {
      if (byBucket === undefined) {
        byBucket = new Map()
        madeViews.set(nats.js, byBucket)
      }
      let bySchema = byBucket.get(bucket)
      if (bySchema === undefined) {
        bySchema = new WeakMap()
        byBucket.set(bucket, bySchema)
      }
      bySchema.set(schema, view as Kv<unknown>)
      return view
    })
  })

const build = <A, I>(
  nats: Nats["Type"],
  bucket: string,
  schema: Schema.Schema<A, I>,
): Effect.Effect<Kv<A>, NatsError> =>
  Effect.gen(function* () {
    const { js, jsm, requests } = nats
    const kv: KV = yield* attempt(`kv.open ${bucket}`, () => opened(js, bucket))
    const { encodeJson, decodeJson } = codecsOf(schema)
    const textDecoder = new TextDecoder()
    const streamName = `KV_${bucket}`
    const subjectPrefix = `$KV.${bucket}.`

    const encode = (key: string, value: A): Either.Either<string, KvValueInvalid> =>
      Either.mapLeft(
        encodeJson(value),
        (e) => new KvValueInvalid({ bucket, key, direction: "encode", message: e.message }),
      )
    const decode = (key: string, bytes: Uint8Array): Either.Either<A, KvValueInvalid> =>
      Either.mapLeft(
        decodeJson(textDecoder.decode(bytes)),
        (e) => new KvValueInvalid({ bucket, key, direction: "decode", message: e.message }),
      )
    // What `@nats-io/kv` writes: the key's subject in the bucket's stream, the expected revision
    // as `Nats-Expected-Last-Subject-Sequence`. Written through the shared inbox (`core/Requests.ts`).
    const headersOf = (revision: number | undefined) => {
      const h = natsHeaders()
      if (revision !== undefined) h.set(PubHeaders.ExpectedLastSubjectSequenceHdr, `${revision}`)
      return h
    }
    const invalidKey = (operation: string, key: string) =>
      new NatsError({ operation, message: `invalid key: ${key}` })
    const write = (operation: string, key: string, text: string, revision?: number) => {
      if (!validKey.test(key)) return Effect.fail(invalidKey(operation, key))
      return Effect.map(
        publishVia(requests, operation, subjectPrefix + key, text, headersOf(revision)),
        (ack) => ack.seq,
      )
    }
    const conflictOr =
      (key: string, expectedRevision: number) =>
      (error: NatsError): Effect.Effect<never, StateConflict | NatsError> =>
        isConflict(error)
          ? Effect.fail(new StateConflict({ bucket, key, expectedRevision }))
          : Effect.fail(error)

    // A single node's bucket streams allow direct gets (`core/Storage.ts`): the last message on the
    // key's subject, asked through the shared inbox as `@nats-io/kv` asks through its own request.
    // A replicated bucket's do not: any replica answers a direct get, and one that has not yet
    // applied an acknowledged write answers the value before it (or none), so there the stream's
    // leader answers (`leaderGet`), as the client does for a stream without direct gets.
    const getOperation = `kv.get ${bucket}`
    const directGet = `$JS.API.DIRECT.GET.KV_${bucket}.$KV.${bucket}.`
    const leaderGet = `$JS.API.STREAM.MSG.GET.KV_${bucket}`
    const entryOfLeader = (
      key: string,
      msg: Msg,
    ): Effect.Effect<Option.Option<KvEntry<A>>, NatsError | KvValueInvalid> => {
      const answer = Either.try(() => JSON.parse(textDecoder.decode(msg.data)) as MsgGetAnswer)
      if (Either.isLeft(answer))
        return Effect.fail(new NatsError({ operation: getOperation, message: "invalid answer" }))
      const { error, message } = answer.right
      if (error !== undefined) {
        if (error.code === 404) return Effect.succeed(Option.none())
        return Effect.fail(
          new NatsError({ operation: getOperation, message: error.description ?? "error", cause: error }),
        )
      }
      if (message === undefined)
        return Effect.fail(new NatsError({ operation: getOperation, message: "invalid answer" }))
      const operation = /^KV-Operation:\s*(\S+)/im.exec(
        message.hdrs === undefined ? "" : Buffer.from(message.hdrs, "base64").toString("utf8"),
      )?.[1]
      if (deletes(operation)) return Effect.succeed(Option.none())
      const data = message.data === undefined ? empty : new Uint8Array(Buffer.from(message.data, "base64"))
      return Either.match(decode(key, data), {
        onLeft: Effect.fail,
        onRight: (value) => Effect.succeed(Option.some({ value, revision: message.seq })),
      })
    }
    // Whether the bucket's stream allows direct gets, as its configuration says (`core/Storage.ts`:
    // single node only); asked at the first read.
    const get: Kv<A>["get"] = (key) => {
      if (!validKey.test(key))
        return Effect.fail(new NatsError({ operation: getOperation, message: `invalid key: ${key}` }))
      const direct = directOf(js, jsm, bucket)
      return typeof direct === "boolean"
        ? getAs(direct, key)
        : Effect.flatMap(
            attempt(getOperation, () => direct),
            (d) => getAs(d, key),
          )
    }
    const getAs = (
      direct: boolean,
      key: string,
    ): Effect.Effect<Option.Option<KvEntry<A>>, NatsError | KvValueInvalid> => {
      if (!direct)
        return Effect.flatMap(
          requests.request(
            getOperation,
            leaderGet,
            new TextEncoder().encode(JSON.stringify({ last_by_subj: subjectPrefix + key })),
            undefined,
            GET_TIMEOUT_MS,
          ),
          (msg) => entryOfLeader(key, msg),
        )
      return Effect.flatMap(
        requests.request(getOperation, directGet + key, empty, undefined, GET_TIMEOUT_MS),
        (msg): Effect.Effect<Option.Option<KvEntry<A>>, NatsError | KvValueInvalid> => {
          const h = msg.headers
          if (h === undefined || h.code !== 0) {
            if (h?.code === 404) return Effect.succeed(Option.none())
            return Effect.fail(
              new NatsError({
                operation: getOperation,
                message: h?.description || "invalid answer",
                cause: { status: h?.code },
              }),
            )
          }
          if (deletes(h.get("KV-Operation"))) return Effect.succeed(Option.none())
          const revision = Number(h.get("Nats-Sequence"))
          return Either.match(decode(key, msg.data), {
            onLeft: Effect.fail,
            onRight: (value) => Effect.succeed(Option.some({ value, revision })),
          })
        },
      )
    }

    // A write expecting no earlier value; when there is one, the client's own create decides (a
    // deleted key counts as absent: it writes over the deletion's revision).
    const createOperation = `kv.create ${bucket}`
    const createdOr = (key: string, text: string) => (error: NatsError) =>
      isConflict(error)
        ? attempt(createOperation, () => kv.create(key, text)).pipe(Effect.catchAll(conflictOr(key, 0)))
        : Effect.fail(error)
    const create: Kv<A>["create"] = (key, value) =>
      Effect.flatMap(encode(key, value), (text) =>
        write(createOperation, key, text, 0).pipe(Effect.catchAll(createdOr(key, text))),
      )
    const creating: Kv<A>["creating"] = (key, value) =>
      Effect.flatMap(encode(key, value), (text) =>
        validKey.test(key)
          ? Effect.map(sendVia(requests, createOperation, subjectPrefix + key, text, headersOf(0)), (acked) =>
              acked.pipe(
                Effect.map((ack) => ack.seq),
                Effect.catchAll(createdOr(key, text)),
              ),
            )
          : Effect.fail(invalidKey(createOperation, key)),
      )

    const update: Kv<A>["update"] = (key, value, revision) =>
      revision === 0
        ? create(key, value)
        : Effect.flatMap(encode(key, value), (text) =>
            write(`kv.update ${bucket}`, key, text, revision).pipe(
              Effect.catchAll(conflictOr(key, revision)),
            ),
          )

    const put: Kv<A>["put"] = (key, value) =>
      Effect.flatMap(encode(key, value), (text) => write(`kv.put ${bucket}`, key, text))

    const del: Kv<A>["delete"] = (key, options) =>
      attempt(`kv.delete ${bucket}`, () =>
        kv.delete(key, options?.revision === undefined ? undefined : { previousSeq: options.revision }),
      ).pipe(Effect.catchAll(conflictOr(key, options?.revision ?? 0)))

    // No consumer: the client's `keys()` makes a push consumer per call that the server keeps for
    // minutes after, so a burst of listings filled the server's consumer limit for everyone. The
    // stream's subject list (stream info) names every key ever written and not purged away; a
    // batched direct get of each one's last message tells which are deleted (its header says so).
    const keys: Kv<A>["keys"] = (filter = ">") =>
      attempt(`kv.keys ${bucket}`, async () => {
        const info = await jsm.streams.info(streamName, { subjects_filter: `${subjectPrefix}${filter}` })
        const subjects = Object.keys(info.state.subjects ?? {})
        const out: Array<string> = []
        const direct = info.config.allow_direct === true
        directsOf(js).set(bucket, direct)
        if (!direct) {
          // A replicated bucket: each key's last message from the stream's leader (see `get`).
          for (let i = 0; i < subjects.length; i += LEADER_KEYS_AT_ONCE) {
            const found = await Promise.all(
              subjects
                .slice(i, i + LEADER_KEYS_AT_ONCE)
                .map((subject) =>
                  jsm.streams
                    .getMessage(streamName, { last_by_subj: subject })
                    .then((m) => (m === null ? undefined : { subject, op: m.header?.get("KV-Operation") })),
                ),
            )
            for (const f of found)
              if (f !== undefined && !deletes(f.op)) out.push(f.subject.slice(subjectPrefix.length))
          }
          return out.sort()
        }
        for (let i = 0; i < subjects.length; i += KEYS_BATCH) {
          const batch = subjects.slice(i, i + KEYS_BATCH)
          for await (const m of await jsm.direct.getLastMessagesFor(streamName, { multi_last: batch })) {
            if (!deletes(m.header?.get("KV-Operation"))) out.push(m.subject.slice(subjectPrefix.length))
          }
        }
        return out.sort()
      })

    const openWatch = (filter: string, options: WatchOptions) =>
      Effect.acquireRelease(
        attempt(`kv.watch ${bucket}`, () =>
          kv.watch({
            key: filter,
            include: includeOf[options.include ?? "last"],
            ...(options.fromRevision === undefined ? {} : { resumeFromRevision: options.fromRevision }),
          }),
        ),
        (iterator) => Effect.sync(() => iterator.stop()),
      )
    const changeOf = (e: KvWatchEntry): Effect.Effect<KvChange<A>, KvValueInvalid> =>
      e.operation === "PUT"
        ? Effect.map(
            decode(e.key, e.value),
            (value): KvChange<A> => ({ _tag: "Put", key: e.key, value, revision: e.revision }),
          )
        : Effect.succeed({ _tag: "Deleted", key: e.key, revision: e.revision })

    const watchEach: Kv<A>["watchEach"] = (filter, options, f) =>
      Effect.scoped(
        Effect.flatMap(openWatch(filter, options), (iterator) => {
          const entries = iterator[Symbol.asyncIterator]()
          const next = attempt(`kv.watch ${bucket}`, () => entries.next())
          return Effect.gen(function* () {
            for (;;) {
              const step = yield* next
              if (step.done === true) return
              if (options.skip?.(step.value.key, step.value.revision) === true) continue
              yield* f(yield* changeOf(step.value))
            }
          })
        }),
      )

    const watchScoped: Kv<A>["watchScoped"] = (filter = ">", options = {}) =>
      Effect.map(openWatch(filter, options), (iterator) =>
        Stream.fromAsyncIterable(
          // Ended by stopping the watch, which ends the pending read too.
          endingAtOnce(iterator, () => iterator.stop()),
          (cause) =>
            new NatsError({
              operation: `kv.watch ${bucket}`,
              message: cause instanceof Error ? cause.message : String(cause),
              cause,
            }),
        ).pipe(Stream.mapEffect(changeOf)),
      )

    const watch: Kv<A>["watch"] = (filter, options) => Stream.unwrapScoped(watchScoped(filter, options))

    const republished = republishedPrefix(bucket)
    // Stored writes only. No flush: the read goes out on the same connection after the
    // subscription, and the server handles one connection's messages in order, so a write
    // republished before it listens was stored before the read. One callback subscription and one
    // timer, no fibers: a long poll's wait is on the path of every command.
    const followed = (filter: string, keptBytes: number): Either.Either<FollowedWrites, NatsError> => {
      try {
        return Either.right(followWrites(nats, republished, filter, bucket, keptBytes))
      } catch (cause) {
        const message = cause instanceof Error ? cause.message : String(cause)
        return Either.left(new NatsError({ operation: `kv.subscribe ${bucket}`, message, cause }))
      }
    }

    // The first value of `key` that `test` accepts, current or to come, from `writes`, up to
    // `deadline`: the latest write that came is the current value, else it is read (after the
    // key's writes are queued, so none is missed; those not newer than the read are passed over).
    const awaitIn = (
      writes: FollowedWrites,
      key: string,
      test: (value: A) => boolean,
      deadline: number,
    ): Effect.Effect<Option.Option<A>, NatsError | KvValueInvalid> =>
      Effect.suspend(() => {
        // Closed: what it kept may be old.
        if (!writes.open())
          return Effect.fail(
            new NatsError({ operation: `kv.subscribe ${bucket}`, message: "the subscription ended" }),
          )
        const queue = writes.queue(key)
        return Effect.gen(function* () {
          let read = 0
          // The key as stored: its value when the test takes it; else the revision read, so that
          // the queued writes it already shows are passed over.
          const readNow = Effect.suspend(() =>
            Effect.map(get(key), (now) => {
              if (Option.isNone(now)) return Option.none<A>()
              if (test(now.value.value)) return Option.some(now.value.value)
              read = now.value.revision
              return Option.none<A>()
            }),
          )
          const seen = writes.latest(key)
          if (seen !== undefined) {
            if (seen !== null) {
              const value = yield* decode(key, seen)
              if (test(value)) return Option.some(value)
            }
          } else {
            const now = yield* readNow
            if (Option.isSome(now)) return now
          }
          for (;;) {
            const msg = yield* queue.next(deadline)
            if (msg === undefined) return Option.none()
            if (msg === MISSED) {
              const now = yield* readNow
              if (Option.isSome(now)) return now
              continue
            }
            if (read > 0 && Number(msg.headers?.get("Nats-Sequence")) <= read) continue
            const value = yield* writtenValue(key, msg)
            if (Option.isSome(value) && test(value.value)) return value
          }
        }).pipe(Effect.ensuring(Effect.sync(() => queue.close())))
      })
    // A republished write's value; none for a deletion.
    const writtenValue = (key: string, msg: Msg): Effect.Effect<Option.Option<A>, KvValueInvalid> => {
      return deletes(msg.headers?.get("KV-Operation"))
        ? Effect.succeedNone
        : Effect.map(decode(key, msg.data), Option.some)
    }

    const deadlineOf = (timeoutMs: number | undefined) =>
      timeoutMs === undefined ? Number.POSITIVE_INFINITY : Date.now() + timeoutMs

    // One key's own subscription, for one wait.
    const awaitUpTo = (
      key: string,
      test: (value: A) => boolean,
      timeoutMs: number | undefined,
    ): Effect.Effect<Option.Option<A>, NatsError | KvValueInvalid> =>
      Effect.suspend(() => {
        const deadline = deadlineOf(timeoutMs)
        return Either.match(followed(key, 0), {
          onLeft: Effect.fail,
          onRight: (writes) =>
            awaitIn(writes, key, test, deadline).pipe(Effect.ensuring(Effect.sync(() => writes.close()))),
        })
      })

    const follow: Kv<A>["follow"] = (filter) =>
      Effect.suspend(() =>
        Either.map(followed(filter, FOLLOWED_BYTES), (writes) => ({
          awaitValueUpTo: (key, test, timeoutMs) => awaitIn(writes, key, test, deadlineOf(timeoutMs)),
          open: writes.open,
          close: writes.close,
        })),
      )

    const writesEach: Kv<A>["writesEach"] = (filter, options, f) =>
      Effect.acquireUseRelease(
        Effect.suspend(() => followed(filter, 0)),
        (writes) => {
          const queue = writes.queue(undefined)
          return Effect.gen(function* () {
            for (;;) {
              const msg = yield* queue.next(Number.POSITIVE_INFINITY)
              if (msg === undefined || msg === MISSED) continue
              const key = msg.subject.slice(republished.length)
              const revision = Number(msg.headers?.get("Nats-Sequence"))
              if (options.skip?.(key, revision) === true) continue
              const value = yield* writtenValue(key, msg)
              yield* f(
                Option.isNone(value)
                  ? { _tag: "Deleted", key, revision }
                  : { _tag: "Put", key, value: value.value, revision },
              )
            }
          })
        },
        (writes) => Effect.sync(() => writes.close()),
      )

    const awaitValue: Kv<A>["awaitValue"] = (key, test) =>
      Effect.map(awaitUpTo(key, test, undefined), Option.getOrThrow)
    const awaitValueUpTo: Kv<A>["awaitValueUpTo"] = (key, test, timeoutMs) => awaitUpTo(key, test, timeoutMs)

    return {
      bucket,
      get,
      create,
      creating,
      update,
      put,
      delete: del,
      keys,
      watch,
      watchEach,
      writesEach,
      watchScoped,
      awaitValue,
      awaitValueUpTo,
      follow,
    } satisfies Kv<A>
  })

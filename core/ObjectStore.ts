/**
 * Object stores with streaming put and get: an object goes in and comes out chunk by chunk
 * (128 KiB), never held whole in memory, and its SHA-256 is checked on the way out.
 *
 * The bucket must exist (`core/Storage.ts`). Put keeps a bounded window of chunk publishes
 * awaiting their acknowledgement, so a fast producer is slowed to the server's pace with at most
 * 2 MiB held; get reads the chunks with a pull consumer holding a few chunks ahead of the reader.
 */
import { createHash, randomBytes } from "node:crypto"
import type { Readable } from "node:stream"
import type { ObjectInfo as NatsObjectInfo, ObjectStore as NatsObjectStore } from "@nats-io/obj"
import { Base64UrlPaddedCodec, Objm } from "@nats-io/obj"
import { headers } from "@nats-io/transport-node"
import { Data, Effect, Option, Stream } from "effect"
import { attempt, Nats, NatsError } from "./Nats.ts"
import { dropConsumer } from "./StreamRead.ts"

/** What the store knows of one object. */
export interface ObjectInfo {
  readonly bucket: string
  readonly name: string
  readonly size: number
  readonly chunks: number
  /** `SHA-256=<base64url>` of the content. */
  readonly digest: string
  /** ISO time of the last put. */
  readonly mtime: string
  readonly revision: number
}

/** An object read back with a digest other than the one recorded at put. */
export class ObjectCorrupt extends Data.TaggedError("ObjectCorrupt")<{
  readonly bucket: string
  readonly name: string
  readonly message: string
}> {}

/** A typed view of one object store. */
export interface ObjectStore {
  readonly bucket: string
  /**
   * Stores `data` under `name`, replacing any earlier object of that name once complete (a
   * failed put leaves the earlier object intact and its own chunks purged). A failure of the
   * source stream fails the put with the source's own error. The source is pulled one Effect
   * chunk at a time, so give it bounded pieces (`Stream.rechunk(1)` over large buffers).
   */
  readonly put: <E = never>(
    name: string,
    data: Stream.Stream<Uint8Array, E> | Readable,
    options?: { readonly description?: string },
  ) => Effect.Effect<ObjectInfo, NatsError | E>
  /**
   * The object's info and its content as a stream, or none when absent or deleted. The content
   * stream fails with `ObjectCorrupt` at the end if the digest does not match.
   */
  readonly get: (name: string) => Effect.Effect<
    Option.Option<{
      readonly info: ObjectInfo
      readonly data: Stream.Stream<Uint8Array, NatsError | ObjectCorrupt>
    }>,
    NatsError
  >
  /** The object's info, or none when absent or deleted. */
  readonly info: (name: string) => Effect.Effect<Option.Option<ObjectInfo>, NatsError>
  /** Deletes the object and purges its chunks; deleting an absent object succeeds. */
  readonly delete: (name: string) => Effect.Effect<void, NatsError>
}

const toInfo = (i: NatsObjectInfo): ObjectInfo => ({
  bucket: i.bucket,
  name: i.name,
  size: i.size,
  chunks: i.chunks,
  digest: i.digest,
  mtime: i.mtime,
  revision: i.revision,
})

// How many chunks the get consumer pulls ahead of the reader (8 × 128 KiB).
const READ_AHEAD = 8
// Chunk size of a put (the object store's usual 128 KiB) and how many chunk publishes may await
// their acknowledgement at once (16 × 128 KiB = 2 MiB held per put).
const PUT_CHUNK = 128 * 1024
const PUT_WINDOW = 16

/** Opens the typed view of an existing object store. */
export const make = (bucket: string): Effect.Effect<ObjectStore, NatsError, Nats> =>
  Effect.gen(function* () {
    const { js, jsm } = yield* Nats
    const store: NatsObjectStore = yield* attempt(`obj.open ${bucket}`, () =>
      new Objm(js).open(bucket, false),
    )
    const streamName = `OBJ_${bucket}`

    const info: ObjectStore["info"] = (name) =>
      attempt(`obj.info ${bucket}`, () => store.info(name)).pipe(
        Effect.map((i) => (i === null || i.deleted ? Option.none() : Option.some(toInfo(i)))),
      )

    // The put writes what @nats-io/obj's put writes (chunks on `$O.<bucket>.C.<nuid>`, then the
    // metadata with a subject rollup on `$O.<bucket>.M.<name>`), but keeps up to PUT_WINDOW chunk
    // publishes in flight instead of waiting for each acknowledgement: one connection delivers
    // them in order, and a round trip per 128 KiB would cap a put at a few tens of MB/s.
    const put = <E>(
      name: string,
      data: Stream.Stream<Uint8Array, E> | Readable,
      options: { readonly description?: string } = {},
    ): Effect.Effect<ObjectInfo, NatsError | E> =>
      Effect.gen(function* () {
        const source: Stream.Stream<Uint8Array, E | NatsError> =
          Stream.StreamTypeId in data
            ? (data as Stream.Stream<Uint8Array, E>)
            : Stream.fromAsyncIterable(
                data as Readable,
                (cause) =>
                  new NatsError({ operation: `obj.put ${bucket} source`, message: String(cause), cause }),
              )
        // The earlier object's chunks (its nuid is in the raw info only), purged once this one is live.
        const old = yield* attempt(`obj.info ${bucket}`, () => store.info(name))
        const nuid = randomBytes(16).toString("hex")
        const chunkSubject = `$O.${bucket}.C.${nuid}`
        const hash = createHash("sha256")
        const totals = { size: 0, chunks: 0 }
        const inFlight = new Set<Promise<void>>()
        let publishFailure: unknown
        const failed = () =>
          new NatsError({
            operation: `obj.put ${bucket}`,
            message: publishFailure instanceof Error ? publishFailure.message : String(publishFailure),
            cause: publishFailure,
          })
        const settle = Effect.promise(() => Promise.all(inFlight))

        const publishChunk = (payload: Uint8Array) =>
          Effect.promise(async () => {
            while (inFlight.size >= PUT_WINDOW) await Promise.race(inFlight)
            if (publishFailure !== undefined) return
            hash.update(payload)
            totals.size += payload.byteLength
            totals.chunks++
            const sent: Promise<void> = js.publish(chunkSubject, payload).then(
              () => undefined,
              (e: unknown) => {
                publishFailure ??= e
              },
            )
            inFlight.add(sent)
            void sent.finally(() => inFlight.delete(sent))
          }).pipe(
            Effect.zipRight(
              Effect.suspend(() => (publishFailure === undefined ? Effect.void : Effect.fail(failed()))),
            ),
          )

        // Cut the source into chunks of exactly PUT_CHUNK bytes (the last one shorter).
        let pending: Array<Uint8Array> = []
        let pendingBytes = 0
        const take = (n: number): Uint8Array => {
          const out = new Uint8Array(n)
          let at = 0
          while (at < n) {
            const head = pending[0]!
            const used = Math.min(head.byteLength, n - at)
            out.set(head.subarray(0, used), at)
            at += used
            if (used === head.byteLength) pending.shift()
            else pending[0] = head.subarray(used)
          }
          pendingBytes -= n
          return out
        }
        const write = Effect.gen(function* () {
          yield* Stream.runForEach(source, (piece) =>
            Effect.gen(function* () {
              if (piece.byteLength === 0) return
              pending.push(piece)
              pendingBytes += piece.byteLength
              while (pendingBytes >= PUT_CHUNK) yield* publishChunk(take(PUT_CHUNK))
            }),
          )
          if (pendingBytes > 0) yield* publishChunk(take(pendingBytes))
          pending = []
          yield* settle
          if (publishFailure !== undefined) return yield* Effect.fail(failed())
          const meta = {
            name,
            description: options.description ?? "",
            options: { max_chunk_size: PUT_CHUNK },
            bucket,
            nuid,
            size: totals.size,
            chunks: totals.chunks,
            mtime: new Date().toISOString(),
            digest: `SHA-256=${Base64UrlPaddedCodec.encode(hash.digest())}`,
            deleted: false,
          }
          const rollup = headers()
          rollup.set("Nats-Rollup", "sub")
          const ack = yield* attempt(`obj.put ${bucket}`, () =>
            js.publish(`$O.${bucket}.M.${Base64UrlPaddedCodec.encode(name)}`, JSON.stringify(meta), {
              headers: rollup,
            }),
          )
          const stored: ObjectInfo = {
            bucket,
            name,
            size: meta.size,
            chunks: meta.chunks,
            digest: meta.digest,
            mtime: meta.mtime,
            revision: ack.seq,
          }
          return stored
        })
        const purge = (subject: string) =>
          attempt(`obj.purge ${bucket}`, () => jsm.streams.purge(streamName, { filter: subject })).pipe(
            Effect.ignore,
          )
        return yield* write.pipe(
          // A failed or interrupted put removes its own chunks; the earlier object stays.
          Effect.onExit((exit) =>
            exit._tag === "Success" ? Effect.void : Effect.zipRight(settle, purge(chunkSubject)),
          ),
          // Once the new object is live, the earlier one's chunks go (a failure here leaves
          // orphans, not a wrong object).
          Effect.tap(() =>
            old !== null && !old.deleted ? purge(`$O.${bucket}.C.${old.nuid}`) : Effect.void,
          ),
        )
      })

    const content = (i: ObjectInfo, nuid: string): Stream.Stream<Uint8Array, NatsError | ObjectCorrupt> => {
      if (i.chunks === 0) return Stream.empty
      const expected = Buffer.from(i.digest.replace(/^SHA-256=/i, ""), "base64url")
      const chunks = Stream.unwrapScoped(
        Effect.gen(function* () {
          const consumer = yield* attempt(`obj.get ${bucket}`, () =>
            js.consumers.get(streamName, { filter_subjects: [`$O.${bucket}.C.${nuid}`] }),
          )
          const messages = yield* Effect.acquireRelease(
            attempt(`obj.get ${bucket}`, () => consumer.consume({ max_messages: READ_AHEAD })),
            (m) =>
              Effect.promise(() => m.close()).pipe(Effect.ignore, Effect.zipRight(dropConsumer(consumer))),
          )
          return Stream.fromAsyncIterable(
            messages,
            (cause) => new NatsError({ operation: `obj.get ${bucket}`, message: String(cause), cause }),
          ).pipe(
            Stream.take(i.chunks),
            Stream.map((m) => m.data),
          )
        }),
      )
      return Stream.suspend(() => {
        const hash = createHash("sha256")
        return chunks.pipe(
          Stream.tap((c) => Effect.sync(() => hash.update(c))),
          Stream.concat(
            Stream.fromEffect(
              Effect.suspend(() =>
                hash.digest().equals(expected)
                  ? Effect.void
                  : Effect.fail(
                      new ObjectCorrupt({
                        bucket,
                        name: i.name,
                        message: "content does not match its digest",
                      }),
                    ),
              ),
            ).pipe(Stream.drain),
          ),
        )
      })
    }

    const get: ObjectStore["get"] = (name) =>
      attempt(`obj.info ${bucket}`, () => store.info(name)).pipe(
        Effect.map((raw) => {
          if (raw === null || raw.deleted) return Option.none()
          const i = toInfo(raw)
          return Option.some({ info: i, data: content(i, raw.nuid) })
        }),
      )

    const del: ObjectStore["delete"] = (name) =>
      attempt(`obj.delete ${bucket}`, () => store.delete(name)).pipe(Effect.asVoid)

    return { bucket, put, get, info, delete: del } satisfies ObjectStore
  })

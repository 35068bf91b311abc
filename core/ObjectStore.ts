/**
 * Object stores with streaming put and get: an object goes in and comes out chunk by chunk
 * (128 KiB), never held whole in memory, and its SHA-256 is checked on the way out.
 *
 * The bucket must exist (`core/Storage.ts`). Put awaits each chunk's acknowledgement before
 * reading the next, so a fast producer is slowed to the server's pace; get reads the chunks with
 * an ordered pull consumer holding at most a few chunks ahead of the reader.
 */
import { createHash } from "node:crypto"
import type { Readable } from "node:stream"
import type { ObjectInfo as NatsObjectInfo, ObjectStore as NatsObjectStore } from "@nats-io/obj"
import { Objm } from "@nats-io/obj"
import { type Cause, Data, Effect, Option, Stream } from "effect"
import { attempt, Nats, NatsError } from "./Nats.ts"

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

/** Opens the typed view of an existing object store. */
export const make = (bucket: string): Effect.Effect<ObjectStore, NatsError, Nats> =>
  Effect.gen(function* () {
    const { js } = yield* Nats
    const store: NatsObjectStore = yield* attempt(`obj.open ${bucket}`, () =>
      new Objm(js).open(bucket, false),
    )
    const streamName = `OBJ_${bucket}`

    const info: ObjectStore["info"] = (name) =>
      attempt(`obj.info ${bucket}`, () => store.info(name)).pipe(
        Effect.map((i) => (i === null || i.deleted ? Option.none() : Option.some(toInfo(i)))),
      )

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
        // The source's own failure is kept aside: the client only sees an errored ReadableStream.
        let sourceFailure: Cause.Cause<E | NatsError> | undefined
        const readable = yield* source.pipe(
          Stream.tapErrorCause((cause) =>
            Effect.sync(() => {
              sourceFailure = cause
            }),
          ),
          Stream.toReadableStreamEffect(),
        )
        return yield* attempt(`obj.put ${bucket}`, () =>
          store.put(
            { name, ...(options.description === undefined ? {} : { description: options.description }) },
            readable,
          ),
        ).pipe(
          Effect.map(toInfo),
          Effect.catchAll((e) =>
            sourceFailure === undefined ? Effect.fail(e) : Effect.failCause(sourceFailure),
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
            (m) => Effect.promise(() => m.close()).pipe(Effect.ignore),
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

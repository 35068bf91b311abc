/**
 * `PUT /v1/uploads/<file_id>?expires=…&sig=…`: the signed link `POST /v1/files` hands out. The
 * body streams, with backpressure to the client, through a SHA-256 of the plaintext and the sealer
 * into the `files` object store under the upload id (also the sealed object's id, which is how the
 * host agent opens it). Memory stays at a few chunks whatever the size.
 *
 * Checks, in order: the link (a missing, malformed, forged or expired link, or one for an unknown
 * upload: 401 `unauthenticated`), the upload not yet complete (409 `conflict`), the size within
 * the limit (413), `content-type` (400), `content-length` equal to the announced bytes (400 naming
 * `bytes`). A chunked body is counted as it arrives instead.
 *
 * Nothing is half-stored: the size and hash are checked at the end of the plaintext, before the
 * sealer's final chunk, so a body that is too long, too short or has another SHA-256 fails the
 * object store's put before its metadata is written, and the store purges the chunks it wrote (the
 * answer is 400 naming `bytes` or `sha256`). A client that goes away mid-body interrupts the
 * handler; the put is then failed the same way and awaited, so the chunks are gone before the
 * request ends. The record stays `pending` in both cases; only a whole, verified object makes it
 * `complete`.
 */
import { createHash } from "node:crypto"
import { Clock, Context, Deferred, Effect, Exit, Fiber, Layer, Option, Stream } from "effect"
import type { Nats } from "../../core/Nats.ts"
import * as ObjectStore from "../../core/ObjectStore.ts"
import { SealStream } from "../../core/SealStream.ts"
import { Storage } from "../../core/Storage.ts"
import { Uploads } from "../../core/Uploads.ts"
import { ApiError } from "../../schema/Errors.ts"
import { uploadMaxBytes } from "../../schema/Limits.ts"
import { json } from "../Response.ts"
import { streamRoute } from "../Router.ts"
import { orInternal, uploadContentType } from "./Create.ts"
import { UploadLinks, UploadSettings } from "./Links.ts"

/** The `files` object store, opened once. */
export class FilesStore extends Context.Tag("gateway/uploads/FilesStore")<
  FilesStore,
  ObjectStore.ObjectStore
>() {}

/** Opens the storage's `files` object store. */
export const filesLayer: Layer.Layer<FilesStore, unknown, Nats | Storage> = Layer.effect(
  FilesStore,
  Effect.flatMap(Storage, ({ names }) => ObjectStore.make(names.objects.files.name)),
)

const badLink = ApiError.unauthenticated("the upload link is not valid")

const isOctetStream = (contentType: string | undefined): boolean => {
  if (contentType === undefined) return false
  const semi = contentType.indexOf(";")
  return (semi === -1 ? contentType : contentType.slice(0, semi)).trim().toLowerCase() === uploadContentType
}

/**
 * Plaintext bytes per sealed chunk of an upload: larger than the default 64 KiB because a 5 GB file
 * seals noticeably faster in 1 MiB chunks (fewer cipher set-ups); openers read it from the header.
 */
export const SEAL_CHUNK_BYTES = 1024 * 1024

const empty = new Uint8Array(0)
const joined = (pieces: ReadonlyArray<Uint8Array>): Uint8Array =>
  pieces.length === 0 ? empty : pieces.length === 1 ? pieces[0]! : Buffer.concat(pieces)

// How long an interrupted upload may take to fail its put and purge its chunks.
const CLEANUP_TIMEOUT = "30 seconds"

/** The route. */
export const putRoute = streamRoute({
  method: "PUT",
  path: "/v1/uploads/:id",
  // The contract's hard ceiling; the setting (`maxBytes`) and the announced size are checked here.
  bodyLimit: uploadMaxBytes,
  handler: ({ params, query, headers, body }) =>
    Effect.gen(function* () {
      const settings = yield* UploadSettings.Tag
      const links = yield* UploadLinks
      const uploads = yield* Uploads
      const files = yield* FilesStore
      const seal = yield* SealStream

      const expires = query.expires ?? ""
      const sig = query.sig ?? ""
      if (!/^\d{1,12}$/.test(expires) || !/^[A-Za-z0-9_-]{43}$/.test(sig)) return yield* Effect.fail(badLink)
      const entry = yield* orInternal(uploads.get(params.id), "upload record read")
      if (Option.isNone(entry)) return yield* Effect.fail(badLink)
      const record = entry.value.value
      const fields = {
        id: record.id,
        account: record.account,
        bytes: record.bytes,
        sha256: record.sha256,
        expires: Number(expires),
      }
      if (!links.verify(fields, sig)) return yield* Effect.fail(badLink)
      if (fields.expires * 1000 < (yield* Clock.currentTimeMillis)) {
        return yield* Effect.fail(ApiError.unauthenticated("the upload link has expired"))
      }
      if (record.state === "complete") {
        return yield* Effect.fail(ApiError.conflict(`${record.id} is already uploaded`))
      }
      if (record.bytes > settings.maxBytes)
        return yield* Effect.fail(ApiError.payloadTooLarge(settings.maxBytes))
      if (!isOctetStream(headers["content-type"])) {
        return yield* Effect.fail(ApiError.invalidRequest(`content-type: must be ${uploadContentType}`))
      }
      const length = headers["content-length"]
      if (length !== undefined && length !== String(record.bytes)) {
        return yield* Effect.fail(
          ApiError.invalidRequest(
            `bytes: content-length ${length} is not the ${record.bytes} bytes announced`,
          ),
        )
      }

      const hash = createHash("sha256")
      let received = 0
      // Failed when the handler is interrupted: ends the body stream, so the put fails and purges.
      const cancelled = yield* Deferred.make<never, ApiError>()
      const verified = Effect.suspend(() => {
        if (received !== record.bytes) {
          return Effect.fail(
            ApiError.invalidRequest(
              `bytes: the body has ${received} bytes, not the ${record.bytes} announced`,
            ),
          )
        }
        const digest = hash.digest("hex")
        return digest === record.sha256
          ? Effect.void
          : Effect.fail(
              ApiError.invalidRequest(`sha256: the body's SHA-256 is ${digest}, not the one announced`),
            )
      })
      // The sealer is driven by hand: one output piece per body piece, no per-chunk stream elements.
      const sealer = yield* orInternal(seal.sealer(record.account, record.id, SEAL_CHUNK_BYTES), "data key")
      const sealed = body.pipe(
        Stream.interruptWhen(Deferred.await(cancelled)),
        Stream.mapEffect((piece) => {
          received += piece.byteLength
          if (received > record.bytes) {
            return Effect.fail(
              ApiError.invalidRequest(`bytes: the body is longer than the ${record.bytes} bytes announced`),
            )
          }
          hash.update(piece)
          return Effect.succeed(joined(sealer.push(piece)))
        }),
        // The final chunk is sealed only once the plaintext is verified: a refused body never completes.
        Stream.concat(
          Stream.fromEffect(
            Effect.zipRight(
              verified,
              Effect.sync(() => joined(sealer.end())),
            ),
          ),
        ),
        Stream.filter((piece) => piece.byteLength > 0),
      )

      // A daemon, so an interrupted handler can still wait for the store to let go of its chunks.
      const put = yield* Effect.forkDaemon(files.put(record.id, sealed))
      const markComplete = orInternal(uploads.complete(record, entry.value.revision), "upload record update")
      const exit = yield* Fiber.await(put).pipe(
        Effect.onInterrupt(() =>
          Effect.gen(function* () {
            yield* Deferred.fail(cancelled, ApiError.invalidRequest("body: the upload was interrupted"))
            const ended = yield* Fiber.await(put)
            // The body had fully arrived and verified before the interruption: the file is whole.
            if (Exit.isSuccess(ended)) yield* Effect.ignore(markComplete)
            yield* Effect.logWarning("upload interrupted").pipe(
              Effect.annotateLogs({ upload: record.id, received, stored: Exit.isSuccess(ended) }),
            )
          }).pipe(Effect.timeout(CLEANUP_TIMEOUT), Effect.ignore),
        ),
      )
      if (Exit.isFailure(exit)) return yield* orInternal(Effect.failCause(exit.cause), "upload store")
      if (!(yield* markComplete)) {
        return yield* Effect.fail(ApiError.conflict(`${record.id} is already uploaded`))
      }
      yield* Effect.logInfo("upload stored").pipe(
        Effect.annotateLogs({ upload: record.id, account: record.account, bytes: record.bytes }),
      )
      return json({ id: record.id, bytes: record.bytes, sha256: record.sha256 })
    }),
})

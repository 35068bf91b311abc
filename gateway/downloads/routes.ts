/**
 * `GET /v1/downloads/<store>/<object>?account=…&filename=…&expires=…&sig=…`: the signed download
 * links of `core/Links.ts` (run outputs, `get` command results, log parts). Access `anyone`: the
 * signature is the credential, so a link works in a browser, `curl` or a webhook receiver with no
 * key, and nothing else opens an object.
 *
 * Answers:
 * - a link missing a part, naming an unknown store, with a signature that does not verify (any
 *   part changed), or expired: `401 unauthenticated`, as for upload links and as the spec says of
 *   "a wrong or expired credential" (the message says which: not valid / expired). A forged link
 *   is never told apart from a real one that expired: the signature is checked first.
 * - a valid link whose object is gone (kept 30 days, then purged): `404 not_found`.
 * - otherwise `200` streaming the opened (decrypted, verified) object: `content-type`
 *   `application/gzip` for `.tar.gz`/`.tgz`/`.gz`, `application/x-ndjson` for log parts and
 *   `.ndjson`/`.jsonl` names, `application/octet-stream` otherwise; `content-disposition:
 *   attachment` with the signed filename (ASCII fallback and RFC 5987 `filename*`);
 *   `content-length` the plaintext size, computed from the sealed size and the chunk size in the
 *   sealed header (so clients see progress and can tell a cut-off body); `cache-control: private,
 *   no-store` (the link is a secret) and `x-content-type-options: nosniff`.
 *
 * The object is read twice from the object store: once for its first chunk (the sealed header, for
 * the length), then as the stream that is sent, pulled only as fast as the client reads
 * (`Response.stream`: backpressure through uWS). A chunk that fails to verify after the status has
 * left cuts the connection (the client sees fewer bytes than `content-length`), never a wrong byte.
 */
import { Context, Effect, Layer, Option, Stream } from "effect"
import { TAG_BYTES } from "../../core/Aead.ts"
import { isDownloadStore, Links } from "../../core/Links.ts"
import type { Nats } from "../../core/Nats.ts"
import * as ObjectStore from "../../core/ObjectStore.ts"
import { HEADER_BYTES, MAX_CHUNK_SIZE, SealStream } from "../../core/SealStream.ts"
import { Storage } from "../../core/Storage.ts"
import { ApiError } from "../../schema/Errors.ts"
import { authRoute } from "../auth/Route.ts"
import { documented } from "../openapi/OpenApi.ts"
import { stream } from "../Response.ts"

/** The object stores a link may name, opened once. */
export class DownloadStores extends Context.Tag("gateway/downloads/DownloadStores")<
  DownloadStores,
  {
    readonly outputs: ObjectStore.ObjectStore
    readonly files: ObjectStore.ObjectStore
    readonly logs: ObjectStore.ObjectStore
  }
>() {}

/** Opens the storage's `outputs`, `files` and `logs` object stores. */
export const storesLayer: Layer.Layer<DownloadStores, unknown, Nats | Storage> = Layer.effect(
  DownloadStores,
  Effect.gen(function* () {
    const { names } = yield* Storage
    return {
      outputs: yield* ObjectStore.make(names.objects.outputs.name),
      files: yield* ObjectStore.make(names.objects.files.name),
      logs: yield* ObjectStore.make(names.objects.logs.name),
    }
  }),
)

const badLink = ApiError.unauthenticated("the download link is not valid")

/** The content type of a download: by store, then by the filename's extension. */
export const contentTypeOf = (store: string, filename: string): string => {
  const name = filename.toLowerCase()
  if (store === "logs" || name.endsWith(".ndjson") || name.endsWith(".jsonl")) return "application/x-ndjson"
  if (name.endsWith(".tar.gz") || name.endsWith(".tgz") || name.endsWith(".gz")) return "application/gzip"
  return "application/octet-stream"
}

/**
 * `attachment; filename="<ascii>"; filename*=UTF-8''<percent-encoded>`: the ASCII form replaces
 * anything outside printable ASCII, quotes and backslashes with `_`; the second form keeps the name.
 */
export const contentDisposition = (filename: string): string => {
  const ascii = filename.replace(/[^\x20-\x7e]|["\\]/g, "_")
  const encoded = encodeURIComponent(filename).replace(
    /['()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  )
  return `attachment; filename="${ascii}"; filename*=UTF-8''${encoded}`
}

/**
 * The plaintext size of a sealed object of `sealedBytes` bytes with plaintext chunks of
 * `chunkSize`: every chunk carries a tag, all but the last are full (`core/SealStream.ts`).
 */
export const plainSize = (sealedBytes: number, chunkSize: number): number => {
  const body = sealedBytes - HEADER_BYTES
  const chunks = Math.max(1, Math.ceil(body / (chunkSize + TAG_BYTES)))
  return body - chunks * TAG_BYTES
}

// The chunk size in a sealed header (magic 4, version 1, chunk size 4 big-endian, salt).
const chunkSizeOf = (head: Uint8Array): number | undefined => {
  if (head.byteLength < HEADER_BYTES || Buffer.from(head.subarray(0, 4)).toString("latin1") !== "HGSO")
    return undefined
  const size = Buffer.from(head.buffer, head.byteOffset, head.byteLength).readUInt32BE(5)
  return size > 0 && size <= MAX_CHUNK_SIZE ? size : undefined
}

const internal = (what: string) => (e: unknown) =>
  Effect.zipRight(
    Effect.logError(`download ${what} failed`).pipe(
      Effect.annotateLogs({ error: (e as { _tag?: string } | null)?._tag ?? String(e) }),
    ),
    Effect.fail(ApiError.internal()),
  )

/** The route. */
export const routes = [
  documented(
    authRoute({
      method: "GET",
      path: "/v1/downloads/:store/:object",
      access: "anyone",
      handler: ({ params, query }) =>
        Effect.gen(function* () {
          const links = yield* Links
          const stores = yield* DownloadStores
          const seal = yield* SealStream
          const { account, filename, expires, sig } = query
          if (
            !isDownloadStore(params.store) ||
            account === undefined ||
            filename === undefined ||
            sig === undefined ||
            expires === undefined ||
            !/^\d{1,12}$/.test(expires)
          ) {
            return yield* Effect.fail(badLink)
          }
          const fields = {
            store: params.store,
            object: params.object,
            account,
            filename,
            expires: Number(expires),
          }
          const verdict = links.verify(fields, sig)
          if (verdict === "invalid") return yield* Effect.fail(badLink)
          if (verdict === "expired") {
            return yield* Effect.fail(ApiError.unauthenticated("the download link has expired"))
          }
          const store = stores[params.store]
          const found = yield* store.get(fields.object).pipe(Effect.catchAll(internal("read")))
          if (Option.isNone(found)) return yield* Effect.fail(ApiError.notFound("object"))
          const head = yield* Stream.runHead(found.value.data).pipe(Effect.catchAll(internal("read")))
          const chunkSize = Option.isSome(head) ? chunkSizeOf(head.value) : undefined
          if (chunkSize === undefined) {
            return yield* internal("header")({ _tag: "SealedHeaderInvalid" })
          }
          const length = plainSize(found.value.info.size, chunkSize)
          const body = found.value.data.pipe(seal.open(account, fields.object))
          return stream(body, {
            contentType: contentTypeOf(params.store, filename),
            length,
            headers: {
              "content-disposition": contentDisposition(filename),
              "cache-control": "private, no-store",
              "x-content-type-options": "nosniff",
            },
          })
        }),
    }),
    { summary: "Download an object through a signed link (the signature is the credential)." },
  ),
]

/** The group's services, given NATS, the storage map, `Links` and `SealStream`. */
export const layer = storesLayer

/**
 * `POST /v1/files` (member): records a `pending` upload of the announced size and SHA-256 and
 * answers where and how to send it: `PUT` to a signed link served by this gateway, with exactly
 * `content-type: application/octet-stream` and `content-length: <bytes>`; from 1e9 bytes without
 * the content-length: the uWS build serving the link closes the connection on a content-length
 * of ten digits, so such a body goes chunked (what an HTTP client does with a streamed body of no
 * announced length; `fetch` may not be told `transfer-encoding` itself), and the route counts it
 * against the announced bytes all the same.
 */
import { Clock, Effect, Option } from "effect"
import { Uploads } from "../../core/Uploads.ts"
import { timestamp } from "../../schema/Common.ts"
import { ApiError } from "../../schema/Errors.ts"
import type { UploadId } from "../../schema/Ids.ts"
import { UploadRequest, type UploadResponse } from "../../schema/Upload.ts"
import { authRoute } from "../auth/Route.ts"

/** From this size the answered headers hold no content-length (uWS takes nine digits): the body goes chunked. */
export const CHUNKED_FROM_BYTES = 1_000_000_000

import { newId } from "../Idempotency.ts"
import { json } from "../Response.ts"
import { UploadLinks, UploadSettings, uploadPath } from "./Links.ts"

/** The request body is two small fields; 16 KiB is far above any sensible one. */
export const createBodyLimit = 16 * 1024

/** The content type every upload is sent with. */
export const uploadContentType = "application/octet-stream"

// A Host header used in a link must look like a host (and port), nothing that could bend the URL.
const SANE_HOST = /^[A-Za-z0-9.-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$/

/** Store failures are outages: logged, answered 500 without detail. */
export const orInternal = <A, E, R>(
  fx: Effect.Effect<A, E, R>,
  what: string,
): Effect.Effect<A, ApiError, R> =>
  Effect.catchAll(fx, (e) =>
    e instanceof ApiError
      ? Effect.fail(e)
      : Effect.zipRight(Effect.logError(`${what} failed`, e), Effect.fail(ApiError.internal())),
  )

/**
 * The base of the links: the setting, else `http://` and the request's `Host` (what the caller
 * reached, right also when the gateway listens on port 0), else `http://localhost` (an HTTP/1.0
 * request without a usable host; production sets `HANGAR_PUBLIC_URL`).
 */
export const publicBase = (publicUrl: string, host: string | undefined): string => {
  if (publicUrl !== "") return publicUrl.replace(/\/+$/, "")
  if (host !== undefined && SANE_HOST.test(host)) return `http://${host}`
  return "http://localhost"
}

/** The route. */
export const createRoute = authRoute({
  method: "POST",
  path: "/v1/files",
  access: "member",
  body: UploadRequest,
  bodyLimit: createBodyLimit,
  handler: ({ principal, body, headers }) =>
    Effect.gen(function* () {
      const settings = yield* UploadSettings.Tag
      const links = yield* UploadLinks
      const uploads = yield* Uploads
      const now = yield* Clock.currentTimeMillis
      const id = (yield* newId("file")) as UploadId
      const expires = Math.floor(now / 1000) + settings.linkSeconds
      const account = principal.account.id
      yield* orInternal(
        uploads
          .create({
            id,
            account,
            bytes: body.bytes,
            sha256: body.sha256,
            state: "pending",
            created_at: timestamp(now),
            expires_at: timestamp(expires * 1000),
          })
          .pipe(
            // An Idempotency-Key retry whose first answer was lost finds its record: a new link to it.
            Effect.catchTag("StateConflict", (e) =>
              Effect.flatMap(uploads.get(id), (found) =>
                Option.isSome(found) &&
                found.value.value.account === account &&
                found.value.value.bytes === body.bytes &&
                found.value.value.sha256 === body.sha256
                  ? Effect.void
                  : Effect.fail(e),
              ),
            ),
          ),
        "upload record create",
      )
      const sig = links.sign({ id, account, bytes: body.bytes, sha256: body.sha256, expires })
      const base = publicBase(settings.publicUrl, headers.host)
      const answer: UploadResponse = {
        id,
        url: `${base}${uploadPath(id)}?expires=${expires}&sig=${sig}`,
        method: "PUT",
        headers: {
          "content-type": uploadContentType,
          ...(body.bytes < CHUNKED_FROM_BYTES ? { "content-length": String(body.bytes) } : {}),
        },
      }
      yield* Effect.logInfo("upload created").pipe(
        Effect.annotateLogs({ upload: id, account, bytes: body.bytes }),
      )
      return json(answer, { status: 201 })
    }),
})

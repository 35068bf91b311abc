/**
 * Signed upload links. `POST /v1/files` answers `{public base}/v1/uploads/<file_id>?expires=<unix
 * seconds>&sig=<base64url>`, where `sig` is HMAC-SHA256 under the gateway's link key over
 * (`PUT`, upload id, account, bytes, sha256, expires), each part length-prefixed. The `PUT` route
 * recomputes it from the upload record, so a link names one upload of one account with one size and
 * hash: changing the id, the expiry or anything the record holds breaks it. Links last an hour by
 * default (`HANGAR_UPLOAD_LINK_SECONDS`): long enough to start a 5 GB upload on a slow line, short
 * enough that a leaked link soon stops working (it can only ever store the announced file).
 *
 * The link key is the one `core/Links.ts` loads (`LinkSettings`: `HANGAR_UPLOAD_LINK_KEY` or its
 * key file), shared with download links; the labels (`hangar/upload-link`, `hangar/download-link`)
 * keep one kind of signature from ever passing for the other.
 */
import { createHmac, type KeyObject, timingSafeEqual } from "node:crypto"
import { Context, Effect, Layer } from "effect"
import { lengthPrefixed } from "../../core/Aead.ts"
import { defineSettings, env } from "../../core/Config.ts"
import { loadKey } from "../../core/Links.ts"
import { uploadMaxBytes } from "../../schema/Limits.ts"

/**
 * Upload settings. `publicUrl` (`HANGAR_PUBLIC_URL`): the base of the links handed out; empty means
 * `http://` and the request's `Host` header (set it in production: behind a proxy or TLS).
 * `linkSeconds`: link lifetime. `maxBytes`: the most a `PUT` stores, the contract's 5 GB (tests
 * lower it to reach the limit without sending gigabytes). The key is `core/Links.ts`'s `LinkSettings`.
 */
export const UploadSettings = defineSettings(
  "gateway/UploadSettings",
  {
    publicUrl: "",
    linkSeconds: 3600,
    maxBytes: uploadMaxBytes,
  } as {
    readonly publicUrl: string
    readonly linkSeconds: number
    readonly maxBytes: number
  },
  (d) => ({
    publicUrl: env.string("PUBLIC_URL", d.publicUrl),
    linkSeconds: env.integer("UPLOAD_LINK_SECONDS", d.linkSeconds),
    maxBytes: env.integer("UPLOAD_MAX_BYTES", d.maxBytes),
  }),
)

/** What a link signs. */
export interface LinkFields {
  readonly id: string
  readonly account: string
  readonly bytes: number
  readonly sha256: string
  /** Unix seconds after which the link is refused. */
  readonly expires: number
}

/** The link signer. */
export interface UploadLinksService {
  /** The `sig` of a link for `fields`. */
  readonly sign: (fields: LinkFields) => string
  /** Whether `sig` is the signature of `fields` (constant-time). */
  readonly verify: (fields: LinkFields, sig: string) => boolean
}

/** The link signer as a service. */
export class UploadLinks extends Context.Tag("gateway/UploadLinks")<UploadLinks, UploadLinksService>() {}

/** The path of an upload's `PUT` route. */
export const uploadPath = (id: string): string => `/v1/uploads/${encodeURIComponent(id)}`

/** A signer over a key in hand (tests sign crafted links with it). */
export const fromKey = (key: KeyObject): UploadLinksService => {
  const sign = (f: LinkFields) =>
    createHmac("sha256", key)
      .update(
        lengthPrefixed(
          "hangar/upload-link",
          "PUT",
          f.id,
          f.account,
          String(f.bytes),
          f.sha256,
          String(f.expires),
        ),
      )
      .digest("base64url")
  return {
    sign,
    verify: (fields, sig) => {
      const want = Buffer.from(sign(fields))
      const got = Buffer.from(sig)
      return want.byteLength === got.byteLength && timingSafeEqual(want, got)
    },
  }
}

/** Builds the signer over the shared link key (`core/Links.ts` `LinkSettings`). */
export const make = Effect.map(loadKey, fromKey)

/** The signer as a layer; fails (the gateway refuses to start) when the key is unusable. */
export const layer = Layer.effect(UploadLinks, make)

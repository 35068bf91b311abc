/**
 * Signed, expiring links, and the one key that signs them.
 *
 * Download links: `{public base}/v1/downloads/<store>/<object>?account=…&filename=…&expires=<unix
 * seconds>&sig=<base64url>` for an object of the `outputs`, `files` or `logs` store. `sig` is
 * HMAC-SHA256 under the link key over (`hangar/download-link`, `GET`, store, object, account,
 * filename, expires), each part length-prefixed, so changing any one of them (another object,
 * another account's key to open it with, a longer life, even the name the browser saves it under)
 * breaks the link. The label keeps a download signature from ever being a valid upload signature
 * (`gateway/uploads/Links.ts` signs under `hangar/upload-link`) and vice versa. The gateway serves
 * them (`gateway/downloads/`): the signature is the whole credential, so a link can be handed to a
 * browser, `curl` or a webhook receiver. They last `linkValidMs` (15 minutes) unless asked
 * otherwise; whoever hands one out signs a fresh one on every read.
 *
 * The key is 32 bytes shared by every process that signs or checks links (gateways, the actors
 * role, host agents): `HANGAR_UPLOAD_LINK_KEY` (base64) when set, else a file
 * (`HANGAR_UPLOAD_LINK_KEY_FILE`, default `.data/upload-link.key`) created once, mode 0600,
 * atomically, exactly like the master key file. The names keep "upload" because deployments already
 * set them; the key now signs both kinds of link.
 *
 * The base is `HANGAR_PUBLIC_URL`; when empty, `http://` and `HANGAR_HTTP_ADDR` (an unspecified
 * listen address such as `0.0.0.0` becomes `127.0.0.1`), which is right for one machine. A gateway
 * answering a request may pass its own `base` (the request's `Host`), as upload links do.
 */
import { createHmac, createSecretKey, type KeyObject, timingSafeEqual } from "node:crypto"
import { join } from "node:path"
import { Context, Effect, Layer, Redacted } from "effect"
import { linkValidMs } from "../schema/Limits.ts"
import { lengthPrefixed } from "./Aead.ts"
import { defineSettings, env } from "./Config.ts"
import { dataDir } from "./DataDir.ts"
import { loadFile, MasterKeyInvalid, type MasterKeyUnavailable } from "./MasterKey.ts"

/**
 * Link settings. `publicUrl` (`HANGAR_PUBLIC_URL`) and `httpAddr` (`HANGAR_HTTP_ADDR`): the base,
 * see above. `validMs`: default life of a download link. `keyFile` / `key`: the link key.
 */
export const LinkSettings = defineSettings(
  "hangar/LinkSettings",
  {
    publicUrl: "",
    httpAddr: "127.0.0.1:8080",
    validMs: linkValidMs,
    keyFile: join(dataDir, "upload-link.key"),
    key: Redacted.make(""),
  } as {
    readonly publicUrl: string
    readonly httpAddr: string
    readonly validMs: number
    readonly keyFile: string
    readonly key: Redacted.Redacted<string>
  },
  (d) => ({
    publicUrl: env.string("PUBLIC_URL", d.publicUrl),
    httpAddr: env.string("HTTP_ADDR", d.httpAddr),
    validMs: env.integer("DOWNLOAD_LINK_MS", d.validMs),
    keyFile: env.string("UPLOAD_LINK_KEY_FILE", d.keyFile),
    key: env.redacted("UPLOAD_LINK_KEY", ""),
  }),
)

/** The stores a download link may name. */
export const downloadStores = ["outputs", "files", "logs"] as const
export type DownloadStore = (typeof downloadStores)[number]
export const isDownloadStore = (s: string): s is DownloadStore =>
  (downloadStores as ReadonlyArray<string>).includes(s)

/** What a download link signs. */
export interface DownloadFields {
  readonly store: DownloadStore
  /** The object's name in the store (also the sealed object's id). */
  readonly object: string
  /** The account whose data key opens the object. */
  readonly account: string
  /** The name offered in `content-disposition`; its extension chooses the content type. */
  readonly filename: string
  /** Unix seconds after which the link is refused. */
  readonly expires: number
}

/** What `download` is asked for. */
export interface DownloadRequest {
  readonly store: DownloadStore
  readonly object: string
  readonly account: string
  readonly filename: string
  /** Life of the link; default the settings' `validMs` (15 minutes). */
  readonly validMs?: number
  /** Base URL to use instead of the configured one (a gateway answering a request). */
  readonly base?: string
}

/** The outcome of checking a link. */
export type Verdict = "valid" | "expired" | "invalid"

/** The link signer. */
export interface LinksService {
  /** The base links are made with (no trailing slash). */
  readonly base: string
  /** A fresh signed download link. */
  readonly download: (request: DownloadRequest) => string
  /** The `sig` of `fields` (tests craft links with it). */
  readonly sign: (fields: DownloadFields) => string
  /** Checks `sig` (constant-time) and then the expiry against `nowMs` (default: now). */
  readonly verify: (fields: DownloadFields, sig: string, nowMs?: number) => Verdict
}

/** The link signer as a service. */
export class Links extends Context.Tag("hangar/Links")<Links, LinksService>() {}

/** The path of a download link (without the query). */
export const downloadPath = (store: DownloadStore, object: string): string =>
  `/v1/downloads/${store}/${encodeURIComponent(object)}`

/** The base from the settings: the public URL, else `http://` and the listen address. */
export const baseOf = (settings: { readonly publicUrl: string; readonly httpAddr: string }): string => {
  if (settings.publicUrl !== "") return settings.publicUrl.replace(/\/+$/, "")
  const addr = settings.httpAddr
    .replace(/^0\.0\.0\.0:/, "127.0.0.1:")
    .replace(/^\[::\]:/, "[::1]:")
    .replace(/^:/, "127.0.0.1:")
  return `http://${addr}`
}

/** A signer over a key in hand. */
export const fromKey = (
  key: KeyObject,
  options: { readonly base: string; readonly validMs?: number },
): LinksService => {
  const validMs = options.validMs ?? linkValidMs
  const sign = (f: DownloadFields) =>
    createHmac("sha256", key)
      .update(
        lengthPrefixed(
          "hangar/download-link",
          "GET",
          f.store,
          f.object,
          f.account,
          f.filename,
          String(f.expires),
        ),
      )
      .digest("base64url")
  const base = options.base.replace(/\/+$/, "")
  return {
    base,
    sign,
    download: (r) => {
      const expires = Math.ceil((Date.now() + (r.validMs ?? validMs)) / 1000)
      const fields: DownloadFields = {
        store: r.store,
        object: r.object,
        account: r.account,
        filename: r.filename,
        expires,
      }
      const query = new URLSearchParams({
        account: r.account,
        filename: r.filename,
        expires: String(expires),
        sig: sign(fields),
      })
      return `${(r.base ?? base).replace(/\/+$/, "")}${downloadPath(r.store, r.object)}?${query}`
    },
    verify: (fields, sig, nowMs = Date.now()) => {
      const want = Buffer.from(sign(fields))
      const got = Buffer.from(sig)
      if (want.byteLength !== got.byteLength || !timingSafeEqual(want, got)) return "invalid"
      return fields.expires * 1000 < nowMs ? "expired" : "valid"
    },
  }
}

/** The link key from the settings: the env key first, else the key file (created once). */
export const loadKey: Effect.Effect<
  KeyObject,
  MasterKeyInvalid | MasterKeyUnavailable,
  Context.Tag.Identifier<typeof LinkSettings.Tag>
> = Effect.gen(function* () {
  const settings = yield* LinkSettings.Tag
  const fromEnv = Redacted.value(settings.key)
  if (fromEnv.length === 0) return yield* loadFile(settings.keyFile)
  const bytes = Buffer.from(fromEnv, "base64")
  if (bytes.byteLength !== 32) {
    return yield* new MasterKeyInvalid({
      source: "HANGAR_UPLOAD_LINK_KEY",
      reason: `expected 32 bytes, found ${bytes.byteLength}`,
    })
  }
  const key = createSecretKey(bytes)
  bytes.fill(0)
  return key
})

/** Builds the signer from the settings. */
export const make = Effect.gen(function* () {
  const settings = yield* LinkSettings.Tag
  const key = yield* loadKey
  return fromKey(key, { base: baseOf(settings), validMs: settings.validMs })
})

/** The signer as a layer; fails (the process refuses to start) when the key is unusable. */
export const layer = Layer.effect(Links, make)

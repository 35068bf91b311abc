/**
 * Standard Webhooks signatures, asymmetric flavour (`v1a`, Ed25519): the signed content is
 * `{webhook-id}.{webhook-timestamp}.{body}` exactly as sent, and the headers are
 *
 *   webhook-id         the event id (the same on every attempt: receivers dedupe by it)
 *   webhook-timestamp  the attempt's time in unix seconds (fresh on every attempt: replay window)
 *   webhook-signature  `v1a,<base64 of the 64-byte Ed25519 signature>`
 *
 * Receivers verify with the account's `whpk_<base64 raw public key>` (`GET /v1/webhooks/public-key`)
 * and should refuse a timestamp more than 5 minutes away from their clock (`webhookToleranceMs`).
 */
import { type KeyObject, sign } from "node:crypto"

/** The headers of one attempt. */
export interface SignedHeaders {
  readonly "webhook-id": string
  readonly "webhook-timestamp": string
  readonly "webhook-signature": string
}

/** The content a `v1a` signature covers. */
export const signedContent = (id: string, timestampSeconds: number, body: string): Buffer =>
  Buffer.from(`${id}.${timestampSeconds}.${body}`, "utf8")

/**
 * The Standard Webhooks headers for `body` sent as event `id` at `timestampSeconds`, signed with
 * the Ed25519 private key `key`. The id must not contain `.` (ours are `evt_…`).
 */
export const signHeaders = (
  key: KeyObject,
  id: string,
  timestampSeconds: number,
  body: string,
): SignedHeaders => {
  if (id.includes(".")) throw new Error("a webhook id must not contain '.'")
  if (!Number.isSafeInteger(timestampSeconds)) throw new Error("a webhook timestamp is whole seconds")
  const signature = sign(null, signedContent(id, timestampSeconds, body), key)
  return {
    "webhook-id": id,
    "webhook-timestamp": String(timestampSeconds),
    "webhook-signature": `v1a,${signature.toString("base64")}`,
  }
}

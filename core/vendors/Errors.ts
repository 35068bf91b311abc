/**
 * Why a call to a model vendor failed. Each error carries the vendor's own words where it gave
 * some, scrubbed of the key (see `scrubKey`), and never the key itself. They are
 * `Schema.TaggedError`s because an actor (the agent loop, the provider actor) may answer an ask
 * with them across the bus.
 *
 * How the gateway maps them (`toApiError`): a rejected key is `400 invalid_request` naming `key`,
 * a model missing from the catalog is `400 invalid_request` naming `model.model`, and an
 * unavailable vendor is `502 vendor_unavailable`.
 */
import { Schema } from "effect"
import { ApiError } from "../../schema/Errors.ts"
import { Vendor } from "../../schema/Provider.ts"

/** The vendor refused the key (401/403, or Google's 400 `API_KEY_INVALID`); retrying will not help. */
export class VendorRejectedKey extends Schema.TaggedError<VendorRejectedKey>()("VendorRejectedKey", {
  vendor: Vendor,
  status: Schema.Number,
  message: Schema.String,
}) {}

/**
 * The vendor could not answer usefully: 5xx, 429 or 529 (overloaded), another unexpected status,
 * a network failure, no answer within the timeout, or a body we could not decode. Retryable;
 * `status` is 0 when no HTTP answer came.
 */
export class VendorUnavailable extends Schema.TaggedError<VendorUnavailable>()("VendorUnavailable", {
  vendor: Vendor,
  status: Schema.Number,
  message: Schema.String,
  /** How long the vendor asked to wait before trying again (`Retry-After`, `retry-after-ms`, Google's `RetryInfo`). */
  retryAfterMs: Schema.optional(Schema.Number),
}) {}

/** The key works but the vendor's catalog for it has no model with this id. */
export class UnknownModel extends Schema.TaggedError<UnknownModel>()("UnknownModel", {
  vendor: Vendor,
  model: Schema.String,
  message: Schema.String,
}) {}

/** Any failure of the vendor layer. */
export type VendorError = VendorRejectedKey | VendorUnavailable | UnknownModel

/** The vendors' names for people. */
export const vendorLabel: Readonly<Record<Vendor, string>> = {
  openai: "OpenAI",
  anthropic: "Anthropic",
  google: "Google",
}

/** The API error a vendor failure leaves the gateway as. */
export const toApiError = (error: VendorError): ApiError => {
  const label = vendorLabel[error.vendor]
  switch (error._tag) {
    case "VendorRejectedKey":
      return ApiError.invalidRequest(`key: ${label} refused the key: ${error.message}`)
    case "UnknownModel":
      return ApiError.invalidRequest(`model.model: ${error.message}`)
    case "VendorUnavailable":
      return ApiError.vendorUnavailable(`${label} could not be reached: ${error.message}`)
  }
}

/** Longest vendor message kept; vendors' messages are a sentence or two. */
const messageMaxChars = 500

/**
 * A vendor's message made safe to keep: the key removed wherever it appears, and any word that
 * looks like a masked copy of it removed too. OpenAI echoes a masked key in its 401 message
 * ("Incorrect API key provided: sk-abc1*****wxyz"), whose visible head and tail are still parts of
 * the secret, so a word holding a run of `*` or the key's first 6 or last 4 characters goes.
 */
export const scrubKey = (message: string, key: string): string => {
  let text = key.length > 0 ? message.split(key).join("<key>") : message
  const head = key.length >= 12 ? key.slice(0, 6) : undefined
  const tail = key.length >= 12 ? key.slice(-4) : undefined
  text = text
    .split(/(\s+)/)
    .map((word) =>
      /\*{3,}/.test(word) ||
      (head !== undefined && word.includes(head)) ||
      (tail !== undefined && word.includes(tail))
        ? "<key>"
        : word,
    )
    .join("")
  return text.length > messageMaxChars ? `${text.slice(0, messageMaxChars)}…` : text
}

/**
 * Providers: a model choice plus the caller's own vendor key (spec "Model", "Provider",
 * `/v1/providers`, `/v1/catalog`). The key is checked against the vendor's catalog on publish and
 * never returned, so no response schema here has a `key`.
 */
import { Schema } from "effect"
import { Count, Enum, ExternalReference, IntAtLeast, maxBytes, NonEmptyString, Timestamp } from "./Common.ts"
import { Actor, ProviderId, ProviderName } from "./Ids.ts"
import { compactAtTokensMin, compactAtTokensMinAnthropic, vendorKeyMaxBytes } from "./Limits.ts"

/** The smallest `max_output_tokens` OpenAI's Responses API takes. */
export const openAiMaxOutputTokensMin = 16

/** The model vendors, in the spec's listing order (DESIGN.md). */
export const Vendor = Enum("openai", "anthropic", "google").annotations({ identifier: "Vendor" })
export type Vendor = typeof Vendor.Type

/**
 * A model choice as sent. `compact_at_tokens` is at least 8000, and at least 50000 for
 * `anthropic`; `reasoning_effort` `""` and `max_output_tokens` 0 mean the model's defaults.
 * Whether the model and effort exist is checked against the vendor's catalog, not here.
 */
export const ModelInput = Schema.Struct({
  provider: Vendor,
  model: NonEmptyString,
  reasoning_effort: Schema.optionalWith(Schema.String, { default: () => "" }),
  compact_at_tokens: IntAtLeast(compactAtTokensMin),
  max_output_tokens: Schema.optionalWith(IntAtLeast(0), { default: () => 0 }),
})
  .pipe(
    Schema.filter((m) =>
      m.provider === "anthropic" && m.compact_at_tokens < compactAtTokensMinAnthropic
        ? {
            path: ["compact_at_tokens"],
            message: `must be at least ${compactAtTokensMinAnthropic} for anthropic`,
          }
        : // OpenAI refuses a `max_output_tokens` under 16 on every call; refused here, not per run.
          m.provider === "openai" && m.max_output_tokens > 0 && m.max_output_tokens < openAiMaxOutputTokensMin
          ? {
              path: ["max_output_tokens"],
              message: `must be 0 (the model's default) or at least ${openAiMaxOutputTokensMin} for openai`,
            }
          : true,
    ),
  )
  .annotations({ identifier: "ModelInput" })
export type ModelInput = typeof ModelInput.Type

/** A model choice as stored and returned (every field present). */
export const Model = Schema.Struct({
  provider: Vendor,
  model: Schema.String,
  reasoning_effort: Schema.String,
  compact_at_tokens: Schema.Number,
  max_output_tokens: Schema.Number,
}).annotations({ identifier: "Model" })
export type Model = typeof Model.Type

/** A vendor API key: used, never returned or logged. */
const VendorKey = NonEmptyString.pipe(maxBytes(vendorKeyMaxBytes))

/** A provider version. A new key or setting makes a new version. */
export const Provider = Schema.Struct({
  id: ProviderId,
  version: IntAtLeast(1),
  name: Schema.String,
  model: Model,
  external_reference: Schema.optional(Schema.String),
  created_at: Timestamp,
  created_by: Actor,
}).annotations({ identifier: "Provider" })
export type Provider = typeof Provider.Type

/** `POST /v1/providers`. */
export const CreateProviderRequest = Schema.Struct({
  name: ProviderName,
  model: ModelInput,
  key: VendorKey,
  external_reference: Schema.optional(ExternalReference),
}).annotations({ identifier: "CreateProviderRequest" })
export type CreateProviderRequest = typeof CreateProviderRequest.Type

/** `POST /v1/providers/{id}/versions`. */
export const ProviderVersionRequest = Schema.Struct({
  model: ModelInput,
  key: VendorKey,
  external_reference: Schema.optional(ExternalReference),
}).annotations({ identifier: "ProviderVersionRequest" })
export type ProviderVersionRequest = typeof ProviderVersionRequest.Type

/** `GET /v1/providers`: each provider with its versions, newest first. */
export const ProviderList = Schema.Struct({
  providers: Schema.Array(
    Schema.Struct({
      id: ProviderId,
      name: Schema.String,
      latest: IntAtLeast(1),
      versions: Schema.Array(Provider),
    }),
  ),
}).annotations({ identifier: "ProviderList" })
export type ProviderList = typeof ProviderList.Type

/** `POST /v1/catalog`: the key is used once and kept nowhere. */
export const CatalogRequest = Schema.Struct({ provider: Vendor, key: VendorKey }).annotations({
  identifier: "CatalogRequest",
})
export type CatalogRequest = typeof CatalogRequest.Type

/** A model of a vendor's catalog. */
export const CatalogModel = Schema.Struct({
  id: Schema.String,
  name: Schema.String,
  context_window: Count,
  max_output_tokens: Count,
  efforts: Schema.Array(Schema.String),
  default_effort: Schema.String,
}).annotations({ identifier: "CatalogModel" })
export type CatalogModel = typeof CatalogModel.Type

/** The answer of `POST /v1/catalog`. */
export const CatalogResponse = Schema.Struct({ models: Schema.Array(CatalogModel) }).annotations({
  identifier: "CatalogResponse",
})
export type CatalogResponse = typeof CatalogResponse.Type

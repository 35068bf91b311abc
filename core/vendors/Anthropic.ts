/**
 * Anthropic over plain HTTP. Auth is `x-api-key: <key>` with `anthropic-version: 2023-06-01`;
 * errors come as `{type: "error", error: {type, message}}`: 401 `authentication_error` for a wrong
 * key, 403 `permission_error`, 429 `rate_limit_error`, 500 `api_error`, 529 `overloaded_error`.
 *
 * `GET /v1/models?limit&after_id` answers `{data: [{id, display_name, created_at, type: "model"}],
 * has_more, first_id, last_id}`, newest first; pass `last_id` as `after_id` for the next page.
 * Limits and efforts come from `Catalog.anthropicFacts`.
 */
import { type HttpClient, HttpClientRequest } from "@effect/platform"
import { Effect, Redacted, Schema } from "effect"
import type { CatalogModel } from "../../schema/Provider.ts"
import { anthropicFacts, entryOf, familyOf, unknownChatModel } from "./Catalog.ts"
import { type VendorRejectedKey, VendorUnavailable } from "./Errors.ts"
import { type Dialect, type Endpoint, errorMessageOf, maxPages, sendJson, urlOf } from "./Http.ts"

/** The API version every request names. */
export const apiVersion = "2023-06-01"

/** The page size we ask for (the API's maximum). */
const pageLimit = 1000

/** How Anthropic reports errors. */
export const dialect: Dialect = {
  vendor: "anthropic",
  rejectsKey: (status) => status === 401 || status === 403,
  messageOf: errorMessageOf,
}

/** The fields of a `GET /v1/models` page we use. */
export const ModelPage = Schema.Struct({
  data: Schema.Array(Schema.Struct({ id: Schema.String, display_name: Schema.optional(Schema.String) })),
  has_more: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  last_id: Schema.optional(Schema.NullOr(Schema.String)),
})

/** A request to `path` with the key and version headers, ready for a body. */
export const request = (endpoint: Endpoint, method: "GET" | "POST", path: string) =>
  HttpClientRequest.make(method)(urlOf(endpoint.baseUrl, path)).pipe(
    HttpClientRequest.setHeader("anthropic-version", apiVersion),
    // The key is opened only here, into the header the request sends.
    HttpClientRequest.setHeader("x-api-key", Redacted.value(endpoint.key)),
    HttpClientRequest.acceptJson,
  )

/** Every model the key may use, in the vendor's order (newest first), following `has_more`. */
export const listModels = (
  http: HttpClient.HttpClient,
  endpoint: Endpoint,
): Effect.Effect<ReadonlyArray<CatalogModel>, VendorRejectedKey | VendorUnavailable> =>
  Effect.gen(function* () {
    const seen = new Map<string, CatalogModel>()
    let after: string | undefined
    for (let page = 0; page < maxPages; page++) {
      const params: Record<string, string> = { limit: String(pageLimit) }
      if (after !== undefined) params.after_id = after
      const req = request(endpoint, "GET", "/v1/models").pipe(HttpClientRequest.setUrlParams(params))
      const body = yield* sendJson(http, dialect, endpoint, req, ModelPage)
      for (const m of body.data) {
        if (seen.has(m.id)) continue
        const facts = familyOf(anthropicFacts, m.id)
        const name = m.display_name ?? facts?.name ?? m.id
        seen.set(m.id, entryOf(m.id, name, facts ?? unknownChatModel.anthropic))
      }
      if (!body.has_more || body.last_id == null || body.last_id === after) return [...seen.values()]
      after = body.last_id
    }
    return yield* new VendorUnavailable({
      vendor: "anthropic",
      status: 200,
      message: `the model list did not end within ${maxPages} pages`,
    })
  })

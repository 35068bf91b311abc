/**
 * OpenAI over plain HTTP. Auth is `Authorization: Bearer <key>`; errors come as
 * `{error: {message, type, param, code}}` with 401 for a wrong key (its message echoes a masked
 * key, which `scrubKey` removes), 403 for a key that may not be used from here, 429 for rate or
 * quota limits and 5xx for outages.
 *
 * `GET /v1/models` answers `{object: "list", data: [{id, object: "model", created, owned_by}]}`
 * in one page, with no limits or efforts: those come from `Catalog.openAiFacts`.
 */
import { type HttpClient, HttpClientRequest } from "@effect/platform"
import { Effect, Schema } from "effect"
import type { CatalogModel } from "../../schema/Provider.ts"
import { entryOf, familyOf, isOpenAiChatModel, openAiFacts, unknownChatModel } from "./Catalog.ts"
import type { VendorRejectedKey, VendorUnavailable } from "./Errors.ts"
import { type Dialect, type Endpoint, errorMessageOf, sendJson, urlOf } from "./Http.ts"

/** How OpenAI reports errors. */
export const dialect: Dialect = {
  vendor: "openai",
  rejectsKey: (status) => status === 401 || status === 403,
  messageOf: errorMessageOf,
}

/** The fields of `GET /v1/models` we use. */
export const ModelList = Schema.Struct({
  data: Schema.Array(Schema.Struct({ id: Schema.String })),
})

/** A request to `path` with the key, ready for a body. */
export const request = (endpoint: Endpoint, method: "GET" | "POST", path: string) =>
  HttpClientRequest.make(method)(urlOf(endpoint.baseUrl, path)).pipe(
    HttpClientRequest.bearerToken(endpoint.key),
    HttpClientRequest.acceptJson,
  )

/** The chat models the key may use, sorted by id, with limits and efforts from the facts table. */
export const listModels = (
  http: HttpClient.HttpClient,
  endpoint: Endpoint,
): Effect.Effect<ReadonlyArray<CatalogModel>, VendorRejectedKey | VendorUnavailable> =>
  sendJson(http, dialect, endpoint, request(endpoint, "GET", "/v1/models"), ModelList).pipe(
    Effect.map((list) => {
      const ids = [...new Set(list.data.map((m) => m.id))].filter(isOpenAiChatModel).sort()
      return ids.map((id) => {
        const facts = familyOf(openAiFacts, id)
        return facts ? entryOf(id, facts.name, facts) : entryOf(id, id, unknownChatModel.openai)
      })
    }),
  )

/**
 * Google's Gemini API over plain HTTP. The key goes in the `x-goog-api-key` header rather than
 * `?key=`, so it never appears in a URL (URLs end up in logs, traces and proxies). Errors come as
 * `{error: {code, message, status, details}}`; a wrong key is a 400 `INVALID_ARGUMENT` whose
 * details hold a `google.rpc.ErrorInfo` with reason `API_KEY_INVALID`, and a key that may not use
 * the API is a 403 `PERMISSION_DENIED`.
 *
 * `GET /v1beta/models?pageSize&pageToken` answers `{models: [{name: "models/…", displayName,
 * inputTokenLimit, outputTokenLimit, supportedGenerationMethods, thinking?}], nextPageToken?}`;
 * we keep models that support `generateContent` and answer with text.
 */
import { type HttpClient, HttpClientRequest } from "@effect/platform"
import { Effect, Redacted, Schema } from "effect"
import type { CatalogModel } from "../../schema/Provider.ts"
import {
  entryOf,
  familyOf,
  googleEffortFacts,
  googleThinkingDefault,
  isGoogleChatModel,
  unknownChatModel,
} from "./Catalog.ts"
import { type VendorRejectedKey, VendorUnavailable } from "./Errors.ts"
import { type Dialect, type Endpoint, errorMessageOf, maxPages, sendJson, urlOf } from "./Http.ts"

/** The page size we ask for (the API's maximum). */
const pageSize = 1000

/** Reasons in a Google error's `ErrorInfo` that mean the key itself is refused. */
const keyReasons = new Set(["API_KEY_INVALID", "API_KEY_EXPIRED", "API_KEY_SERVICE_BLOCKED"])

const reasonsOf = (body: unknown): ReadonlyArray<string> => {
  const error = typeof body === "object" && body !== null ? (body as { error?: unknown }).error : undefined
  const details = typeof error === "object" && error !== null ? (error as { details?: unknown }).details : []
  if (!Array.isArray(details)) return []
  return details.flatMap((d) =>
    typeof d === "object" && d !== null && typeof (d as { reason?: unknown }).reason === "string"
      ? [(d as { reason: string }).reason]
      : [],
  )
}

/** How Google reports errors. */
export const dialect: Dialect = {
  vendor: "google",
  rejectsKey: (status, body) =>
    status === 401 || status === 403 || reasonsOf(body).some((reason) => keyReasons.has(reason)),
  messageOf: errorMessageOf,
}

/** The fields of a `GET /v1beta/models` page we use. */
export const ModelPage = Schema.Struct({
  models: Schema.optionalWith(
    Schema.Array(
      Schema.Struct({
        name: Schema.String,
        displayName: Schema.optional(Schema.String),
        inputTokenLimit: Schema.optional(Schema.Number),
        outputTokenLimit: Schema.optional(Schema.Number),
        supportedGenerationMethods: Schema.optionalWith(Schema.Array(Schema.String), { default: () => [] }),
        thinking: Schema.optionalWith(Schema.Boolean, { default: () => false }),
      }),
    ),
    { default: () => [] },
  ),
  nextPageToken: Schema.optional(Schema.String),
})
type GoogleModel = (typeof ModelPage.Type)["models"][number]

/** A request to `path` with the key header, ready for a body. */
export const request = (endpoint: Endpoint, method: "GET" | "POST", path: string) =>
  HttpClientRequest.make(method)(urlOf(endpoint.baseUrl, path)).pipe(
    HttpClientRequest.setHeader("x-goog-api-key", Redacted.value(endpoint.key)),
    HttpClientRequest.acceptJson,
  )

const positive = (n: number | undefined, fallback: number) =>
  n !== undefined && Number.isSafeInteger(n) && n > 0 ? n : fallback

const entry = (m: GoogleModel, id: string): CatalogModel => {
  const fallback = unknownChatModel.google
  const efforts = m.thinking
    ? (familyOf(googleEffortFacts, id, ["-", "."]) ?? googleThinkingDefault)
    : fallback
  return entryOf(id, m.displayName ?? id, {
    contextWindow: positive(m.inputTokenLimit, fallback.contextWindow),
    maxOutputTokens: positive(m.outputTokenLimit, fallback.maxOutputTokens),
    efforts: efforts.efforts,
    defaultEffort: efforts.defaultEffort,
  })
}

/** Every text model the key may use with `generateContent`, in the vendor's order, following `nextPageToken`. */
export const listModels = (
  http: HttpClient.HttpClient,
  endpoint: Endpoint,
): Effect.Effect<ReadonlyArray<CatalogModel>, VendorRejectedKey | VendorUnavailable> =>
  Effect.gen(function* () {
    const seen = new Map<string, CatalogModel>()
    let token: string | undefined
    for (let page = 0; page < maxPages; page++) {
      const params: Record<string, string> = { pageSize: String(pageSize) }
      if (token !== undefined) params.pageToken = token
      const req = request(endpoint, "GET", "/v1beta/models").pipe(HttpClientRequest.setUrlParams(params))
      const body = yield* sendJson(http, dialect, endpoint, req, ModelPage)
      for (const m of body.models) {
        const id = m.name.replace(/^models\//, "")
        if (seen.has(id) || !m.supportedGenerationMethods.includes("generateContent")) continue
        if (!isGoogleChatModel(id)) continue
        seen.set(id, entry(m, id))
      }
      if (body.nextPageToken === undefined || body.nextPageToken === "" || body.nextPageToken === token) {
        return [...seen.values()]
      }
      token = body.nextPageToken
    }
    return yield* new VendorUnavailable({
      vendor: "google",
      status: 200,
      message: `the model list did not end within ${maxPages} pages`,
    })
  })

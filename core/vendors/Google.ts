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
 *
 * A model turn is `POST /v1beta/models/{model}:streamGenerateContent?alt=sse`, streamed (a long
 * answer keeps chunks coming; `assembler` joins them into the non-streamed answer's shape):
 * `systemInstruction`,
 * `contents` (role `user`/`model`; `text`, `inlineData` PNG, `functionCall`, `functionResponse`
 * parts; same-role neighbours merged; a function response's images inside its `parts` on Gemini 3,
 * beside it before), `tools: [{functionDeclarations}, {googleSearch: {}}]` (search beside functions
 * only on Gemini 3, with `toolConfig.includeServerSideToolInvocations`; see `isGemini3`) (the
 * declarations take the tool's JSON Schema as `parametersJsonSchema`, which accepts full JSON Schema
 * where `parameters` takes only an OpenAPI subset), `generationConfig.maxOutputTokens` when >0 and
 * `generationConfig.thinkingConfig` for an effort: `thinkingLevel` for Gemini 3 (`low`/`high`), a
 * `thinkingBudget` for the others (`googleThinkingBudget`).
 *
 * Gemini gives function calls no ids (only some surfaces do): the client makes up one per call,
 * unique across the conversation, and a tool result goes back as a `functionResponse` named after
 * its tool, in the order of the calls (`{name, response: {output}}`, or `{error}` when it failed;
 * an id Gemini did give is echoed). A result's images follow as `inlineData` parts of the same user
 * turn. The model's parts are kept whole in the assistant item's `vendor.data.parts` and sent back
 * verbatim, so their `thoughtSignature`s return with them as Gemini requires.
 *
 * Answer: `candidates[0].content.parts`, `finishReason` (`MAX_TOKENS` → out of tokens; a block for
 * safety and the like with nothing said, or `promptFeedback.blockReason`, → `ChatRefused`;
 * `MALFORMED_FUNCTION_CALL` → unavailable, a retry usually works), `groundingMetadata.
 * webSearchQueries` (one search each), `usageMetadata` (`promptTokenCount` including
 * `cachedContentTokenCount`, `candidatesTokenCount` + `thoughtsTokenCount` as output).
 *
 * Errors for a turn: 401/403 and a 400 whose `ErrorInfo` says `API_KEY_INVALID` refuse the key;
 * other 400s (`INVALID_ARGUMENT`, `FAILED_PRECONDITION`) and 404/413/422 refuse the request;
 * 429 `RESOURCE_EXHAUSTED` for a rate limit (its `RetryInfo.retryDelay` is the wait), 5xx and 503
 * `UNAVAILABLE` are unavailable; a 429 for a per-day quota (`QuotaFailure`) is refused for good.
 */
import { randomUUID } from "node:crypto"
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
import {
  type ChatError,
  ChatRefused,
  type ChatReply,
  type ChatRequest,
  type Part,
  type ToolCall,
} from "./Chat.ts"
import { type VendorRejectedKey, VendorUnavailable } from "./Errors.ts"
import {
  type Assembler,
  compactionText,
  count,
  type Dialect,
  type Endpoint,
  errorMessageOf,
  liveItems,
  maxPages,
  refusedStatuses,
  sendChat,
  sendJson,
  type TurnOptions,
  textOf,
  urlOf,
  vendorData,
} from "./Http.ts"

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

// The `details` of a Google error of one `@type` (`type.googleapis.com/google.rpc.<name>`).
const detailsOf = (body: unknown, name: string): ReadonlyArray<Record<string, unknown>> => {
  const error = typeof body === "object" && body !== null ? (body as { error?: unknown }).error : undefined
  const details = typeof error === "object" && error !== null ? (error as { details?: unknown }).details : []
  if (!Array.isArray(details)) return []
  return details.filter(
    (d): d is Record<string, unknown> =>
      typeof d === "object" &&
      d !== null &&
      String((d as Record<string, unknown>)["@type"]).endsWith(`.rpc.${name}`),
  )
}

/** Google's `RetryInfo.retryDelay` (a `google.protobuf.Duration` in JSON: `"37s"`, `"0.5s"`) in ms. */
export const retryDelayOf = (body: unknown): number | undefined => {
  for (const d of detailsOf(body, "RetryInfo")) {
    const m = /^(\d+(?:\.\d+)?)s$/.exec(String(d.retryDelay))
    if (m !== null) return Number(m[1]) * 1000
  }
  return undefined
}

/**
 * Whether a 429 `RESOURCE_EXHAUSTED` is a quota spent for the day (or the plan), which waiting
 * within a run will not bring back, rather than a short rate limit: a `QuotaFailure` violation of
 * a per-day quota (`quotaId` `…PerDay…`), or the quota message with no `RetryInfo` to wait for.
 */
export const quotaExhausted = (status: number, body: unknown): boolean => {
  if (status !== 429) return false
  const quotaIds = detailsOf(body, "QuotaFailure").flatMap((d) =>
    Array.isArray(d.violations)
      ? d.violations.map((v) => String((v as Record<string, unknown>)?.quotaId ?? ""))
      : [],
  )
  if (quotaIds.some((id) => /PerDay/i.test(id))) return true
  return retryDelayOf(body) === undefined && /exceeded your current quota/i.test(errorMessageOf(body) ?? "")
}

/** How Google reports errors. */
export const dialect: Dialect = {
  vendor: "google",
  rejectsKey: (status, body) =>
    status === 401 || status === 403 || reasonsOf(body).some((reason) => keyReasons.has(reason)),
  messageOf: errorMessageOf,
  refuses: (status, body) =>
    (refusedStatuses.has(status) && !reasonsOf(body).some((reason) => keyReasons.has(reason))) ||
    quotaExhausted(status, body),
  retryAfterOf: retryDelayOf,
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

// ---- Chat: POST /v1beta/models/{model}:generateContent ----

/** Thinking budgets (tokens) for Gemini models that take a budget rather than a level. */
export const googleThinkingBudget: Readonly<Record<string, number>> = {
  low: 1_024,
  medium: 8_192,
  high: 24_576,
}

/** Families that take `thinkingLevel` instead of `thinkingBudget`. */
const levelFamilies = { "gemini-3": true } as const

/**
 * Gemini 3 and later: Google Search together with function declarations (opted into with
 * `toolConfig.includeServerSideToolInvocations`; Gemini 2.5 refuses the pair, "Tool use with
 * function calling is unsupported"), and images inside `functionResponse.parts` (multimodal
 * function responses) rather than beside the response.
 */
export const isGemini3 = (model: string): boolean =>
  familyOf(levelFamilies, model, ["-", "."]) !== undefined || /^gemini-([4-9]|\d{2,})/.test(model)

/**
 * Whether `model` can search the web in a turn that also offers functions (an agent's turns
 * always do); when it cannot, the loop leaves search out and says so in the run log.
 */
export const searchesWithFunctions = isGemini3

/** The prefix of the ids the client makes up for Gemini's function calls. */
export const callIdPrefix = "gcall_"

/** The fields of a `generateContent` answer we use; parts are kept whole to send back. */
export const Generated = Schema.Struct({
  candidates: Schema.optionalWith(
    Schema.Array(
      Schema.Struct({
        content: Schema.optional(
          Schema.Struct({
            parts: Schema.optionalWith(
              Schema.Array(Schema.Record({ key: Schema.String, value: Schema.Unknown })),
              {
                default: () => [],
              },
            ),
          }),
        ),
        finishReason: Schema.optional(Schema.String),
        groundingMetadata: Schema.optional(
          Schema.Struct({ webSearchQueries: Schema.optional(Schema.Array(Schema.Unknown)) }),
        ),
      }),
    ),
    { default: () => [] },
  ),
  promptFeedback: Schema.optional(Schema.Struct({ blockReason: Schema.optional(Schema.String) })),
  usageMetadata: Schema.optional(
    Schema.Struct({
      promptTokenCount: Schema.optional(Schema.Number),
      cachedContentTokenCount: Schema.optional(Schema.Number),
      candidatesTokenCount: Schema.optional(Schema.Number),
      thoughtsTokenCount: Schema.optional(Schema.Number),
    }),
  ),
})

// Empty text parts are left out (Gemini refuses an empty text part; a command with no output is one).
const partsOf = (parts: ReadonlyArray<Part>): Array<Record<string, unknown>> =>
  parts.flatMap(
    (p): Array<Record<string, unknown>> =>
      p.type === "text"
        ? p.text === ""
          ? []
          : [{ text: p.text }]
        : [{ inlineData: { mimeType: p.media_type, data: p.data } }],
  )

type Content = { role: "user" | "model"; parts: Array<Record<string, unknown>> }

/** The `contents` list for `items` (for `model`: where a function response's images go). */
export const contentsOf = (items: ChatRequest["items"], model = ""): Array<Content> => {
  const imagesInside = isGemini3(model)
  const out: Array<Content> = []
  // Ids Gemini itself gave to calls (echoed in the responses); the made-up ones are not sent.
  const vendorIds = new Set<string>()
  const push = (role: Content["role"], parts: Array<Record<string, unknown>>) => {
    // A turn with no parts is refused; an empty answer or prompt adds nothing anyway.
    if (parts.length === 0) return
    const last = out.at(-1)
    if (last?.role === role) last.parts.push(...parts)
    else out.push({ role, parts })
  }
  for (const item of liveItems(items)) {
    switch (item.role) {
      case "user":
        push("user", partsOf(item.content))
        break
      case "compaction":
        push("user", [{ text: compactionText(item.summary) }])
        break
      case "assistant": {
        const replay = vendorData(item, "google")?.parts
        if (Array.isArray(replay)) {
          for (const part of replay as Array<Record<string, unknown>>) {
            const call = part.functionCall as { id?: unknown } | undefined
            if (typeof call?.id === "string") vendorIds.add(call.id)
          }
          // An empty text part goes only when it carries a thought signature (Gemini may put one there).
          const parts = replay as Array<Record<string, unknown>>
          push(
            "model",
            parts.filter((p) => !(p.text === "" && p.thoughtSignature === undefined)),
          )
          break
        }
        push("model", [
          ...(item.text === "" ? [] : [{ text: item.text }]),
          ...item.tool_calls.map((c) => ({
            functionCall: {
              name: c.name,
              args: typeof c.arguments === "string" ? { input: c.arguments } : c.arguments,
            },
          })),
        ])
        break
      }
      case "tool": {
        const text = textOf(item.content)
        const images = item.content.filter((p) => p.type === "image")
        // Function responses lead the turn, before any image or text of the same user turn.
        const inside = imagesInside && images.length > 0
        const response = {
          functionResponse: {
            ...(vendorIds.has(item.call_id) ? { id: item.call_id } : {}),
            name: item.name,
            response: item.is_error ? { error: text } : { output: text },
            ...(inside ? { parts: partsOf(images) } : {}),
          },
        }
        const beside = inside ? [] : partsOf(images)
        const last = out.at(-1)
        if (last?.role === "user") {
          const at = last.parts.findIndex((p) => p.functionResponse === undefined)
          last.parts.splice(at === -1 ? last.parts.length : at, 0, response)
          last.parts.push(...beside)
        } else push("user", [response, ...beside])
        break
      }
    }
  }
  return out
}

/** The request body of one turn. */
export const bodyOf = (req: ChatRequest, options: TurnOptions = {}): Record<string, unknown> => {
  const tools: Array<unknown> = []
  if (req.tools.length > 0) {
    tools.push({
      functionDeclarations: req.tools.map((t) => ({
        name: t.name,
        description: t.description,
        parametersJsonSchema: t.parameters,
      })),
    })
  }
  // Search beside functions only where the model takes the pair (see `isGemini3`).
  const search =
    req.web_search && !options.noTools && (req.tools.length === 0 || searchesWithFunctions(req.model))
  if (search) tools.push({ googleSearch: {} })
  const effort = req.reasoning_effort
  const thinkingConfig =
    effort === ""
      ? undefined
      : familyOf(levelFamilies, req.model, ["-", "."])
        ? { thinkingLevel: effort }
        : { thinkingBudget: googleThinkingBudget[effort] ?? googleThinkingBudget.medium }
  const generationConfig = {
    ...(req.max_output_tokens > 0 ? { maxOutputTokens: req.max_output_tokens } : {}),
    ...(thinkingConfig ? { thinkingConfig } : {}),
  }
  return {
    systemInstruction: { parts: [{ text: req.system }] },
    contents: contentsOf(req.items, req.model),
    ...(tools.length > 0 ? { tools } : {}),
    ...(options.noTools && req.tools.length > 0
      ? { toolConfig: { functionCallingConfig: { mode: "NONE" } } }
      : search && req.tools.length > 0
        ? { toolConfig: { includeServerSideToolInvocations: true } }
        : {}),
    ...(Object.keys(generationConfig).length > 0 ? { generationConfig } : {}),
  }
}

/** Finish reasons that mean the answer was blocked rather than finished. */
const blocked = new Set([
  "SAFETY",
  "RECITATION",
  "LANGUAGE",
  "BLOCKLIST",
  "PROHIBITED_CONTENT",
  "SPII",
  "IMAGE_SAFETY",
])

/** The reply for a decoded answer. */
export const replyOf = (answer: typeof Generated.Type): Effect.Effect<ChatReply, ChatError> => {
  const candidate = answer.candidates[0]
  const block = answer.promptFeedback?.blockReason
  if (candidate === undefined) {
    return Effect.fail(
      block
        ? new ChatRefused({ provider: "google", status: 200, message: `the prompt was blocked (${block})` })
        : new VendorUnavailable({ vendor: "google", status: 200, message: "the answer has no candidate" }),
    )
  }
  const parts = candidate.content?.parts ?? []
  const finish = candidate.finishReason ?? "STOP"
  if (finish === "MALFORMED_FUNCTION_CALL") {
    return Effect.fail(
      new VendorUnavailable({
        vendor: "google",
        status: 200,
        message: "the model made a malformed function call",
      }),
    )
  }
  const texts: Array<string> = []
  const calls: Array<ToolCall> = []
  for (const part of parts) {
    if (typeof part.text === "string" && part.thought !== true) texts.push(part.text)
    const call = part.functionCall
    if (typeof call === "object" && call !== null) {
      const { id, name, args } = call as { id?: unknown; name?: unknown; args?: unknown }
      if (typeof name !== "string") {
        return Effect.fail(
          new VendorUnavailable({
            vendor: "google",
            status: 200,
            message: "the answer has an unexpected shape (a functionCall without name)",
          }),
        )
      }
      calls.push({
        id: typeof id === "string" && id !== "" ? id : `${callIdPrefix}${randomUUID()}`,
        name,
        arguments:
          typeof args === "object" && args !== null && !Array.isArray(args)
            ? (args as Record<string, unknown>)
            : {},
      })
    }
  }
  if (blocked.has(finish) && texts.length === 0 && calls.length === 0) {
    return Effect.fail(
      new ChatRefused({ provider: "google", status: 200, message: `the answer was blocked (${finish})` }),
    )
  }
  const u = answer.usageMetadata
  const prompt = count(u?.promptTokenCount)
  const cached = Math.min(count(u?.cachedContentTokenCount), prompt)
  const output = count(u?.candidatesTokenCount) + count(u?.thoughtsTokenCount)
  return Effect.succeed({
    item: {
      role: "assistant",
      text: texts.join(""),
      tool_calls: calls,
      vendor: { provider: "google", data: { parts } },
    },
    stop: calls.length > 0 ? "tool_calls" : finish === "MAX_TOKENS" ? "max_tokens" : "end",
    usage: {
      input_tokens: prompt - cached,
      cache_read_tokens: cached,
      cache_write_tokens: 0,
      output_tokens: output,
      web_searches: candidate.groundingMetadata?.webSearchQueries?.length ?? 0,
    },
    context_tokens: prompt + output,
  })
}

/**
 * A streamed turn (`:streamGenerateContent?alt=sse`), assembled into the answer a non-streamed
 * call gives: each chunk's parts appended in order (a text part joins the text part before it when
 * neither carries a thought signature and both are, or are not, thoughts: a signed part stays as
 * it came), the last `finishReason`, grounding, usage and prompt feedback. A stream that ends
 * before a `finishReason` (or a blocked prompt) is incomplete.
 */
export const assembler = (): Assembler => {
  const parts: Array<Record<string, unknown>> = []
  let finishReason: unknown
  let grounding: unknown
  let usage: unknown
  let feedback: unknown
  const asRecord = (u: unknown): Record<string, unknown> =>
    typeof u === "object" && u !== null ? (u as Record<string, unknown>) : {}
  return {
    push: ({ data }) => {
      const chunk = asRecord(data)
      if (chunk.error !== undefined) return errorMessageOf(chunk) ?? "the answer's stream reported an error"
      if (chunk.usageMetadata !== undefined) usage = chunk.usageMetadata
      if (chunk.promptFeedback !== undefined) feedback = chunk.promptFeedback
      const candidate = asRecord(Array.isArray(chunk.candidates) ? chunk.candidates[0] : undefined)
      if (candidate.finishReason !== undefined) finishReason = candidate.finishReason
      if (candidate.groundingMetadata !== undefined) grounding = candidate.groundingMetadata
      const content = asRecord(candidate.content)
      for (const part of Array.isArray(content.parts) ? (content.parts as Array<unknown>) : []) {
        const p = asRecord(part)
        const last = parts.at(-1)
        if (
          typeof p.text === "string" &&
          typeof last?.text === "string" &&
          p.thoughtSignature === undefined &&
          last.thoughtSignature === undefined &&
          (p.thought === true) === (last.thought === true)
        )
          last.text = `${last.text}${p.text}`
        else parts.push({ ...p })
      }
      return undefined
    },
    result: () => {
      const blocked = asRecord(feedback).blockReason !== undefined
      if (finishReason === undefined && !blocked) return undefined
      return {
        candidates:
          finishReason === undefined
            ? []
            : [
                {
                  content: { role: "model", parts },
                  finishReason,
                  ...(grounding === undefined ? {} : { groundingMetadata: grounding }),
                },
              ],
        ...(usage === undefined ? {} : { usageMetadata: usage }),
        ...(feedback === undefined ? {} : { promptFeedback: feedback }),
      }
    },
  }
}

/** One model turn. */
export const turn = (
  http: HttpClient.HttpClient,
  endpoint: Endpoint,
  req: ChatRequest,
  options: TurnOptions = {},
): Effect.Effect<ChatReply, ChatError> =>
  sendChat(
    http,
    dialect,
    endpoint,
    request(endpoint, "POST", `/v1beta/models/${encodeURIComponent(req.model)}:streamGenerateContent`).pipe(
      HttpClientRequest.setUrlParam("alt", "sse"),
      HttpClientRequest.bodyUnsafeJson(bodyOf(req, options)),
    ),
    Generated,
    assembler,
  ).pipe(Effect.flatMap(replyOf))

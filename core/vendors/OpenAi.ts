/**
 * OpenAI over plain HTTP. Auth is `Authorization: Bearer <key>`; errors come as
 * `{error: {message, type, param, code}}` with 401 for a wrong key (its message echoes a masked
 * key, which `scrubKey` removes), 403 for a key that may not be used from here, 429 for rate or
 * quota limits and 5xx for outages.
 *
 * `GET /v1/models` answers `{object: "list", data: [{id, object: "model", created, owned_by}]}`
 * in one page, with no limits or efforts: those come from `Catalog.openAiFacts`.
 *
 * A model turn is `POST /v1/responses` (the Responses API), streamed (`stream: true`: a long answer
 * keeps bytes coming, so no idle timeout of ours or a proxy's cuts it; the `response.completed`
 * event carries the whole response), with `store: false` so
 * OpenAI keeps no conversation state: the whole conversation goes every time. `instructions` is the
 * system prompt; `input` holds user messages (`input_text`, `input_image` with a `data:` URL),
 * the assistant's messages and `function_call` items, and `function_call_output` items (a string,
 * or `input_text`/`input_image` parts when the result holds an image; an error result is prefixed
 * `Error: ` since the item has no error flag). Reasoning models get
 * `include: ["reasoning.encrypted_content"]`, so their `reasoning` items come back encrypted and are
 * kept, in output order with the turn's messages, function calls and `web_search_call` items, in
 * the assistant item's `vendor.data.items` and sent back as the API gave them, ids included: the
 * API reference requires `id` and `summary` on a `reasoning` input item, and a reasoning item must
 * be followed by the output item it led to (a `message` with its `msg_` id and `status`, or a
 * `function_call` with its `fc_` id). Non-reasoning models refuse that `include`, so they do not
 * get it.
 *
 * `prompt_cache_key` is the run id, so a run's turns meet the same prompt cache (OpenAI caches a
 * stable prefix on its own; the conversation only grows at its end).
 * Tools are `{type: "function", name, description, parameters, strict: false}` plus
 * `{type: "web_search"}`; `reasoning: {effort}` when an effort is set; `max_output_tokens` when >0.
 * Answer: `status` (`completed`, or `incomplete` with `incomplete_details.reason`
 * `max_output_tokens`), `output` items, `usage: {input_tokens, input_tokens_details:
 * {cached_tokens}, output_tokens}`; each `web_search_call` output item is one search.
 *
 * Errors for a turn: 401/403 refuse the key; 400/404/413/422 and a 429 whose code is
 * `insufficient_quota` (no credit left: waiting will not help) refuse the request (`ChatRefused`);
 * other 429s (rate limits), 5xx, and a `failed` response are unavailable (retried by the loop).
 */
import { type HttpClient, HttpClientRequest } from "@effect/platform"
import { Effect, Schema } from "effect"
import type { CatalogModel } from "../../schema/Provider.ts"
import { entryOf, familyOf, isOpenAiChatModel, openAiFacts, unknownChatModel } from "./Catalog.ts"
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
  argumentsText,
  compactionText,
  count,
  type Dialect,
  type Endpoint,
  errorMessageOf,
  liveItems,
  parseArguments,
  refusedStatuses,
  sendChat,
  sendJson,
  type TurnOptions,
  textOf,
  urlOf,
  vendorData,
} from "./Http.ts"

const codeOf = (body: unknown): unknown => {
  const error = typeof body === "object" && body !== null ? (body as { error?: unknown }).error : undefined
  return typeof error === "object" && error !== null ? (error as { code?: unknown }).code : undefined
}

/** How OpenAI reports errors. */
export const dialect: Dialect = {
  vendor: "openai",
  rejectsKey: (status) => status === 401 || status === 403,
  messageOf: errorMessageOf,
  refuses: (status, body) =>
    refusedStatuses.has(status) || (status === 429 && codeOf(body) === "insufficient_quota"),
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

// ---- Chat: POST /v1/responses ----

/** Whether `model` reasons (takes an effort): only those accept `reasoning.encrypted_content`. */
export const isReasoningModel = (model: string): boolean => {
  const facts = familyOf(openAiFacts, model)
  return facts ? facts.efforts.length > 0 : /^(o\d|gpt-[5-9])/.test(model) && !model.includes("chat")
}

const OutputItem = Schema.Union(
  Schema.Struct({
    type: Schema.Literal("message"),
    id: Schema.optional(Schema.String),
    status: Schema.optional(Schema.String),
    content: Schema.Array(
      Schema.Union(
        Schema.Struct({ type: Schema.Literal("output_text"), text: Schema.String }),
        Schema.Struct({ type: Schema.Literal("refusal"), refusal: Schema.String }),
        Schema.Struct({ type: Schema.String }),
      ),
    ),
  }),
  Schema.Struct({
    type: Schema.Literal("function_call"),
    id: Schema.optional(Schema.String),
    call_id: Schema.String,
    name: Schema.String,
    arguments: Schema.String,
    status: Schema.optional(Schema.String),
  }),
  Schema.Struct({
    type: Schema.Literal("reasoning"),
    id: Schema.String,
    summary: Schema.optional(Schema.Array(Schema.Unknown)),
    encrypted_content: Schema.optional(Schema.NullOr(Schema.String)),
  }),
  Schema.Struct({
    type: Schema.Literal("web_search_call"),
    id: Schema.String,
    status: Schema.optional(Schema.String),
    action: Schema.optional(Schema.Unknown),
  }),
  Schema.Struct({ type: Schema.String }),
)

/** The fields of a Responses API answer we use. */
export const Response = Schema.Struct({
  status: Schema.optional(Schema.String),
  incomplete_details: Schema.optional(
    Schema.NullOr(Schema.Struct({ reason: Schema.optional(Schema.String) })),
  ),
  error: Schema.optional(Schema.NullOr(Schema.Struct({ message: Schema.optional(Schema.String) }))),
  output: Schema.Array(OutputItem),
  usage: Schema.optional(
    Schema.NullOr(
      Schema.Struct({
        input_tokens: Schema.Number,
        output_tokens: Schema.Number,
        input_tokens_details: Schema.optional(
          Schema.NullOr(Schema.Struct({ cached_tokens: Schema.optional(Schema.Number) })),
        ),
      }),
    ),
  ),
})

const contentOf = (parts: ReadonlyArray<Part>) =>
  parts.map((p) =>
    p.type === "text"
      ? { type: "input_text", text: p.text }
      : { type: "input_image", image_url: `data:${p.media_type};base64,${p.data}` },
  )

/** The `input` list for `items`. */
export const inputOf = (items: ChatRequest["items"]): Array<unknown> =>
  liveItems(items).flatMap((item): Array<unknown> => {
    switch (item.role) {
      case "user":
        return [{ role: "user", content: contentOf(item.content) }]
      case "compaction":
        return [{ role: "user", content: [{ type: "input_text", text: compactionText(item.summary) }] }]
      case "assistant": {
        const replay = vendorData(item, "openai")?.items
        if (Array.isArray(replay)) return replay
        return [
          ...(item.text === "" ? [] : [{ role: "assistant", content: item.text }]),
          ...item.tool_calls.map((c) => ({
            type: "function_call",
            call_id: c.id,
            name: c.name,
            arguments: argumentsText(c.arguments),
          })),
        ]
      }
      case "tool": {
        const hasImage = item.content.some((p) => p.type === "image")
        const prefix = item.is_error ? "Error: " : ""
        const output = hasImage
          ? contentOf(
              item.is_error
                ? [{ type: "text" as const, text: prefix.trim() }, ...item.content]
                : item.content,
            )
          : `${prefix}${textOf(item.content)}`
        return [{ type: "function_call_output", call_id: item.call_id, output }]
      }
      default:
        return []
    }
  })

/** The request body of one turn. */
export const bodyOf = (req: ChatRequest, options: TurnOptions = {}): Record<string, unknown> => {
  const tools: Array<unknown> = req.tools.map((t) => ({
    type: "function",
    name: t.name,
    description: t.description,
    parameters: t.parameters,
    strict: false,
  }))
  if (req.web_search && !options.noTools) tools.push({ type: "web_search" })
  return {
    model: req.model,
    instructions: req.system,
    input: inputOf(req.items),
    ...(tools.length > 0 ? { tools } : {}),
    ...(options.noTools && tools.length > 0 ? { tool_choice: "none" } : {}),
    ...(req.reasoning_effort !== "" ? { reasoning: { effort: req.reasoning_effort } } : {}),
    ...(req.max_output_tokens > 0 ? { max_output_tokens: req.max_output_tokens } : {}),
    store: false,
    stream: true,
    ...(isReasoningModel(req.model) ? { include: ["reasoning.encrypted_content"] } : {}),
    ...(req.cache_key === undefined ? {} : { prompt_cache_key: req.cache_key }),
  }
}

/**
 * The items to send back: as given when the turn's reasoning goes back with them; without their ids
 * when it does not (a model not known to reason, so no encrypted reasoning came), since an output
 * item's id tells OpenAI to expect the reasoning item that led to it.
 */
const withoutOrphanIds = (items: Array<unknown>): Array<unknown> => {
  const records = items as Array<Record<string, unknown>>
  if (records.some((i) => i.type === "reasoning")) return items
  return records.map((i) => {
    if (i.type === "message") {
      const content = (i.content ?? []) as Array<Record<string, unknown>>
      return { role: "assistant", content: content.map((c) => String(c.text ?? c.refusal ?? "")).join("") }
    }
    if (i.type === "function_call") {
      const { id: _id, status: _status, ...call } = i
      return call
    }
    return i
  })
}

/** The reply for a decoded answer. */
export const replyOf = (answer: typeof Response.Type): Effect.Effect<ChatReply, ChatError> => {
  if (answer.status === "failed") {
    return Effect.fail(
      new VendorUnavailable({
        vendor: "openai",
        status: 200,
        message: answer.error?.message ?? "the response failed",
      }),
    )
  }
  const texts: Array<string> = []
  const calls: Array<ToolCall> = []
  const replay: Array<unknown> = []
  let searches = 0
  for (const out of answer.output) {
    if (out.type === "message" && "content" in out) {
      const text = out.content.map((c) => ("text" in c ? c.text : "refusal" in c ? c.refusal : "")).join("")
      texts.push(text)
      // As given (an output message is an input item), or as plain text when it has no id.
      replay.push(
        out.id === undefined
          ? { role: "assistant", content: text }
          : {
              type: "message",
              id: out.id,
              role: "assistant",
              status: out.status ?? "completed",
              content: out.content.flatMap(
                (c): Array<Record<string, unknown>> =>
                  "text" in c
                    ? [{ type: "output_text", text: c.text, annotations: [] }]
                    : "refusal" in c
                      ? [{ type: "refusal", refusal: c.refusal }]
                      : [],
              ),
            },
      )
    } else if (out.type === "function_call" && "call_id" in out) {
      calls.push({ id: out.call_id, name: out.name, arguments: parseArguments(out.arguments) })
      replay.push({
        type: "function_call",
        ...(out.id === undefined ? {} : { id: out.id }),
        call_id: out.call_id,
        name: out.name,
        arguments: out.arguments,
        ...(out.status === undefined ? {} : { status: out.status }),
      })
    } else if (
      out.type === "reasoning" &&
      "encrypted_content" in out &&
      typeof out.encrypted_content === "string"
    ) {
      replay.push({
        type: "reasoning",
        id: out.id,
        summary: out.summary ?? [],
        encrypted_content: out.encrypted_content,
      })
    } else if (out.type === "web_search_call" && "id" in out) {
      searches += 1
      replay.push({
        type: "web_search_call",
        id: out.id,
        status: out.status ?? "completed",
        ...(out.action === undefined ? {} : { action: out.action }),
      })
    }
  }
  const reason = answer.incomplete_details?.reason
  if (answer.status === "incomplete" && reason !== "max_output_tokens" && calls.length === 0) {
    return Effect.fail(
      new ChatRefused({
        provider: "openai",
        status: 200,
        message: `the answer was cut short (${reason ?? "incomplete"})`,
      }),
    )
  }
  const usage = answer.usage
  const input = count(usage?.input_tokens)
  const cached = Math.min(count(usage?.input_tokens_details?.cached_tokens), input)
  const output = count(usage?.output_tokens)
  return Effect.succeed({
    item: {
      role: "assistant",
      text: texts.join("\n"),
      tool_calls: calls,
      vendor: { provider: "openai", data: { items: withoutOrphanIds(replay) } },
    },
    stop: calls.length > 0 ? "tool_calls" : answer.status === "incomplete" ? "max_tokens" : "end",
    usage: {
      input_tokens: input - cached,
      cache_read_tokens: cached,
      cache_write_tokens: 0,
      output_tokens: output,
      web_searches: searches,
    },
    context_tokens: input + output,
  })
}

/**
 * A streamed turn: the final `response.completed` (or `.incomplete`, `.failed`) event carries the
 * whole response, the same object a non-streamed turn answers; an `error` event fails the turn.
 */
export const assembler = (): Assembler => {
  let whole: unknown
  return {
    push: ({ data }) => {
      const e = (typeof data === "object" && data !== null ? data : {}) as {
        type?: unknown
        response?: unknown
        message?: unknown
      }
      if (e.type === "error")
        return typeof e.message === "string" ? e.message : "the answer's stream reported an error"
      if (e.type === "response.completed" || e.type === "response.incomplete" || e.type === "response.failed")
        whole = e.response
      return undefined
    },
    result: () => whole,
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
    request(endpoint, "POST", "/v1/responses").pipe(HttpClientRequest.bodyUnsafeJson(bodyOf(req, options))),
    Response,
    assembler,
  ).pipe(Effect.flatMap(replyOf))

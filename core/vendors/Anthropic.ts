/**
 * Anthropic over plain HTTP. Auth is `x-api-key: <key>` with `anthropic-version: 2023-06-01`;
 * errors come as `{type: "error", error: {type, message}}`: 401 `authentication_error` for a wrong
 * key, 403 `permission_error`, 429 `rate_limit_error`, 500 `api_error`, 529 `overloaded_error`.
 *
 * `GET /v1/models?limit&after_id` answers `{data: [{id, display_name, created_at, type: "model"}],
 * has_more, first_id, last_id}`, newest first; pass `last_id` as `after_id` for the next page.
 * Limits and efforts come from `Catalog.anthropicFacts`.
 *
 * A model turn is `POST /v1/messages`, streamed (`stream: true`, as Anthropic advises for long
 * answers: events keep coming, so no idle timeout cuts a long answer; `assembler` rebuilds the
 * message): `system`, `messages` (user content as `text`
 * and `image` blocks with a base64 source; the assistant's blocks; tool results as `tool_result`
 * blocks, which may hold images, gathered at the head of the user message after the `tool_use`),
 * `max_tokens` (required: the request's limit, else the model's maximum from
 * `Catalog.anthropicFacts`), `tools` (`{name, description, input_schema}`, plus
 * `{type: "web_search_20250305", name: "web_search", max_uses: 20}` for web search).
 * An effort turns on extended thinking: `thinking: {type: "enabled", budget_tokens}` with the
 * budget of `Catalog.anthropicThinkingBudget` (low 4096, medium 16384, high 32768; an effort not
 * in the table counts as medium), capped below `max_tokens`; when `max_tokens` leaves no room for
 * the API's minimum budget (1024) the turn runs without thinking.
 * Prompt caching (Anthropic's prompt-caching guide): `system` is one text block with a
 * `cache_control: {type: "ephemeral"}` breakpoint (tools and system prompt, the same every turn),
 * and the last block of the conversation that may take one carries the second, so each turn reads
 * the whole previous turn from cache; usage counts the reads and writes.
 *
 * The answer's content blocks are kept whole in the assistant item's `vendor.data.content` and
 * sent back verbatim: thinking blocks must come back with their signatures, and
 * `server_tool_use`/`web_search_tool_result` blocks must stay with the text that cites them.
 *
 * `stop_reason`: `tool_use` → tool calls, `max_tokens` (and `model_context_window_exceeded`) →
 * out of tokens, `end_turn`/`stop_sequence` → done, `refusal` → `ChatRefused`. `pause_turn` (the
 * API paused a long server-tool turn, e.g. many web searches) is continued here: the paused content
 * is sent back as the last assistant message and the API resumes; up to `maxContinuations` times,
 * the blocks and usage of every call joined into one reply.
 *
 * Usage: `input_tokens` (uncached), `cache_read_input_tokens`, `cache_creation_input_tokens`,
 * `output_tokens`, `server_tool_use.web_search_requests`.
 *
 * Errors for a turn: 401 and 403 `permission_error` refuse the key, except a refusal that names web
 * search: an organization whose admin disabled web search gets every request offering the tool
 * refused. Anthropic does not publish that error's exact shape; we take any 400/404/413/422
 * (`invalid_request_error`, `not_found_error`, `request_too_large`, a too-low credit balance) and a
 * 403 whose message mentions web search as `ChatRefused`. 429 `rate_limit_error`, 5xx and 529
 * `overloaded_error` are unavailable.
 */
import { type HttpClient, HttpClientRequest } from "@effect/platform"
import { Effect, Redacted, Schema } from "effect"
import type { CatalogModel } from "../../schema/Provider.ts"
import { anthropicFacts, anthropicThinkingBudget, entryOf, familyOf, unknownChatModel } from "./Catalog.ts"
import {
  type CallUsage,
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
  addUsage,
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
  urlOf,
  vendorData,
} from "./Http.ts"

/** The API version every request names. */
export const apiVersion = "2023-06-01"

/** The page size we ask for (the API's maximum). */
const pageLimit = 1000

/** How Anthropic reports errors. */
export const dialect: Dialect = {
  vendor: "anthropic",
  rejectsKey: (status) => status === 401 || status === 403,
  messageOf: errorMessageOf,
  refuses: (status, body) =>
    refusedStatuses.has(status) || (status === 403 && /web.?search/i.test(errorMessageOf(body) ?? "")),
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

// ---- Chat: POST /v1/messages ----

/** How many times one turn follows `pause_turn` before answering what it has. */
export const maxContinuations = 5

/** The API's smallest thinking budget. */
const minThinkingBudget = 1024

/**
 * Tokens of `max_tokens` kept for the answer when thinking is on: a quarter, and at least 1,024.
 * What is left is the most thinking may take; below Anthropic's minimum budget (1,024) the turn
 * runs without thinking rather than with no room to answer.
 */
export const answerReserveOf = (maxTokens: number) => Math.max(1024, Math.ceil(maxTokens / 4))

/** Searches allowed per reply (the spec's limit). */
export const webSearchMaxUses = 20

/** The fields of a Messages API answer we use; content blocks are kept whole (every field) to send back. */
export const Message = Schema.Struct({
  content: Schema.Array(Schema.Record({ key: Schema.String, value: Schema.Unknown })),
  stop_reason: Schema.optional(Schema.NullOr(Schema.String)),
  usage: Schema.Struct({
    input_tokens: Schema.Number,
    output_tokens: Schema.Number,
    cache_read_input_tokens: Schema.optional(Schema.NullOr(Schema.Number)),
    cache_creation_input_tokens: Schema.optional(Schema.NullOr(Schema.Number)),
    server_tool_use: Schema.optional(
      Schema.NullOr(Schema.Struct({ web_search_requests: Schema.optional(Schema.Number) })),
    ),
  }),
})

/** The model's output maximum, from the facts table (conservative for a model in no family). */
export const maxTokensOf = (model: string): number =>
  (familyOf(anthropicFacts, model) ?? unknownChatModel.anthropic).maxOutputTokens

// Empty text blocks are left out: the API refuses them ("text content blocks must be non-empty"),
// and a command with no output is an empty text.
const contentOf = (parts: ReadonlyArray<Part>): Array<Record<string, unknown>> =>
  parts.flatMap(
    (p): Array<Record<string, unknown>> =>
      p.type === "text"
        ? p.text === ""
          ? []
          : [{ type: "text", text: p.text }]
        : [{ type: "image", source: { type: "base64", media_type: p.media_type, data: p.data } }],
  )

type Message = { role: "user" | "assistant"; content: Array<Record<string, unknown>> }

/** The `messages` list for `items`: same-role neighbours merged, tool results first in their message. */
export const messagesOf = (items: ChatRequest["items"]): Array<Message> => {
  const out: Array<Message> = []
  const push = (role: Message["role"], blocks: Array<Record<string, unknown>>, first = false) => {
    // A message with no content is refused; an empty answer or prompt adds nothing anyway.
    if (blocks.length === 0) return
    const last = out.at(-1)
    if (last?.role !== role) out.push({ role, content: blocks })
    else if (first) {
      // Tool results go before any other block of the user message (the API requires it).
      const at = last.content.findIndex((b) => b.type !== "tool_result")
      last.content.splice(at === -1 ? last.content.length : at, 0, ...blocks)
    } else last.content.push(...blocks)
  }
  for (const item of liveItems(items)) {
    switch (item.role) {
      case "user":
        push("user", contentOf(item.content))
        break
      case "compaction":
        push("user", [{ type: "text", text: compactionText(item.summary) }])
        break
      case "assistant": {
        const replay = vendorData(item, "anthropic")?.content
        if (Array.isArray(replay)) {
          const blocks = replay as Array<Record<string, unknown>>
          push(
            "assistant",
            blocks.filter((b) => !(b.type === "text" && b.text === "")),
          )
          break
        }
        push("assistant", [
          ...(item.text === "" ? [] : [{ type: "text", text: item.text }]),
          ...item.tool_calls.map((c) => ({
            type: "tool_use",
            id: c.id,
            name: c.name,
            input: typeof c.arguments === "string" ? { input: c.arguments } : c.arguments,
          })),
        ])
        break
      }
      case "tool": {
        const content = contentOf(item.content)
        push(
          "user",
          [
            {
              type: "tool_result",
              tool_use_id: item.call_id,
              ...(content.length > 0 ? { content } : {}),
              ...(item.is_error ? { is_error: true } : {}),
            },
          ],
          true,
        )
        break
      }
    }
  }
  return out
}

const ephemeral = { type: "ephemeral" } as const

/** Block types a cache breakpoint may not sit on. */
const uncacheable = new Set(["thinking", "redacted_thinking"])

/**
 * `messages` with a cache breakpoint on the last block that can take one (not a thinking block,
 * not an empty text), copied rather than changed in place.
 */
export const withTailBreakpoint = (messages: Array<Message>): Array<Message> => {
  for (let m = messages.length - 1; m >= 0; m--) {
    const content = messages[m]?.content ?? []
    for (let b = content.length - 1; b >= 0; b--) {
      const block = content[b] as Record<string, unknown>
      if (uncacheable.has(String(block.type)) || (block.type === "text" && block.text === "")) continue
      const copy = [...messages]
      const blocks = [...content]
      blocks[b] = { ...block, cache_control: ephemeral }
      copy[m] = { ...(messages[m] as Message), content: blocks }
      return copy
    }
  }
  return messages
}

/** The request body of one call. */
export const bodyOf = (
  req: ChatRequest,
  options: TurnOptions = {},
  messages: Array<Message> = messagesOf(req.items),
): Record<string, unknown> => {
  const maxTokens = req.max_output_tokens > 0 ? req.max_output_tokens : maxTokensOf(req.model)
  const tools: Array<unknown> = req.tools.map((t) => ({
    name: t.name,
    description: t.description,
    input_schema: t.parameters,
  }))
  if (req.web_search)
    tools.push({ type: "web_search_20250305", name: "web_search", max_uses: webSearchMaxUses })
  const wanted = anthropicThinkingBudget[req.reasoning_effort] ?? anthropicThinkingBudget.medium ?? 16_384
  // Thinking counts against max_tokens: a share is kept for the answer itself.
  const budget = Math.min(wanted, maxTokens - answerReserveOf(maxTokens))
  const thinking = req.reasoning_effort !== "" && budget >= minThinkingBudget
  return {
    model: req.model,
    max_tokens: maxTokens,
    // Streamed (Anthropic advises it for long answers; see `assembler`).
    stream: true,
    // Prompt caching: a breakpoint after the system prompt (tools and system, the same every turn)
    // and one on the conversation's last block, so the next turn reads all of this turn from cache.
    ...(req.system === "" ? {} : { system: [{ type: "text", text: req.system, cache_control: ephemeral }] }),
    messages: withTailBreakpoint(messages),
    ...(tools.length > 0 ? { tools } : {}),
    ...(options.noTools && tools.length > 0 ? { tool_choice: { type: "none" } } : {}),
    ...(thinking ? { thinking: { type: "enabled", budget_tokens: budget } } : {}),
  }
}

const usageOf = (u: (typeof Message.Type)["usage"]): CallUsage => ({
  input_tokens: count(u.input_tokens),
  cache_read_tokens: count(u.cache_read_input_tokens),
  cache_write_tokens: count(u.cache_creation_input_tokens),
  output_tokens: count(u.output_tokens),
  web_searches: count(u.server_tool_use?.web_search_requests),
})

const noUsage: CallUsage = {
  input_tokens: 0,
  cache_read_tokens: 0,
  cache_write_tokens: 0,
  output_tokens: 0,
  web_searches: 0,
}

/**
 * A streamed call, assembled into the message a non-streamed call answers: `message_start` gives
 * the message, `content_block_start` each block, deltas grow them (`text_delta`, `input_json_delta`
 * parsed at `content_block_stop`, `thinking_delta`, `signature_delta`, `citations_delta`),
 * `message_delta` the stop reason and usage, `message_stop` ends it; an `error` event (an overload
 * mid-stream) fails the call.
 */
export const assembler = (): Assembler => {
  let message: Record<string, unknown> | undefined
  const blocks: Array<Record<string, unknown>> = []
  const json = new Map<number, string>()
  let stopped = false
  const asRecord = (u: unknown): Record<string, unknown> =>
    typeof u === "object" && u !== null ? (u as Record<string, unknown>) : {}
  return {
    push: ({ data }) => {
      const e = asRecord(data)
      const index = typeof e.index === "number" ? e.index : -1
      const block = blocks[index]
      switch (e.type) {
        case "message_start":
          message = { ...asRecord(e.message), content: blocks }
          break
        case "content_block_start":
          if (index >= 0) blocks[index] = { ...asRecord(e.content_block) }
          break
        case "content_block_delta": {
          const d = asRecord(e.delta)
          if (block === undefined) break
          if (d.type === "text_delta") block.text = `${String(block.text ?? "")}${String(d.text ?? "")}`
          else if (d.type === "input_json_delta")
            json.set(index, `${json.get(index) ?? ""}${String(d.partial_json ?? "")}`)
          else if (d.type === "thinking_delta")
            block.thinking = `${String(block.thinking ?? "")}${String(d.thinking ?? "")}`
          else if (d.type === "signature_delta") block.signature = d.signature
          else if (d.type === "citations_delta")
            block.citations = [...(Array.isArray(block.citations) ? block.citations : []), d.citation]
          break
        }
        case "content_block_stop": {
          const text = json.get(index)
          if (block !== undefined && text !== undefined) {
            try {
              block.input = text === "" ? {} : JSON.parse(text)
            } catch {
              block.input = {}
            }
            json.delete(index)
          }
          break
        }
        case "message_delta":
          if (message !== undefined) {
            const d = asRecord(e.delta)
            message.stop_reason = d.stop_reason
            message.stop_sequence = d.stop_sequence ?? null
            // Only the counts this event has (it may send `null` for those it does not).
            const counts = Object.entries(asRecord(e.usage)).filter(([, v]) => v !== null && v !== undefined)
            message.usage = { ...asRecord(message.usage), ...Object.fromEntries(counts) }
          }
          break
        case "message_stop":
          stopped = true
          break
        case "error": {
          const error = asRecord(e.error)
          return typeof error.message === "string" ? error.message : "the answer's stream reported an error"
        }
      }
      return undefined
    },
    result: () => (stopped ? message : undefined),
  }
}

/** One model turn, following `pause_turn`. */
export const turn = (
  http: HttpClient.HttpClient,
  endpoint: Endpoint,
  req: ChatRequest,
  options: TurnOptions = {},
): Effect.Effect<ChatReply, ChatError> =>
  Effect.gen(function* () {
    const messages = messagesOf(req.items)
    const blocks: Array<Record<string, unknown>> = []
    let usage = noUsage
    let context = 0
    let stop: string | null | undefined
    for (let call = 0; call <= maxContinuations; call++) {
      // A continued turn sends the paused content back as the last assistant message.
      const sent =
        blocks.length > 0 ? [...messages, { role: "assistant" as const, content: [...blocks] }] : messages
      const body = bodyOf(req, options, sent)
      const answer = yield* sendChat(
        http,
        dialect,
        endpoint,
        request(endpoint, "POST", "/v1/messages").pipe(HttpClientRequest.bodyUnsafeJson(body)),
        Message,
        assembler,
      )
      blocks.push(...answer.content)
      const used = usageOf(answer.usage)
      usage = addUsage(usage, used)
      context = used.input_tokens + used.cache_read_tokens + used.cache_write_tokens + used.output_tokens
      stop = answer.stop_reason
      if (stop !== "pause_turn") break
    }
    if (stop === "refusal") {
      return yield* new ChatRefused({
        provider: "anthropic",
        status: 200,
        message: "the model declined to answer (stop_reason refusal)",
      })
    }
    if (stop === "pause_turn") {
      return yield* new VendorUnavailable({
        vendor: "anthropic",
        status: 200,
        message: `the turn was still paused after ${maxContinuations} continuations`,
      })
    }
    const calls: Array<ToolCall> = []
    const texts: Array<string> = []
    for (const b of blocks) {
      if (b.type === "text" && typeof b.text === "string") texts.push(b.text)
      if (b.type === "tool_use") {
        if (typeof b.id !== "string" || typeof b.name !== "string") {
          return yield* new VendorUnavailable({
            vendor: "anthropic",
            status: 200,
            message: "the answer has an unexpected shape (a tool_use block without id or name)",
          })
        }
        const input = b.input
        calls.push({
          id: b.id,
          name: b.name,
          arguments:
            typeof input === "object" && input !== null && !Array.isArray(input)
              ? (input as Record<string, unknown>)
              : JSON.stringify(input ?? null),
        })
      }
    }
    const reply: ChatReply = {
      item: {
        role: "assistant",
        text: texts.join(""),
        tool_calls: calls,
        vendor: { provider: "anthropic", data: { content: blocks } },
      },
      stop:
        calls.length > 0
          ? "tool_calls"
          : stop === "max_tokens" || stop === "model_context_window_exceeded"
            ? "max_tokens"
            : "end",
      usage,
      context_tokens: context,
    }
    return reply
  })

/**
 * A fake of Anthropic's API: `GET /v1/models` with `limit`/`after_id`/`before_id` paging and
 * `has_more`/`first_id`/`last_id`, the key checked from `x-api-key` and `anthropic-version`
 * required, errors in Anthropic's `{type: "error", error: {type, message}}` shape (a wrong key is
 * 401 `authentication_error` "invalid x-api-key"). `POST /v1/messages` answers only from its queue
 * (`enqueue("messages", …)`).
 *
 * Scripting a model turn (each call queues one answer of `POST /v1/messages`, in order):
 *
 *     fake.replyText("Done.", { input_tokens: 100, cache_read_tokens: 50, output_tokens: 20 })
 *     fake.replyToolCalls([{ name: "bash", arguments: { command: "ls" } }], { output_tokens: 5 })
 *     fake.replyText("Found it.", { web_searches: 2 })   // server_tool_use + web_search_tool_result blocks
 *     fake.replyText("…", {}, { thinking: "hmm", signature: "sig-1" })   // a thinking block first
 *     fake.replyText("…", {}, { stop: "pause_turn" })     // or "max_tokens", "refusal"
 *     fake.replyError(529, AnthropicFake.error(529, "overloaded_error", "Overloaded").json)
 *
 * Usage is given in `Chat.CallUsage` terms (`FakeUsage`) and written the Anthropic way:
 * `input_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`, `output_tokens`,
 * `server_tool_use.web_search_requests`. Tool use ids are `toolu_<n>` unless given.
 *
 * Reading what the agent sent: `fake.chats()` (every `POST /v1/messages` as a `SeenChat`: `system`,
 * user texts, `tool_result` blocks by `tool_use_id` with their text, images and `is_error`, base64
 * `image` blocks, tool names, whether the `web_search_20250305` tool was offered, the raw `body`),
 * `fake.lastChat()`.
 *
 * The route rejects, as Anthropic does (400 `invalid_request_error`), a body without `max_tokens`
 * or `messages`, an empty message or text block, a thinking budget under 1024 or not below `max_tokens`, a `tool_result` whose id
 * is not a `tool_use` of the message just before, and a `tool_use` left without its result in the
 * next message.
 */

import { createHash } from "node:crypto"
import type { Scope } from "effect"
import { Effect } from "effect"
import {
  type FakeCall,
  type FakeControls,
  type FakeUsage,
  jsonBody,
  n0,
  objects,
  pageOf,
  type RecordedRequest,
  type Reply,
  type SeenChat,
  type SeenToolResult,
  start,
} from "./FakeServer.ts"

/** A model as the fake lists it. */
export interface AnthropicModel {
  readonly id: string
  readonly display_name?: string
  readonly created_at?: string
}

/** How a scripted turn looks beyond its text or calls. */
export interface ReplyOptions {
  /** A thinking block first, with this text and `signature` (default `sig-<n>`). */
  readonly thinking?: string
  readonly signature?: string
  /** The `stop_reason` (default `end_turn`, or `tool_use` for tool calls). */
  readonly stop?: string
  /** A text block before the tool calls (`replyToolCalls`). */
  readonly text?: string
  /** Streamed: the connection drops after this many events. */
  readonly cutAfter?: number
}

let serial = 0
const nextId = (prefix: string) => `${prefix}_${++serial}`

/** `usage` as Anthropic writes it. */
export const usageBody = (u: FakeUsage = {}) => ({
  input_tokens: n0(u.input_tokens),
  cache_creation_input_tokens: n0(u.cache_write_tokens),
  cache_read_input_tokens: n0(u.cache_read_tokens),
  output_tokens: n0(u.output_tokens),
  ...(n0(u.web_searches) > 0 ? { server_tool_use: { web_search_requests: n0(u.web_searches) } } : {}),
})

/** A Messages API answer holding `content` after the thinking and search blocks the options ask for. */
export const messageReply = (
  content: ReadonlyArray<unknown>,
  stop: string,
  usage: FakeUsage = {},
  options: ReplyOptions = {},
): Reply => ({
  json: {
    id: nextId("msg"),
    type: "message",
    role: "assistant",
    model: "claude-fake",
    content: [
      ...(options.thinking === undefined
        ? []
        : [{ type: "thinking", thinking: options.thinking, signature: options.signature ?? nextId("sig") }]),
      ...Array.from({ length: n0(usage.web_searches) }).flatMap((_, i) => {
        const id = nextId("srvtoolu")
        return [
          { type: "server_tool_use", id, name: "web_search", input: { query: `fake query ${i + 1}` } },
          {
            type: "web_search_tool_result",
            tool_use_id: id,
            content: [
              {
                type: "web_search_result",
                url: `https://example.com/${i + 1}`,
                title: `Result ${i + 1}`,
                encrypted_content: `enc-${id}`,
                page_age: null,
              },
            ],
          },
        ]
      }),
      ...content,
    ],
    stop_reason: options.stop ?? stop,
    stop_sequence: null,
    usage: usageBody(usage),
  },
  ...(options.cutAfter === undefined ? {} : { cutAfter: options.cutAfter }),
})

const halves = (text: string) => [text.slice(0, text.length >> 1), text.slice(text.length >> 1)]

/**
 * A message as `stream: true` sends it (the streaming reference): `message_start` (no content,
 * input usage), per block `content_block_start` / deltas (`text_delta`, `input_json_delta`,
 * `thinking_delta` then `signature_delta`) / `content_block_stop`, `message_delta` with the stop
 * reason and output usage, `message_stop`; a `ping` between.
 */
export const streamedMessage = (request: RecordedRequest, reply: Reply): Reply => {
  if (jsonBody(request).stream !== true) return reply
  const message = reply.json as Record<string, unknown>
  const usage = (message.usage ?? {}) as Record<string, unknown>
  const events: Array<Record<string, unknown>> = [
    {
      type: "message_start",
      message: {
        ...message,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: { ...usage, output_tokens: 1 },
      },
    },
    { type: "ping" },
  ]
  ;((message.content ?? []) as Array<Record<string, unknown>>).forEach((block, index) => {
    const delta = (d: Record<string, unknown>) =>
      events.push({ type: "content_block_delta", index, delta: d })
    if (block.type === "text") {
      events.push({ type: "content_block_start", index, content_block: { type: "text", text: "" } })
      for (const text of halves(String(block.text))) delta({ type: "text_delta", text })
    } else if (block.type === "tool_use" || block.type === "server_tool_use") {
      events.push({ type: "content_block_start", index, content_block: { ...block, input: {} } })
      for (const partial_json of halves(JSON.stringify(block.input ?? {})))
        delta({ type: "input_json_delta", partial_json })
    } else if (block.type === "thinking") {
      events.push({
        type: "content_block_start",
        index,
        content_block: { type: "thinking", thinking: "", signature: "" },
      })
      for (const thinking of halves(String(block.thinking))) delta({ type: "thinking_delta", thinking })
      delta({ type: "signature_delta", signature: block.signature })
    } else events.push({ type: "content_block_start", index, content_block: block })
    events.push({ type: "content_block_stop", index })
  })
  events.push({
    type: "message_delta",
    delta: { stop_reason: message.stop_reason, stop_sequence: message.stop_sequence ?? null },
    usage: {
      output_tokens: usage.output_tokens ?? 0,
      ...(usage.server_tool_use ? { server_tool_use: usage.server_tool_use } : {}),
    },
  })
  events.push({ type: "message_stop" })
  return {
    sse: events.map((e) => ({ event: String(e.type), data: e })),
    ...(reply.cutAfter === undefined ? {} : { cutAfter: reply.cutAfter }),
  }
}

/** A turn answering `text`. */
export const textReply = (text: string, usage?: FakeUsage, options?: ReplyOptions): Reply =>
  messageReply([{ type: "text", text }], "end_turn", usage, options)

/** A turn calling `calls`. */
export const toolCallsReply = (
  calls: ReadonlyArray<FakeCall>,
  usage?: FakeUsage,
  options?: ReplyOptions,
): Reply =>
  messageReply(
    [
      ...(options?.text === undefined ? [] : [{ type: "text", text: options.text }]),
      ...calls.map((c) => ({
        type: "tool_use",
        id: c.id ?? nextId("toolu"),
        name: c.name,
        input: c.arguments,
      })),
    ],
    "tool_use",
    usage,
    options,
  )

/** A block's text parts joined, and its base64 images. */
const partsOf = (content: unknown) => {
  const blocks = typeof content === "string" ? [{ type: "text", text: content }] : objects(content)
  const text = blocks.flatMap((b) => (b.type === "text" ? [String(b.text)] : [])).join("\n")
  const images = blocks.flatMap((b) => {
    const source = b.source as { data?: unknown } | undefined
    return b.type === "image" && typeof source?.data === "string" ? [source.data] : []
  })
  return { text, images }
}

/** A `POST /v1/messages` body, vendor-neutral. */
export const seen = (request: RecordedRequest): SeenChat => {
  const body = jsonBody(request)
  const userTexts: Array<string> = []
  const toolResults: Array<SeenToolResult> = []
  const images: Array<string> = []
  for (const message of objects(body.messages)) {
    if (message.role !== "user") continue
    const blocks =
      typeof message.content === "string"
        ? [{ type: "text", text: message.content }]
        : objects(message.content)
    const own = blocks.filter((b) => b.type !== "tool_result")
    for (const b of blocks) {
      if (b.type !== "tool_result") continue
      const { text, images: shots } = partsOf(b.content)
      images.push(...shots)
      toolResults.push({ id: String(b.tool_use_id), text, images: shots, isError: b.is_error === true })
    }
    if (own.length > 0) {
      const { text, images: shots } = partsOf(own)
      userTexts.push(text)
      images.push(...shots)
    }
  }
  const system =
    typeof body.system === "string"
      ? body.system
      : objects(body.system)
          .map((b) => String(b.text))
          .join("\n")
  const tools = objects(body.tools)
  return {
    body,
    model: String(body.model),
    system,
    userTexts,
    toolResults,
    images,
    tools: tools.flatMap((t) => (t.type === undefined || t.type === "custom" ? [String(t.name)] : [])),
    webSearch: tools.some((t) => typeof t.type === "string" && t.type.startsWith("web_search_")),
  }
}

const invalid = (message: string) => error(400, "invalid_request_error", message)

/** The request body fields of `POST /v1/messages` (the API reference). */
const messagesFields = new Set([
  "model",
  "messages",
  "max_tokens",
  "system",
  "metadata",
  "stop_sequences",
  "stream",
  "temperature",
  "top_k",
  "top_p",
  "tools",
  "tool_choice",
  "thinking",
  "service_tier",
  "container",
  "mcp_servers",
  "context_management",
])

const validateMessages = (request: RecordedRequest): Reply | undefined => {
  const body = jsonBody(request)
  for (const name of Object.keys(body))
    if (!messagesFields.has(name)) return invalid(`${name}: Extra inputs are not permitted`)
  if (!Number.isInteger(body.max_tokens) || (body.max_tokens as number) < 1)
    return invalid("max_tokens: Field required")
  const messages = objects(body.messages)
  if (messages.length === 0) return invalid("messages: Field required")
  const thinking = body.thinking as { type?: unknown; budget_tokens?: unknown } | undefined
  if (thinking?.type === "enabled") {
    const budget = Number(thinking.budget_tokens)
    if (!(budget >= 1024))
      return invalid("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
    if (budget >= (body.max_tokens as number))
      return invalid("`max_tokens` must be greater than `thinking.budget_tokens`.")
  }
  // Prompt-cache breakpoints, as the API checks them: at most 4, of type ephemeral (ttl 5m or 1h),
  // never on an empty text or a thinking block.
  const cacheable = [
    ...objects(body.tools),
    ...objects(body.system),
    ...messages.flatMap((m) => objects(m.content)),
  ].filter((b) => b.cache_control !== undefined)
  if (cacheable.length > 4)
    return invalid(`A maximum of 4 blocks with cache_control may be provided. Found ${cacheable.length}.`)
  for (const b of cacheable) {
    const control = b.cache_control as { type?: unknown; ttl?: unknown }
    if (control?.type !== "ephemeral") return invalid("cache_control.type: Input should be 'ephemeral'")
    if (control.ttl !== undefined && control.ttl !== "5m" && control.ttl !== "1h")
      return invalid("cache_control.ttl: Input should be '5m' or '1h'")
    if (b.type === "text" && b.text === "")
      return invalid("cache_control cannot be set for empty text blocks")
    if (b.type === "thinking" || b.type === "redacted_thinking")
      return invalid("Thinking blocks cannot be cached directly with cache_control")
  }
  for (const [i, message] of messages.entries()) {
    const blocks = objects(message.content)
    if (typeof message.content !== "string" && blocks.length === 0 && i < messages.length - 1) {
      return invalid(
        `messages.${i}: all messages must have non-empty content except for the optional final assistant message`,
      )
    }
    const texts = [...blocks, ...blocks.flatMap((b) => (b.type === "tool_result" ? objects(b.content) : []))]
    if (texts.some((b) => b.type === "text" && b.text === "")) {
      return invalid(`messages.${i}: text content blocks must be non-empty`)
    }
    const before = i > 0 ? objects(messages[i - 1]?.content) : []
    const asked = new Set(before.flatMap((b) => (b.type === "tool_use" ? [String(b.id)] : [])))
    const answered = new Set<string>()
    for (const b of blocks) {
      if (b.type !== "tool_result") continue
      if (!asked.has(String(b.tool_use_id))) {
        return invalid(
          `messages.${i}.content: unexpected \`tool_use_id\` found in \`tool_result\` blocks: ${String(b.tool_use_id)}. Each \`tool_result\` block must have a corresponding \`tool_use\` block in the previous message.`,
        )
      }
      answered.add(String(b.tool_use_id))
    }
    if (i > 0 && message.role === "user") {
      const missing = [...asked].filter((id) => !answered.has(id))
      if (missing.length > 0) {
        return invalid(
          `messages.${i - 1}: \`tool_use\` ids were found without \`tool_result\` blocks immediately after: ${missing.join(", ")}. Each \`tool_use\` block must have a corresponding \`tool_result\` block in the next message.`,
        )
      }
    }
  }
  return undefined
}

/** The Anthropic fake's controls. */
export interface AnthropicFake extends FakeControls {
  /** Queues a turn answering `text`. */
  readonly replyText: (text: string, usage?: FakeUsage, options?: ReplyOptions) => void
  /** Queues a turn calling tools. */
  readonly replyToolCalls: (calls: ReadonlyArray<FakeCall>, usage?: FakeUsage, options?: ReplyOptions) => void
  /** Queues an error answer with `body` as sent (see `error(…).json`, `webSearchDisabledBody`). */
  readonly replyError: (status: number, body: unknown) => void
  /** Every `POST /v1/messages` received, vendor-neutral. */
  readonly chats: () => ReadonlyArray<SeenChat>
  /** The last `POST /v1/messages` received (fails the test when there is none). */
  readonly lastChat: () => SeenChat
  /** Replaces the models `GET /v1/models` lists (in this order: the real API lists newest first). */
  readonly setModels: (models: ReadonlyArray<string | AnthropicModel>) => void
  /** The most models one page holds, whatever `limit` asks (the real API's is 1000). */
  readonly setMaxPageSize: (n: number) => void
}

/** An Anthropic error reply. */
export const error = (status: number, type: string, message: string): Reply => ({
  status,
  json: { type: "error", error: { type, message }, request_id: "req_fake" },
})

/** 529 as Anthropic sends it when overloaded. */
export const overloaded = (): Reply => error(529, "overloaded_error", "Overloaded")

/** 500 as Anthropic sends it on an internal error. */
export const apiError = (): Reply => error(500, "api_error", "Internal server error")

/** 429 as Anthropic sends it when a rate limit is reached. */
export const rateLimited = (retryAfterSeconds?: number): Reply => ({
  ...error(429, "rate_limit_error", "This request would exceed the rate limit for your organization."),
  ...(retryAfterSeconds === undefined ? {} : { headers: { "retry-after": String(retryAfterSeconds) } }),
})

/** 400 as Anthropic sends it when the organization's credit is spent. */
export const creditTooLow = (): Reply =>
  error(
    400,
    "invalid_request_error",
    "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
  )

/**
 * What we answer for a request offering web search to an organization whose admin disabled it.
 * Anthropic does not publish the exact body; we model it as a 400 `invalid_request_error` naming web
 * search (the client also takes a 403 naming web search as a refusal rather than a bad key).
 */
export const webSearchDisabledBody = () => ({
  type: "error",
  error: {
    type: "invalid_request_error",
    message:
      "Web search is not enabled for this organization. An administrator can enable it in the Console.",
  },
  request_id: "req_fake",
})

const noScript = (route: string): Reply =>
  error(500, "api_error", `the fake has no scripted reply for ${route}`)

/** Tokens of some JSON, as the cache emulation counts them (about 4 bytes a token). */
const tokensOf = (value: unknown) => Math.ceil(Buffer.byteLength(JSON.stringify(value)) / 4)

/** The smallest prefix Anthropic caches (Sonnet and Opus: 1,024 tokens). */
export const cacheMinTokens = 1024

/**
 * Anthropic's prompt cache as its guide describes it, for `promptCache: true`: the prompt is the
 * sequence tools, system blocks, message blocks; a block with `cache_control` is a breakpoint. A
 * request reads the longest prefix, ending at any block boundary up to its last breakpoint, that an
 * earlier request cached; it writes the prefix up to each of its breakpoints past that (of at least
 * 1,024 tokens). Usage then reports `cache_read_input_tokens`, `cache_creation_input_tokens` and
 * the rest as `input_tokens`.
 */
export const promptCache = () => {
  const cached = new Set<string>()
  return (body: Record<string, unknown>) => {
    const blocks = [
      ...objects(body.tools),
      ...(typeof body.system === "string" ? [{ type: "text", text: body.system }] : objects(body.system)),
      ...objects(body.messages).flatMap((m) =>
        (typeof m.content === "string" ? [{ type: "text", text: m.content }] : objects(m.content)).map(
          (b) => ({
            ...b,
            role: m.role,
          }),
        ),
      ),
    ]
    const hash = createHash("sha256")
    const prefixes: Array<{ key: string; tokens: number; breakpoint: boolean }> = []
    let tokens = 0
    for (const block of blocks) {
      const { cache_control, ...plain } = block as Record<string, unknown>
      hash.update(JSON.stringify(plain))
      tokens += tokensOf(plain)
      prefixes.push({ key: hash.copy().digest("hex"), tokens, breakpoint: cache_control !== undefined })
    }
    const last = prefixes.findLastIndex((p) => p.breakpoint)
    let read = 0
    for (let i = 0; i <= last; i++) if (cached.has(prefixes[i]!.key)) read = prefixes[i]!.tokens
    let written = read
    for (let i = 0; i <= last; i++) {
      const p = prefixes[i]!
      if (p.breakpoint && p.tokens > read && p.tokens >= cacheMinTokens) {
        cached.add(p.key)
        written = p.tokens
      }
    }
    return { read, write: written - read, input: tokens - written }
  }
}

/** Starts the fake accepting `keys`, listing `models`; `promptCache` counts usage as Anthropic's cache would. */
export const make = (options: {
  readonly keys: ReadonlyArray<string>
  readonly models?: ReadonlyArray<string | AnthropicModel>
  readonly promptCache?: boolean
}): Effect.Effect<AnthropicFake, never, Scope.Scope> =>
  Effect.gen(function* () {
    const keys = new Set(options.keys)
    let models: ReadonlyArray<AnthropicModel> = []
    let maxPageSize = 1000
    const setModels = (list: ReadonlyArray<string | AnthropicModel>) => {
      models = list.map((m) => (typeof m === "string" ? { id: m } : m))
    }
    setModels(options.models ?? [])
    const cache = options.promptCache === true ? promptCache() : undefined
    // Usage as the cache counts it (the scripted output tokens kept).
    const withCacheUsage = (request: RecordedRequest, reply: Reply): Reply => {
      if (cache === undefined) return reply
      const counted = cache(jsonBody(request))
      const message = reply.json as Record<string, unknown>
      return {
        ...reply,
        json: {
          ...message,
          usage: {
            ...(message.usage as Record<string, unknown>),
            input_tokens: counted.input,
            cache_read_input_tokens: counted.read,
            cache_creation_input_tokens: counted.write,
          },
        },
      }
    }
    const controls = yield* start({
      authorize: (req) => {
        const key = req.headers["x-api-key"]
        if (key === undefined) return error(401, "authentication_error", "x-api-key header is required")
        if (!keys.has(key)) return error(401, "authentication_error", "invalid x-api-key")
        if (req.headers["anthropic-version"] === undefined) {
          return error(400, "invalid_request_error", "anthropic-version: header is required")
        }
        return undefined
      },
      notFound: () => error(404, "not_found_error", "Not found"),
      routes: [
        {
          name: "models",
          method: "GET",
          path: /^\/v1\/models$/,
          handle: (req) => {
            const limit = Number(req.query.limit ?? "20")
            if (!Number.isInteger(limit) || limit < 1 || limit > 1000) {
              return error(400, "invalid_request_error", "limit: Input should be less than or equal to 1000")
            }
            const size = Math.min(limit, maxPageSize)
            const after = req.query.after_id
            const start = after === undefined ? 0 : models.findIndex((m) => m.id === after) + 1
            if (after !== undefined && start === 0) {
              return error(400, "invalid_request_error", `after_id: unknown model ${after}`)
            }
            const { page, more } = pageOf(models, start, size)
            return {
              json: {
                data: page.map((m) => ({
                  type: "model",
                  id: m.id,
                  display_name: m.display_name ?? m.id,
                  created_at: m.created_at ?? "2025-01-01T00:00:00Z",
                })),
                has_more: more,
                first_id: page[0]?.id ?? null,
                last_id: page.at(-1)?.id ?? null,
              },
            }
          },
        },
        {
          name: "messages",
          method: "POST",
          path: /^\/v1\/messages$/,
          handle: () => noScript("messages"),
          validate: validateMessages,
          streamed: (request, reply) => streamedMessage(request, withCacheUsage(request, reply)),
        },
      ],
    })
    const chats = () =>
      controls.requests.filter((r) => r.method === "POST" && r.path === "/v1/messages").map(seen)
    return {
      ...controls,
      setModels,
      setMaxPageSize: (n: number) => {
        maxPageSize = n
      },
      replyText: (text, usage, options) => controls.enqueue("messages", textReply(text, usage, options)),
      replyToolCalls: (calls, usage, options) =>
        controls.enqueue("messages", toolCallsReply(calls, usage, options)),
      replyError: (status, body) => controls.enqueue("messages", { status, json: body }),
      chats,
      lastChat: () => {
        const last = chats().at(-1)
        if (last === undefined) throw new Error("the Anthropic fake received no POST /v1/messages")
        return last
      },
    } satisfies AnthropicFake
  })

/**
 * A fake of OpenAI's API: `GET /v1/models` as the real one answers it, the key checked from
 * `Authorization: Bearer`, errors in OpenAI's `{error: {message, type, param, code}}` shape (a
 * wrong key is 401 `invalid_api_key` with the key echoed masked, as the real API does).
 * `POST /v1/responses` (the Responses API, what `core/vendors/OpenAi.ts` uses) and
 * `POST /v1/chat/completions` answer only from their queues (`enqueue("responses", …)`,
 * `enqueue("chat.completions", …)`).
 *
 * Scripting a model turn (each call queues one answer of `POST /v1/responses`, in order):
 *
 *     fake.replyText("Done.", { input_tokens: 100, output_tokens: 20 })
 *     fake.replyToolCalls([{ name: "bash", arguments: { command: "ls" } }], { output_tokens: 5 })
 *     fake.replyText("Found it.", { web_searches: 2 })            // two web_search_call items
 *     fake.replyText("…", {}, { reasoning: "enc-1" })              // a reasoning item first
 *     fake.replyError(429, OpenAiFake.quotaBody())                 // or fake.enqueue("responses", rateLimited())
 *
 * Usage is given in `Chat.CallUsage` terms (`FakeUsage`) and written the OpenAI way: `input_tokens`
 * = input + cache reads, `input_tokens_details.cached_tokens` = cache reads (cache writes do not
 * exist at OpenAI and are dropped). Call ids are `call_<n>` unless given.
 *
 * Reading what the agent sent: `fake.chats()` (every `POST /v1/responses` as a `SeenChat`: system
 * prompt from `instructions`, user texts, tool results from `function_call_output` items (an
 * `Error: ` prefix marks a failed tool), images from `input_image` data URLs, function tool names,
 * whether `{type: "web_search"}` was offered, and the raw `body`), `fake.lastChat()`.
 *
 * The route rejects, as OpenAI does, a body without `model` or `input` and a `function_call_output`
 * whose `call_id` matches no earlier `function_call`.
 */
import type { Scope } from "effect"
import { Effect } from "effect"
import {
  type FakeCall,
  type FakeControls,
  type FakeUsage,
  jsonBody,
  n0,
  objects,
  type RecordedRequest,
  type Reply,
  type SeenChat,
  type SeenToolResult,
  start,
} from "./FakeServer.ts"

/** A model as the fake lists it. */
export interface OpenAiModel {
  readonly id: string
  readonly created?: number
  readonly owned_by?: string
}

/** The OpenAI fake's controls. */
export interface OpenAiFake extends FakeControls {
  /** Replaces the models `GET /v1/models` lists. */
  readonly setModels: (models: ReadonlyArray<string | OpenAiModel>) => void
  /** Queues a turn answering `text`. */
  readonly replyText: (text: string, usage?: FakeUsage, options?: ReplyOptions) => void
  /** Queues a turn calling tools (with `text` from `options.text` before the calls, if any). */
  readonly replyToolCalls: (calls: ReadonlyArray<FakeCall>, usage?: FakeUsage, options?: ReplyOptions) => void
  /** Queues an error answer with `body` as sent (see `error`, `quotaBody`). */
  readonly replyError: (status: number, body: unknown) => void
  /** Every `POST /v1/responses` received, vendor-neutral. */
  readonly chats: () => ReadonlyArray<SeenChat>
  /** The last `POST /v1/responses` received (fails the test when there is none). */
  readonly lastChat: () => SeenChat
}

/** How a scripted turn looks beyond its text or calls. */
export interface ReplyOptions {
  /** A `reasoning` item with this `encrypted_content` comes first (as with `include`). */
  readonly reasoning?: string
  /** Answer `status: "incomplete"`, `incomplete_details.reason: "max_output_tokens"`. */
  readonly incomplete?: boolean
  /** A message before the tool calls (`replyToolCalls`). */
  readonly text?: string
  /** Streamed: the connection drops after this many events. */
  readonly cutAfter?: number
}

let serial = 0
const nextId = (prefix: string) => `${prefix}_${++serial}`

/** `usage` as OpenAI writes it. */
export const usageBody = (u: FakeUsage = {}) => {
  const input = n0(u.input_tokens) + n0(u.cache_read_tokens)
  return {
    input_tokens: input,
    input_tokens_details: { cached_tokens: n0(u.cache_read_tokens) },
    output_tokens: n0(u.output_tokens),
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: input + n0(u.output_tokens),
  }
}

const message = (text: string) => ({
  type: "message",
  id: nextId("msg"),
  status: "completed",
  role: "assistant",
  content: [{ type: "output_text", text, annotations: [] }],
})

/** A Responses API answer holding `output` after the reasoning and search items the options ask for. */
export const responseReply = (
  output: ReadonlyArray<unknown>,
  usage: FakeUsage = {},
  options: ReplyOptions = {},
): Reply => ({
  json: {
    id: nextId("resp"),
    object: "response",
    created_at: 1_700_000_000,
    status: options.incomplete ? "incomplete" : "completed",
    incomplete_details: options.incomplete ? { reason: "max_output_tokens" } : null,
    error: null,
    model: "gpt-fake",
    output: [
      ...(options.reasoning === undefined
        ? []
        : [{ type: "reasoning", id: nextId("rs"), summary: [], encrypted_content: options.reasoning }]),
      ...Array.from({ length: n0(usage.web_searches) }, (_, i) => ({
        type: "web_search_call",
        id: nextId("ws"),
        status: "completed",
        action: { type: "search", query: `fake query ${i + 1}` },
      })),
      ...output,
    ],
    usage: usageBody(usage),
  },
  ...(options.cutAfter === undefined ? {} : { cutAfter: options.cutAfter }),
})

/**
 * A Responses API answer as `stream: true` sends it (the streaming reference's events):
 * `response.created`, each output item added (a message's text in `response.output_text.delta`
 * pieces) and done, then `response.completed` (or `.incomplete` / `.failed`) with the whole
 * response; every event carries its `sequence_number`.
 */
export const streamedResponse = (request: RecordedRequest, reply: Reply): Reply => {
  if (jsonBody(request).stream !== true) return reply
  const response = reply.json as Record<string, unknown>
  const output = (response.output ?? []) as Array<Record<string, unknown>>
  const events: Array<Record<string, unknown>> = [
    { type: "response.created", response: { ...response, status: "in_progress", output: [], usage: null } },
  ]
  output.forEach((item, output_index) => {
    events.push({
      type: "response.output_item.added",
      output_index,
      item: { ...item, status: "in_progress" },
    })
    if (item.type === "message")
      for (const part of (item.content ?? []) as Array<Record<string, unknown>>) {
        const text = String(part.text ?? "")
        for (const delta of [text.slice(0, text.length >> 1), text.slice(text.length >> 1)])
          events.push({ type: "response.output_text.delta", output_index, content_index: 0, delta })
      }
    events.push({ type: "response.output_item.done", output_index, item })
  })
  const final =
    response.status === "incomplete"
      ? "response.incomplete"
      : response.status === "failed"
        ? "response.failed"
        : "response.completed"
  events.push({ type: final, response })
  return {
    sse: events.map((e, sequence_number) => ({ event: String(e.type), data: { ...e, sequence_number } })),
    ...(reply.cutAfter === undefined ? {} : { cutAfter: reply.cutAfter }),
  }
}

/** A turn answering `text`. */
export const textReply = (text: string, usage?: FakeUsage, options?: ReplyOptions): Reply =>
  responseReply([message(text)], usage, options)

/** A turn calling `calls`. */
export const toolCallsReply = (
  calls: ReadonlyArray<FakeCall>,
  usage?: FakeUsage,
  options?: ReplyOptions,
): Reply =>
  responseReply(
    [
      ...(options?.text === undefined ? [] : [message(options.text)]),
      ...calls.map((c) => ({
        type: "function_call",
        id: nextId("fc"),
        call_id: c.id ?? nextId("call"),
        name: c.name,
        arguments: JSON.stringify(c.arguments),
        status: "completed",
      })),
    ],
    usage,
    options,
  )

/** The body of OpenAI's 429 when the account has no credit left (not a rate limit). */
export const quotaBody = () => ({
  error: {
    message:
      "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
    type: "insufficient_quota",
    param: null,
    code: "insufficient_quota",
  },
})

const stripDataUrl = (url: unknown) => (typeof url === "string" ? url.replace(/^data:[^;]*;base64,/, "") : "")

/** A `POST /v1/responses` body, vendor-neutral. */
export const seen = (request: RecordedRequest): SeenChat => {
  const body = jsonBody(request)
  const userTexts: Array<string> = []
  const toolResults: Array<SeenToolResult> = []
  const images: Array<string> = []
  for (const item of objects(body.input)) {
    if (item.role === "user") {
      const content =
        typeof item.content === "string"
          ? [{ type: "input_text", text: item.content }]
          : objects(item.content)
      userTexts.push(content.flatMap((c) => (c.type === "input_text" ? [String(c.text)] : [])).join("\n"))
      for (const c of content) if (c.type === "input_image") images.push(stripDataUrl(c.image_url))
    } else if (item.type === "function_call_output") {
      const parts =
        typeof item.output === "string" ? [{ type: "input_text", text: item.output }] : objects(item.output)
      const text = parts.flatMap((c) => (c.type === "input_text" ? [String(c.text)] : [])).join("\n")
      const shots = parts.flatMap((c) => (c.type === "input_image" ? [stripDataUrl(c.image_url)] : []))
      images.push(...shots)
      toolResults.push({ id: String(item.call_id), text, images: shots, isError: text.startsWith("Error") })
    }
  }
  const tools = objects(body.tools)
  return {
    body,
    model: String(body.model),
    system: typeof body.instructions === "string" ? body.instructions : "",
    userTexts,
    toolResults,
    images,
    tools: tools.flatMap((t) => (t.type === "function" ? [String(t.name)] : [])),
    webSearch: tools.some((t) => t.type === "web_search"),
  }
}

/** The request body parameters of `POST /v1/responses` (the API reference). */
const responsesParameters = new Set([
  "background",
  "conversation",
  "include",
  "input",
  "instructions",
  "max_output_tokens",
  "max_tool_calls",
  "metadata",
  "model",
  "parallel_tool_calls",
  "previous_response_id",
  "prompt",
  "prompt_cache_key",
  "prompt_cache_retention",
  "reasoning",
  "safety_identifier",
  "service_tier",
  "store",
  "stream",
  "stream_options",
  "temperature",
  "text",
  "tool_choice",
  "tools",
  "top_logprobs",
  "top_p",
  "truncation",
  "user",
])

const validateResponses = (request: RecordedRequest): Reply | undefined => {
  const body = jsonBody(request)
  if (typeof body.model !== "string")
    return error(400, "Missing required parameter: 'model'.", "invalid_request_error")
  if (!Array.isArray(body.input))
    return error(400, "Missing required parameter: 'input'.", "invalid_request_error")
  // Parameters the Responses API does not know are refused.
  for (const name of Object.keys(body))
    if (!responsesParameters.has(name))
      return {
        status: 400,
        json: {
          error: {
            message: `Unknown parameter: '${name}'.`,
            type: "invalid_request_error",
            param: name,
            code: "unknown_parameter",
          },
        },
      }
  // The Responses API's floor for `max_output_tokens`.
  if (typeof body.max_output_tokens === "number" && body.max_output_tokens < 16)
    return {
      status: 400,
      json: {
        error: {
          message: `Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got ${body.max_output_tokens} instead.`,
          type: "invalid_request_error",
          param: "max_output_tokens",
          code: "integer_below_min_value",
        },
      },
    }
  const input = objects(body.input)
  for (const [i, item] of input.entries()) {
    // The API reference's required fields of the input items that carry an output item back.
    const required =
      item.type === "reasoning"
        ? ["id", "summary"]
        : item.type === "message" &&
            item.role === "assistant" &&
            objects(item.content).some((c) => c.type === "output_text")
          ? ["id", "status"]
          : []
    for (const field of required)
      if (item[field] === undefined || item[field] === null) return missing(`input[${i}].${field}`)
    // A reasoning item goes back with the item it led to right after it.
    const next = input[i + 1]
    if (
      item.type === "reasoning" &&
      (next === undefined ||
        !["message", "function_call", "web_search_call", "reasoning"].includes(String(next.type)))
    )
      return {
        status: 400,
        json: {
          error: {
            message: `Item '${String(item.id)}' of type 'reasoning' was provided without its required following item.`,
            type: "invalid_request_error",
            param: "input",
            code: null,
          },
        },
      }
  }
  const calls = new Set<string>()
  for (const item of input) {
    if (item.type === "function_call") calls.add(String(item.call_id))
    if (item.type === "function_call_output" && !calls.has(String(item.call_id))) {
      return error(
        400,
        `No tool call found for function call output with call_id ${String(item.call_id)}.`,
        "invalid_request_error",
      )
    }
  }
  return undefined
}

/** 400 for a required field left out, as OpenAI words it. */
const missing = (param: string): Reply => ({
  status: 400,
  json: {
    error: {
      message: `Missing required parameter: '${param}'.`,
      type: "invalid_request_error",
      param,
      code: "missing_required_parameter",
    },
  },
})

/** An OpenAI error reply. */
export const error = (status: number, message: string, type: string, code: string | null = null): Reply => ({
  status,
  json: { error: { message, type, param: null, code } },
})

/** 500 as OpenAI sends it during an outage. */
export const serverError = (): Reply =>
  error(500, "The server had an error while processing your request. Sorry about that!", "server_error")

/** 429 as OpenAI sends it when the key's rate limit is reached. */
export const rateLimited = (retryAfterMs?: number): Reply => ({
  ...error(
    429,
    "Rate limit reached for requests. Please try again in 20ms.",
    "requests",
    "rate_limit_exceeded",
  ),
  ...(retryAfterMs === undefined ? {} : { headers: { "retry-after-ms": String(retryAfterMs) } }),
})

// OpenAI shows a masked key: its first 8 and last 4 characters around asterisks.
const masked = (key: string) =>
  `${key.slice(0, 8)}${"*".repeat(Math.max(4, key.length - 12))}${key.slice(-4)}`

const noScript = (route: string): Reply =>
  error(500, `the fake has no scripted reply for ${route}`, "server_error")

/** Starts the fake accepting `keys`, listing `models`. */
export const make = (options: {
  readonly keys: ReadonlyArray<string>
  readonly models?: ReadonlyArray<string | OpenAiModel>
}): Effect.Effect<OpenAiFake, never, Scope.Scope> =>
  Effect.gen(function* () {
    const keys = new Set(options.keys)
    let models: ReadonlyArray<OpenAiModel> = []
    const setModels = (list: ReadonlyArray<string | OpenAiModel>) => {
      models = list.map((m) => (typeof m === "string" ? { id: m } : m))
    }
    setModels(options.models ?? [])
    const controls = yield* start({
      authorize: (req) => {
        const auth = req.headers.authorization
        if (auth === undefined || !auth.startsWith("Bearer ")) {
          return error(
            401,
            "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the API from your browser and are prompted for a username and password. You can obtain an API key from https://platform.openai.com/account/api-keys.",
            "invalid_request_error",
          )
        }
        const key = auth.slice("Bearer ".length)
        if (keys.has(key)) return undefined
        return error(
          401,
          `Incorrect API key provided: ${masked(key)}. You can find your API key at https://platform.openai.com/account/api-keys.`,
          "invalid_request_error",
          "invalid_api_key",
        )
      },
      notFound: (req) => error(404, `Invalid URL (${req.method} ${req.path})`, "invalid_request_error"),
      routes: [
        {
          name: "models",
          method: "GET",
          path: /^\/v1\/models$/,
          handle: () => ({
            json: {
              object: "list",
              data: models.map((m) => ({
                id: m.id,
                object: "model",
                created: m.created ?? 1_700_000_000,
                owned_by: m.owned_by ?? "system",
              })),
            },
          }),
        },
        {
          name: "responses",
          method: "POST",
          path: /^\/v1\/responses$/,
          handle: () => noScript("responses"),
          validate: validateResponses,
          streamed: streamedResponse,
        },
        {
          name: "chat.completions",
          method: "POST",
          path: /^\/v1\/chat\/completions$/,
          handle: () => noScript("chat.completions"),
        },
      ],
    })
    const chats = () =>
      controls.requests.filter((r) => r.method === "POST" && r.path === "/v1/responses").map(seen)
    return {
      ...controls,
      setModels,
      replyText: (text, usage, options) => controls.enqueue("responses", textReply(text, usage, options)),
      replyToolCalls: (calls, usage, options) =>
        controls.enqueue("responses", toolCallsReply(calls, usage, options)),
      replyError: (status, body) => controls.enqueue("responses", { status, json: body }),
      chats,
      lastChat: () => {
        const last = chats().at(-1)
        if (last === undefined) throw new Error("the OpenAI fake received no POST /v1/responses")
        return last
      },
    } satisfies OpenAiFake
  })

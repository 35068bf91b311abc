/**
 * A fake of Google's Gemini API: `GET /v1beta/models` with `pageSize`/`pageToken` paging and
 * `nextPageToken`, the key checked from `x-goog-api-key` (or `?key=`, which the real API also
 * takes), errors in Google's `{error: {code, message, status, details}}` shape (a wrong key is 400
 * `INVALID_ARGUMENT` with an `ErrorInfo` of reason `API_KEY_INVALID`; no key at all is 403
 * `PERMISSION_DENIED`). `POST /v1beta/models/{model}:generateContent` answers only from its queue
 * (`enqueue("generateContent", …)`).
 *
 * Scripting a model turn (each call queues one answer of `generateContent`, in order):
 *
 *     fake.replyText("Done.", { input_tokens: 100, output_tokens: 20 })
 *     fake.replyToolCalls([{ name: "bash", arguments: { command: "ls" } }], { output_tokens: 5 })
 *     fake.replyText("Found it.", { web_searches: 2 })   // groundingMetadata.webSearchQueries of 2
 *     fake.replyToolCalls(calls, {}, { thoughtSignature: "sig-1" })  // on the first call part
 *     fake.replyText("…", {}, { finishReason: "MAX_TOKENS" })
 *     fake.replyError(503, GoogleFake.unavailable().json)
 *
 * Usage is given in `Chat.CallUsage` terms (`FakeUsage`) and written the Gemini way:
 * `promptTokenCount` = input + cache reads, `cachedContentTokenCount` = cache reads,
 * `candidatesTokenCount` = output (cache writes do not exist here and are dropped). Function calls
 * carry no id, as the Gemini API sends them (give `id` in a `FakeCall` to send one).
 *
 * Reading what the agent sent: `fake.chats()` (every `generateContent` as a `SeenChat`: system
 * prompt from `systemInstruction`, user texts, tool results from `functionResponse` parts (`id` is
 * the function name, since Gemini has no call ids; `response.error` marks a failed tool) with the
 * `inlineData` images of the same turn, every `inlineData` image, declared function names, whether
 * `googleSearch` was offered, the raw `body`), `fake.lastChat()`.
 *
 * The route rejects, as Gemini does (400 `INVALID_ARGUMENT`), a body without `contents`, a turn
 * without parts or with an empty text part (unless it carries a thought signature), and a user
 * turn after function calls whose function responses do not match the calls in number.
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
  pageOf,
  type RecordedRequest,
  type Reply,
  type SeenChat,
  type SeenToolResult,
  start,
} from "./FakeServer.ts"

/** A model as the fake lists it; `name` without the `models/` prefix is filled in. */
export interface GoogleModel {
  readonly id: string
  readonly displayName?: string
  readonly inputTokenLimit?: number
  readonly outputTokenLimit?: number
  readonly supportedGenerationMethods?: ReadonlyArray<string>
  readonly thinking?: boolean
}

/** How a scripted turn looks beyond its text or calls. */
export interface ReplyOptions {
  /** A `thoughtSignature` on the first part (Gemini puts it on the first function call). */
  readonly thoughtSignature?: string
  /** A thought summary part (`thought: true`) first. */
  readonly thought?: string
  /** The candidate's `finishReason` (default `STOP`). */
  readonly finishReason?: string
  /** A text part before the function calls (`replyToolCalls`). */
  readonly text?: string
  /** Streamed: the connection drops after this many chunks. */
  readonly cutAfter?: number
}

/** `usageMetadata` as Gemini writes it. */
export const usageBody = (u: FakeUsage = {}) => {
  const prompt = n0(u.input_tokens) + n0(u.cache_read_tokens)
  return {
    promptTokenCount: prompt,
    ...(n0(u.cache_read_tokens) > 0 ? { cachedContentTokenCount: n0(u.cache_read_tokens) } : {}),
    candidatesTokenCount: n0(u.output_tokens),
    totalTokenCount: prompt + n0(u.output_tokens),
  }
}

/** A `generateContent` answer with `parts`. */
export const contentReply = (
  parts: ReadonlyArray<Record<string, unknown>>,
  usage: FakeUsage = {},
  options: ReplyOptions = {},
): Reply => {
  const all = [...(options.thought === undefined ? [] : [{ text: options.thought, thought: true }]), ...parts]
  const signed = all.map((p, i) =>
    i === (options.thought === undefined ? 0 : 1) && options.thoughtSignature !== undefined
      ? { ...p, thoughtSignature: options.thoughtSignature }
      : p,
  )
  const searches = n0(usage.web_searches)
  return {
    json: {
      candidates: [
        {
          content: { role: "model", parts: signed },
          finishReason: options.finishReason ?? "STOP",
          index: 0,
          ...(searches > 0
            ? {
                groundingMetadata: {
                  webSearchQueries: Array.from({ length: searches }, (_, i) => `fake query ${i + 1}`),
                  groundingChunks: [],
                },
              }
            : {}),
        },
      ],
      usageMetadata: usageBody(usage),
      modelVersion: "gemini-fake",
    },
    ...(options.cutAfter === undefined ? {} : { cutAfter: options.cutAfter }),
  }
}

/**
 * An answer as `:streamGenerateContent?alt=sse` sends it: a `GenerateContentResponse` per chunk,
 * each text part in two chunks (a signature on the last of them), each function call whole, the
 * last chunk with `finishReason`, grounding and `usageMetadata`.
 */
export const streamedContent = (request: RecordedRequest, reply: Reply): Reply => {
  if (!request.path.endsWith(":streamGenerateContent")) return reply
  const answer = reply.json as Record<string, unknown>
  const candidates = objects(answer.candidates)
  const candidate = candidates[0]
  if (candidate === undefined) return { sse: [{ data: answer }] }
  const parts = objects((candidate.content as { parts?: unknown } | undefined)?.parts)
  const chunk = (part: Record<string, unknown>) => ({
    data: {
      candidates: [{ content: { role: "model", parts: [part] }, index: 0 }],
      modelVersion: answer.modelVersion,
    },
  })
  const chunks: Array<{ data: unknown }> = parts.flatMap((part) => {
    if (typeof part.text !== "string" || part.text.length < 2) return [chunk(part)]
    const { thoughtSignature, ...plain } = part
    const half = part.text.length >> 1
    return [
      chunk({ ...plain, text: part.text.slice(0, half) }),
      chunk({
        ...plain,
        text: part.text.slice(half),
        ...(thoughtSignature === undefined ? {} : { thoughtSignature }),
      }),
    ]
  })
  const { content: _content, ...end } = candidate
  chunks.push({
    data: {
      candidates: [{ ...end, content: { role: "model", parts: [] } }],
      usageMetadata: answer.usageMetadata,
      modelVersion: answer.modelVersion,
    },
  })
  return { sse: chunks, ...(reply.cutAfter === undefined ? {} : { cutAfter: reply.cutAfter }) }
}

/** A turn answering `text`. */
export const textReply = (text: string, usage?: FakeUsage, options?: ReplyOptions): Reply =>
  contentReply([{ text }], usage, options)

/** A turn calling `calls`. */
export const toolCallsReply = (
  calls: ReadonlyArray<FakeCall>,
  usage?: FakeUsage,
  options?: ReplyOptions,
): Reply =>
  contentReply(
    [
      ...(options?.text === undefined ? [] : [{ text: options.text }]),
      ...calls.map((c) => ({
        functionCall: { ...(c.id === undefined ? {} : { id: c.id }), name: c.name, args: c.arguments },
      })),
    ],
    usage,
    options,
  )

/** A `generateContent` body, vendor-neutral. */
export const seen = (request: RecordedRequest): SeenChat => {
  const body = jsonBody(request)
  const userTexts: Array<string> = []
  const toolResults: Array<SeenToolResult> = []
  const images: Array<string> = []
  for (const content of objects(body.contents)) {
    if (content.role !== "user") continue
    const parts = objects(content.parts)
    const shots = parts.flatMap((p) => {
      const data = (p.inlineData as { data?: unknown } | undefined)?.data
      return typeof data === "string" ? [data] : []
    })
    images.push(...shots)
    const responses = parts.filter((p) => p.functionResponse !== undefined)
    responses.forEach((p, i) => {
      const r = p.functionResponse as {
        name?: unknown
        response?: { output?: unknown; error?: unknown }
        parts?: unknown
      }
      const isError = r.response?.error !== undefined
      // Gemini 3's multimodal function responses carry their images in `parts`.
      const inside = objects(r.parts).flatMap((q) => {
        const data = (q.inlineData as { data?: unknown } | undefined)?.data
        return typeof data === "string" ? [data] : []
      })
      images.push(...inside)
      toolResults.push({
        id: String(r.name),
        text: String(isError ? r.response?.error : (r.response?.output ?? "")),
        // A turn's loose images go with its last function response.
        images: [...inside, ...(i === responses.length - 1 ? shots : [])],
        isError,
      })
    })
    const texts = parts.flatMap((p) => (typeof p.text === "string" ? [p.text] : []))
    if (responses.length === 0 || texts.length > 0) userTexts.push(texts.join("\n"))
  }
  const system = objects((body.systemInstruction as { parts?: unknown } | undefined)?.parts)
    .map((p) => String(p.text))
    .join("\n")
  const tools = objects(body.tools)
  return {
    body,
    model: request.path.replace(/^\/v1beta\/models\//, "").replace(/:(?:stream)?[gG]enerateContent$/, ""),
    system,
    userTexts,
    toolResults,
    images,
    tools: tools.flatMap((t) => objects(t.functionDeclarations).map((d) => String(d.name))),
    webSearch: tools.some((t) => t.googleSearch !== undefined),
  }
}

/** The request body fields of `generateContent` (the API reference). */
const generateFields = new Set([
  "contents",
  "tools",
  "toolConfig",
  "safetySettings",
  "systemInstruction",
  "generationConfig",
  "cachedContent",
])

const validateGenerate = (request: RecordedRequest): Reply | undefined => {
  const body = jsonBody(request)
  for (const name of Object.keys(body))
    if (!generateFields.has(name))
      return error(
        400,
        "INVALID_ARGUMENT",
        `Invalid JSON payload received. Unknown name "${name}": Cannot find field.`,
        [
          {
            "@type": "type.googleapis.com/google.rpc.BadRequest",
            fieldViolations: [
              { description: `Invalid JSON payload received. Unknown name "${name}": Cannot find field.` },
            ],
          },
        ],
      )
  const contents = objects(body.contents)
  // Built-in tools beside function declarations: refused by Gemini 2.5; Gemini 3 takes them with
  // the documented opt-in (the tool-combination guide).
  const tools = objects(body.tools)
  const model = request.path.replace(/^\/v1beta\/models\//, "").replace(/:(?:stream)?[gG]enerateContent$/, "")
  const optedIn = (body.toolConfig as { includeServerSideToolInvocations?: unknown } | undefined)
    ?.includeServerSideToolInvocations
  if (
    tools.some((t) => t.functionDeclarations !== undefined) &&
    tools.some((t) => t.googleSearch !== undefined) &&
    (!/^gemini-3/.test(model) || optedIn !== true)
  )
    return error(400, "INVALID_ARGUMENT", "Tool use with function calling is unsupported")
  if (contents.length === 0)
    return error(400, "INVALID_ARGUMENT", "* GenerateContentRequest.contents: contents is not specified")
  for (const [i, content] of contents.entries()) {
    const parts = objects(content.parts)
    if (parts.length === 0)
      return error(
        400,
        "INVALID_ARGUMENT",
        `* GenerateContentRequest.contents[${i}].parts: contents.parts must not be empty.`,
      )
    if (parts.some((p) => p.text === "" && p.thoughtSignature === undefined)) {
      return error(
        400,
        "INVALID_ARGUMENT",
        "Unable to submit request because it has an empty text parameter. Add a value to the parameter and try again.",
      )
    }
    if (i === 0 || content.role !== "user") continue
    const before = objects(contents[i - 1]?.parts).filter((p) => p.functionCall !== undefined).length
    if (before === 0) continue
    const responses = objects(content.parts).filter((p) => p.functionResponse !== undefined).length
    if (responses !== before) {
      return error(
        400,
        "INVALID_ARGUMENT",
        "Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn.",
      )
    }
  }
  return undefined
}

/** The Google fake's controls. */
export interface GoogleFake extends FakeControls {
  /** Queues a turn answering `text`. */
  readonly replyText: (text: string, usage?: FakeUsage, options?: ReplyOptions) => void
  /** Queues a turn calling tools. */
  readonly replyToolCalls: (calls: ReadonlyArray<FakeCall>, usage?: FakeUsage, options?: ReplyOptions) => void
  /** Queues an error answer with `body` as sent (see `error(…).json`). */
  readonly replyError: (status: number, body: unknown) => void
  /** Every `generateContent` received, vendor-neutral. */
  readonly chats: () => ReadonlyArray<SeenChat>
  /** The last `generateContent` received (fails the test when there is none). */
  readonly lastChat: () => SeenChat
  /** Replaces the models `GET /v1beta/models` lists. */
  readonly setModels: (models: ReadonlyArray<GoogleModel>) => void
  /** The most models one page holds, whatever `pageSize` asks (the real API's is 1000). */
  readonly setMaxPageSize: (n: number) => void
}

/** A Google error reply. */
export const error = (
  code: number,
  status: string,
  message: string,
  details: ReadonlyArray<unknown> = [],
): Reply => ({
  status: code,
  json: { error: { code, message, status, details } },
})

/** 503 as Google sends it when the model service is overloaded. */
export const unavailable = (): Reply =>
  error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.")

const quotaHelp = {
  "@type": "type.googleapis.com/google.rpc.Help",
  links: [
    {
      description: "Learn more about Gemini API quotas",
      url: "https://ai.google.dev/gemini-api/docs/rate-limits",
    },
  ],
}
const quotaMessage =
  "You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits."

/** A 429 `RESOURCE_EXHAUSTED` naming the quota spent (`QuotaFailure`) and the wait (`RetryInfo`). */
const exhausted = (quotaId: string, quotaValue: string, retryDelay: string): Reply =>
  error(429, "RESOURCE_EXHAUSTED", quotaMessage, [
    {
      "@type": "type.googleapis.com/google.rpc.QuotaFailure",
      violations: [
        {
          quotaMetric: "generativelanguage.googleapis.com/generate_content_free_tier_requests",
          quotaId,
          quotaDimensions: { location: "global", model: "gemini-2.5-pro" },
          quotaValue,
        },
      ],
    },
    quotaHelp,
    { "@type": "type.googleapis.com/google.rpc.RetryInfo", retryDelay },
  ])

/** 429 for a per-minute limit: waiting its `RetryInfo` helps. */
export const rateLimited = (retryDelay = "1s"): Reply =>
  exhausted("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "5", retryDelay)

/** 429 for a daily quota spent (its `RetryInfo` points at a retry that will not help today). */
export const quotaExhausted = (): Reply =>
  exhausted("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "50", "41s")

/** The 400 Google answers for a wrong key. */
export const invalidKey = (): Reply => {
  const message = "API key not valid. Please pass a valid API key."
  return error(400, "INVALID_ARGUMENT", message, [
    {
      "@type": "type.googleapis.com/google.rpc.ErrorInfo",
      reason: "API_KEY_INVALID",
      domain: "googleapis.com",
      metadata: { service: "generativelanguage.googleapis.com" },
    },
    { "@type": "type.googleapis.com/google.rpc.LocalizedMessage", locale: "en-US", message },
  ])
}

const noScript = (route: string): Reply =>
  error(500, "INTERNAL", `the fake has no scripted reply for ${route}`)

/** Starts the fake accepting `keys`, listing `models`. */
export const make = (options: {
  readonly keys: ReadonlyArray<string>
  readonly models?: ReadonlyArray<GoogleModel>
}): Effect.Effect<GoogleFake, never, Scope.Scope> =>
  Effect.gen(function* () {
    const keys = new Set(options.keys)
    let models: ReadonlyArray<GoogleModel> = options.models ?? []
    let maxPageSize = 1000
    const controls = yield* start({
      // Gemini's `alt=sse` stream ends its lines with CR LF.
      sseLineEnd: "\r\n",
      authorize: (req) => {
        const key = req.headers["x-goog-api-key"] ?? req.query.key
        if (key === undefined) {
          return error(
            403,
            "PERMISSION_DENIED",
            "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.",
          )
        }
        return keys.has(key) ? undefined : invalidKey()
      },
      notFound: (req) =>
        error(404, "NOT_FOUND", `The requested URL ${req.path} was not found on this server.`),
      routes: [
        {
          name: "models",
          method: "GET",
          path: /^\/v1beta\/models$/,
          handle: (req) => {
            const size = Math.min(Number(req.query.pageSize ?? "50") || 50, 1000, maxPageSize)
            const token = req.query.pageToken
            const start = token === undefined ? 0 : Number(Buffer.from(token, "base64url").toString("utf8"))
            if (!Number.isInteger(start) || start < 0) {
              return error(400, "INVALID_ARGUMENT", "Invalid page token.")
            }
            const { page, more } = pageOf(models, start, size)
            return {
              json: {
                models: page.map((m) => ({
                  name: `models/${m.id}`,
                  version: "001",
                  displayName: m.displayName ?? m.id,
                  description: `${m.displayName ?? m.id} (fake)`,
                  inputTokenLimit: m.inputTokenLimit ?? 1_048_576,
                  outputTokenLimit: m.outputTokenLimit ?? 65_536,
                  supportedGenerationMethods: m.supportedGenerationMethods ?? [
                    "generateContent",
                    "countTokens",
                  ],
                  temperature: 1,
                  topP: 0.95,
                  ...(m.thinking === undefined ? {} : { thinking: m.thinking }),
                })),
                ...(more ? { nextPageToken: Buffer.from(String(start + size)).toString("base64url") } : {}),
              },
            }
          },
        },
        {
          name: "generateContent",
          method: "POST",
          path: /^\/v1beta\/models\/([^/:]+):(?:stream)?[gG]enerateContent$/,
          handle: () => noScript("generateContent"),
          validate: validateGenerate,
          streamed: streamedContent,
        },
      ],
    })
    const chats = () =>
      controls.requests
        .filter((r) => r.method === "POST" && /:(?:stream)?[gG]enerateContent$/.test(r.path))
        .map(seen)
    return {
      ...controls,
      setModels: (list: ReadonlyArray<GoogleModel>) => {
        models = list
      },
      setMaxPageSize: (n: number) => {
        maxPageSize = n
      },
      replyText: (text, usage, options) =>
        controls.enqueue("generateContent", textReply(text, usage, options)),
      replyToolCalls: (calls, usage, options) =>
        controls.enqueue("generateContent", toolCallsReply(calls, usage, options)),
      replyError: (status, body) => controls.enqueue("generateContent", { status, json: body }),
      chats,
      lastChat: () => {
        const last = chats().at(-1)
        if (last === undefined) throw new Error("the Google fake received no generateContent")
        return last
      },
    } satisfies GoogleFake
  })

/**
 * One model turn at a vendor, vendor-neutral: the contract between the agent loop
 * (`actors/agent/`) and the vendor clients (`OpenAi.ts`, `Anthropic.ts`, `Google.ts`).
 *
 * The conversation is a list of `Item`s the loop keeps and persists (it must survive a worker
 * crash, so every item is plain JSON, described by `Item`). A vendor client turns items into its
 * own request body and its answer back into an `assistant` item; what a vendor needs to see again
 * on the next turn and the loop cannot rebuild (OpenAI reasoning items, Anthropic thinking blocks
 * with signatures, Gemini thought signatures) travels in that item's `vendor` field, opaque to the
 * loop and only ever sent back to the vendor that made it.
 *
 * Errors: `VendorRejectedKey` (401/403 and the like) and `ChatRefused` (the vendor refused the
 * request for good: invalid request, no quota, search disabled for the organization) fail the run
 * with `provider`; `VendorUnavailable` (5xx, 429, 529, network, timeout, an undecodable answer) is
 * retried by the loop with backoff within the run's timeout.
 */
import { Context, type Effect, type Redacted, Schema } from "effect"
import { Vendor } from "../../schema/Provider.ts"
import type { VendorRejectedKey, VendorUnavailable } from "./Errors.ts"

/** The image types a `read` returns and all three vendors take. */
export const ImageType = Schema.Literal("image/png", "image/jpeg", "image/gif", "image/webp")
export const isImageType = Schema.is(ImageType)

/** A piece of content: text, or an image (a screenshot, a `read` of an image file) as base64. */
export const Part = Schema.Union(
  Schema.Struct({ type: Schema.Literal("text"), text: Schema.String }),
  Schema.Struct({
    type: Schema.Literal("image"),
    media_type: ImageType,
    data: Schema.String,
  }),
)
export type Part = typeof Part.Type

/** A call the model made to one of the tools it was shown. */
export const ToolCall = Schema.Struct({
  /** The vendor's id for the call (Google has none: the client makes one up, unique in the reply). */
  id: Schema.String,
  name: Schema.String,
  /** The arguments as the model sent them: a JSON object, or the raw text when it was not JSON. */
  arguments: Schema.Union(Schema.Record({ key: Schema.String, value: Schema.Unknown }), Schema.String),
})
export type ToolCall = typeof ToolCall.Type

/** One entry of the conversation. */
export const Item = Schema.Union(
  /** The run's prompt (first item, word for word), or a later note from the loop. */
  Schema.Struct({ role: Schema.Literal("user"), content: Schema.Array(Part) }),
  /** What the model answered: its text and the tool calls it made, in order. */
  Schema.Struct({
    role: Schema.Literal("assistant"),
    text: Schema.String,
    tool_calls: Schema.Array(ToolCall),
    /** Opaque state for the vendor that made this item (see the module doc); never shown elsewhere. */
    vendor: Schema.optional(Schema.Struct({ provider: Vendor, data: Schema.Unknown })),
  }),
  /** The result of one tool call, sent back under the call's id. */
  Schema.Struct({
    role: Schema.Literal("tool"),
    call_id: Schema.String,
    name: Schema.String,
    content: Schema.Array(Part),
    is_error: Schema.Boolean,
  }),
  /** The conversation so far, compacted: replaces every item before it. */
  Schema.Struct({
    role: Schema.Literal("compaction"),
    /** A summary any vendor can read (the text sent as a user message when nothing else fits). */
    summary: Schema.String,
    /** The vendor's own compacted form, when its compaction made one (sent back instead). */
    vendor: Schema.optional(Schema.Struct({ provider: Vendor, data: Schema.Unknown })),
  }),
)
export type Item = typeof Item.Type

/** A function tool shown to the model. */
export interface ToolSpec {
  readonly name: string
  readonly description: string
  /** A JSON Schema object for the arguments. */
  readonly parameters: Readonly<Record<string, unknown>>
}

/** What one call used, from the vendor's own usage report. */
export const CallUsage = Schema.Struct({
  input_tokens: Schema.Number,
  cache_read_tokens: Schema.Number,
  cache_write_tokens: Schema.Number,
  output_tokens: Schema.Number,
  web_searches: Schema.Number,
})
export type CallUsage = typeof CallUsage.Type

/** One turn to ask for. */
export interface ChatRequest {
  readonly provider: Vendor
  readonly key: Redacted.Redacted<string>
  readonly model: string
  /** `""`: the model's default. */
  readonly reasoning_effort: string
  /** 0: the model's maximum. */
  readonly max_output_tokens: number
  /** The function's system prompt (the instructions). */
  readonly system: string
  readonly items: ReadonlyArray<Item>
  readonly tools: ReadonlyArray<ToolSpec>
  /** Offer the vendor's own web search tool (Anthropic: at most 20 searches per reply). */
  readonly web_search: boolean
  /**
   * What groups the calls of one conversation for the vendor's prompt cache (the run id): OpenAI's
   * `prompt_cache_key` routes them to the same cache.
   */
  readonly cache_key?: string
}

/** What the model answered. */
export interface ChatReply {
  /** The assistant item to append (text, tool calls, vendor state). */
  readonly item: Extract<Item, { role: "assistant" }>
  /** Why it stopped: it made tool calls, it is done talking, or it ran out of output tokens. */
  readonly stop: "tool_calls" | "end" | "max_tokens"
  readonly usage: CallUsage
  /** The conversation's size after this turn as the vendor counted it (input + output tokens). */
  readonly context_tokens: number
}

/** The vendor refused the request for good (not the key): retrying cannot help. */
export class ChatRefused extends Schema.TaggedError<ChatRefused>()("ChatRefused", {
  provider: Vendor,
  status: Schema.Number,
  /** The vendor's own words, scrubbed of the key. */
  message: Schema.String,
}) {}

/** Any failure of a chat call. */
export type ChatError = VendorRejectedKey | VendorUnavailable | ChatRefused

/** The chat side of the vendor layer. */
export interface ChatService {
  /** One model turn. */
  readonly reply: (request: ChatRequest) => Effect.Effect<ChatReply, ChatError>
  /**
   * Compacts `request.items` (the vendor's own compaction where it offers one, else a summary
   * turn by the same model): answers the item that replaces them, and what the call used.
   */
  readonly compact: (
    request: ChatRequest,
  ) => Effect.Effect<
    { readonly item: Extract<Item, { role: "compaction" }>; readonly usage: CallUsage },
    ChatError
  >
}

/** The chat service. */
export class Chat extends Context.Tag("hangar/Chat")<Chat, ChatService>() {}

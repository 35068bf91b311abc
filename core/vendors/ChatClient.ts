/**
 * The chat side of the vendor layer: the `Chat` service (`Chat.ts`) over the three vendor clients
 * (`OpenAi.turn`, `Anthropic.turn`, `Google.turn`), reached at the base URLs of `VendorSettings`
 * with `fetch` (`FetchHttpClient`). Every turn is streamed (server-sent events, each vendor's own
 * format, assembled into the non-streamed answer: `Http.Assembler`), so a long answer keeps bytes
 * coming and no idle timeout of ours or a proxy's cuts it.
 *
 * Timeout: a model turn takes far longer than a catalog read (a reasoning model may think for
 * minutes), so chat calls have their own limit, `HANGAR_VENDOR_CHAT_TIMEOUT_MS` (default 5 minutes):
 * for the answer to begin and then between two events of its stream. Past it, or when the stream
 * ends before the answer is complete, the call is `VendorUnavailable` and the loop asks again; a
 * cut answer's usage is not counted.
 *
 * Usage, the same meaning for every vendor: `input_tokens` are the prompt tokens billed at the full
 * rate, so `input_tokens + cache_read_tokens + cache_write_tokens` is the whole prompt. OpenAI and
 * Google count cached tokens inside their input count (we subtract them); Anthropic counts them
 * apart. Only Anthropic reports cache writes. `output_tokens` include reasoning/thinking tokens.
 * `context_tokens` is the whole prompt plus the output of the turn.
 *
 * Compaction is a summary turn by the same model for every vendor: the conversation plus a user
 * message asking for a summary (`summaryPrompt`), tools still described (the history refers to
 * them) but not callable (`tool_choice: "none"`, Gemini's `mode: "NONE"`). OpenAI also offers
 * `POST /v1/responses/compact`, whose result is an encrypted `compaction` item only OpenAI can read;
 * we do not use it, since the summary must be readable (it goes in the run log and must make sense
 * to whoever reads it, model or person) and one way for all vendors is simpler to reason about.
 * Call `compact` where a user message may follow: after the tool results of the last tool calls.
 * A summary turn that answers no text is `VendorUnavailable` (retried), never an empty summary.
 *
 * Nothing here logs a prompt, a reply or a key: a turn's log line has the vendor, model, stop and
 * usage; a failure is logged with its tag and the vendor's scrubbed words.
 */
import { FetchHttpClient, HttpClient } from "@effect/platform"
import { Effect, Layer } from "effect"
import type { Vendor } from "../../schema/Provider.ts"
import { defineSettings, env } from "../Config.ts"
import * as Anthropic from "./Anthropic.ts"
import { Chat, type ChatRequest, type ChatService } from "./Chat.ts"
import { VendorUnavailable } from "./Errors.ts"
import * as Google from "./Google.ts"
import type { Endpoint } from "./Http.ts"
import * as OpenAi from "./OpenAi.ts"
import { VendorSettings } from "./Vendors.ts"

/** The chat calls' settings. */
export interface ChatSettingsShape {
  /** How long a model turn's answer may take to begin, and then between two of its events. */
  readonly timeoutMs: number
}

/** The chat client's settings. */
export const ChatSettings = defineSettings(
  "hangar/ChatSettings",
  { timeoutMs: 300_000 } as ChatSettingsShape,
  (d) => ({ timeoutMs: env.integer("VENDOR_CHAT_TIMEOUT_MS", d.timeoutMs) }),
)

/** The message that asks for a compaction summary. */
export const summaryPrompt = [
  "Your context is full, so this conversation will be replaced by a summary that you write now.",
  "Write it for yourself, to carry on the task from it alone: the task as given (quote the user's",
  "request word for word), what has been done so far and what it produced (files, commands, results),",
  "what you learned that still matters, the problems met, and the exact next steps. Do not call tools;",
  "answer with the summary only.",
].join(" ")

/** Builds the service over an HTTP client and the settings. */
export const make = Effect.gen(function* () {
  // No `traceparent`/`b3` headers: our trace ids are nothing a vendor should see (platform adds
  // them to every request by default).
  const http = (yield* HttpClient.HttpClient).pipe(HttpClient.withTracerPropagation(false))
  const settings = yield* VendorSettings.Tag
  const chat = yield* ChatSettings.Tag

  const baseUrl: Record<Vendor, string> = {
    openai: settings.openaiBaseUrl,
    anthropic: settings.anthropicBaseUrl,
    google: settings.googleBaseUrl,
  }
  const clients = { openai: OpenAi, anthropic: Anthropic, google: Google } as const

  const call = (request: ChatRequest, noTools: boolean, span: string) => {
    const endpoint: Endpoint = {
      baseUrl: baseUrl[request.provider],
      key: request.key,
      timeoutMs: chat.timeoutMs,
    }
    return clients[request.provider].turn(http, endpoint, request, { noTools }).pipe(
      Effect.tap((reply) =>
        Effect.logDebug("vendor turn").pipe(
          Effect.annotateLogs({ stop: reply.stop, tool_calls: reply.item.tool_calls.length, ...reply.usage }),
        ),
      ),
      Effect.tapError((error) => Effect.logWarning("vendor turn failed", error)),
      Effect.annotateLogs({ vendor: request.provider, model: request.model }),
      Effect.withLogSpan(span),
    )
  }

  const reply: ChatService["reply"] = (request) => call(request, false, "vendor_turn")

  const compact: ChatService["compact"] = (request) =>
    call(
      {
        ...request,
        items: [...request.items, { role: "user", content: [{ type: "text", text: summaryPrompt }] }],
      },
      true,
      "vendor_compact",
    ).pipe(
      Effect.flatMap((answer) =>
        answer.item.text.trim() === ""
          ? Effect.fail(
              new VendorUnavailable({
                vendor: request.provider,
                status: 200,
                message: "the summary turn answered no text",
              }),
            )
          : Effect.succeed({
              item: { role: "compaction" as const, summary: answer.item.text },
              usage: answer.usage,
            }),
      ),
    )

  return { reply, compact } satisfies ChatService
})

/** The `Chat` service over the vendor and chat settings, talking HTTP with `fetch`. */
export const layer = Layer.effect(Chat, make).pipe(Layer.provide(FetchHttpClient.layer))

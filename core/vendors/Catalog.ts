/**
 * What we know about models that the vendors' list endpoints do not say.
 *
 * OpenAI's `GET /v1/models` gives only ids, and Anthropic's only ids and display names, so context
 * windows, output limits and reasoning efforts come from these tables. Google's list gives the
 * token limits and a `thinking` flag; only its efforts come from here.
 *
 * Sources (figures as published by the vendors, checked in 2025–2026; update the table when a
 * vendor ships a model family):
 * - OpenAI: the model pages at developers.openai.com/api/docs/models/<id> and the reasoning guide
 *   (developers.openai.com/api/docs/guides/reasoning): gpt-5 takes `minimal|low|medium|high`
 *   (default `medium`); gpt-5.1 takes `none|low|medium|high` (default `none`); gpt-5.2 and later
 *   add `xhigh`; gpt-5-pro only `high`; o-series `low|medium|high` (default `medium`).
 * - Anthropic: platform.claude.com/docs models overview and the extended thinking guide. Thinking
 *   is a token budget there, off unless asked for; we offer it as efforts `low|medium|high`
 *   (budgets in `anthropicThinkingBudget`) with default `""` (thinking off).
 * - Google: ai.google.dev/gemini-api/docs/thinking: Gemini 2.5 takes a thinking budget and thinks
 *   dynamically by default (default `""`); Gemini 3 takes `thinking_level` `low|high`, default `high`.
 *
 * A family matches an id equal to it or starting with it plus `-` (dated snapshots such as
 * `gpt-4.1-2025-04-14`, `claude-sonnet-4-5-20250929`); the longest matching family wins, so
 * `gpt-4.1-mini` beats `gpt-4.1` and `claude-opus-4-1` beats `claude-opus-4`.
 *
 * A chat model that is in no family gets conservative defaults (`unknownChatModel`): a window and
 * output limit every current chat model of the vendor meets, and no efforts, so a run never asks
 * for more than the model can do. Models that are not chat models (embeddings, speech, images,
 * moderation, realtime, search previews…) are left out of the catalog.
 */
import type { CatalogModel, Vendor } from "../../schema/Provider.ts"

/**
 * The facts one family of models shares. `defaultEffort` is the effort the vendor applies when the
 * request names none, or `""` when that is no effort (thinking off) or not one we have confirmed.
 */
export interface ModelFacts {
  readonly name: string
  readonly contextWindow: number
  readonly maxOutputTokens: number
  readonly efforts: ReadonlyArray<string>
  readonly defaultEffort: string
}

const lmh = ["low", "medium", "high"] as const

const fact = (
  name: string,
  contextWindow: number,
  maxOutputTokens: number,
  efforts: ReadonlyArray<string> = [],
  defaultEffort = "",
): ModelFacts => ({ name, contextWindow, maxOutputTokens, efforts, defaultEffort })

/** OpenAI chat model families. */
export const openAiFacts: Readonly<Record<string, ModelFacts>> = {
  "gpt-3.5-turbo": fact("GPT-3.5 Turbo", 16_385, 4_096),
  "gpt-4": fact("GPT-4", 8_192, 8_192),
  "gpt-4-turbo": fact("GPT-4 Turbo", 128_000, 4_096),
  "gpt-4o": fact("GPT-4o", 128_000, 16_384),
  "gpt-4o-mini": fact("GPT-4o mini", 128_000, 16_384),
  "chatgpt-4o-latest": fact("ChatGPT-4o", 128_000, 16_384),
  "gpt-4.1": fact("GPT-4.1", 1_047_576, 32_768),
  "gpt-4.1-mini": fact("GPT-4.1 mini", 1_047_576, 32_768),
  "gpt-4.1-nano": fact("GPT-4.1 nano", 1_047_576, 32_768),
  o1: fact("o1", 200_000, 100_000, lmh, "medium"),
  "o1-mini": fact("o1-mini", 128_000, 65_536),
  "o1-preview": fact("o1-preview", 128_000, 32_768),
  o3: fact("o3", 200_000, 100_000, lmh, "medium"),
  "o3-mini": fact("o3-mini", 200_000, 100_000, lmh, "medium"),
  "o4-mini": fact("o4-mini", 200_000, 100_000, lmh, "medium"),
  "gpt-5": fact("GPT-5", 400_000, 128_000, ["minimal", ...lmh], "medium"),
  "gpt-5-mini": fact("GPT-5 mini", 400_000, 128_000, ["minimal", ...lmh], "medium"),
  "gpt-5-nano": fact("GPT-5 nano", 400_000, 128_000, ["minimal", ...lmh], "medium"),
  "gpt-5-chat": fact("GPT-5 Chat", 128_000, 16_384),
  "gpt-5-codex": fact("GPT-5-Codex", 400_000, 128_000, lmh, "medium"),
  "gpt-5-pro": fact("GPT-5 pro", 400_000, 272_000, ["high"], "high"),
  "gpt-5.1": fact("GPT-5.1", 400_000, 128_000, ["none", ...lmh], "none"),
  "gpt-5.1-chat": fact("GPT-5.1 Chat", 128_000, 16_384),
  "gpt-5.1-codex": fact("GPT-5.1-Codex", 400_000, 128_000, lmh, "medium"),
  "gpt-5.2": fact("GPT-5.2", 400_000, 128_000, ["none", ...lmh, "xhigh"], "none"),
  "gpt-5.2-chat": fact("GPT-5.2 Chat", 128_000, 16_384),
  "gpt-5.2-pro": fact("GPT-5.2 pro", 400_000, 128_000, ["high"], "high"),
  "gpt-5.4": fact("GPT-5.4", 1_050_000, 128_000, ["none", ...lmh, "xhigh"], "none"),
  // Smaller and pro variants: only the efforts every gpt-5.x takes, and "" for a default we have
  // not confirmed.
  "gpt-5.4-mini": fact("GPT-5.4 mini", 400_000, 128_000, lmh),
  "gpt-5.4-nano": fact("GPT-5.4 nano", 400_000, 128_000, lmh),
  "gpt-5.4-pro": fact("GPT-5.4 pro", 1_050_000, 128_000, ["high"], "high"),
}

/** Anthropic model families (display names come from the vendor's list). */
export const anthropicFacts: Readonly<Record<string, ModelFacts>> = {
  "claude-3-haiku": fact("Claude Haiku 3", 200_000, 4_096),
  "claude-3-5-haiku": fact("Claude Haiku 3.5", 200_000, 8_192),
  "claude-3-5-sonnet": fact("Claude Sonnet 3.5", 200_000, 8_192),
  "claude-3-7-sonnet": fact("Claude Sonnet 3.7", 200_000, 64_000, lmh),
  "claude-sonnet-4": fact("Claude Sonnet 4", 200_000, 64_000, lmh),
  "claude-opus-4": fact("Claude Opus 4", 200_000, 32_000, lmh),
  "claude-opus-4-1": fact("Claude Opus 4.1", 200_000, 32_000, lmh),
  "claude-sonnet-4-5": fact("Claude Sonnet 4.5", 200_000, 64_000, lmh),
  "claude-haiku-4-5": fact("Claude Haiku 4.5", 200_000, 64_000, lmh),
  "claude-opus-4-5": fact("Claude Opus 4.5", 200_000, 64_000, lmh),
}

/**
 * Extended-thinking budget in tokens for each Anthropic effort (the agent loop sends
 * `thinking: {type: "enabled", budget_tokens}`; the API's minimum is 1024 and the budget must stay
 * below `max_tokens`: the loop keeps a quarter of `max_tokens`, at least 1,024, for the answer
 * (`Anthropic.answerReserveOf`) and turns thinking off when less than 1,024 is left for it).
 */
export const anthropicThinkingBudget: Readonly<Record<string, number>> = {
  low: 4_096,
  medium: 16_384,
  high: 32_768,
}

/** Gemini families whose efforts differ from the thinking-budget default. */
export const googleEffortFacts: Readonly<Record<string, Pick<ModelFacts, "efforts" | "defaultEffort">>> = {
  "gemini-3": { efforts: ["low", "high"], defaultEffort: "high" },
}

/** Efforts of a Gemini model that reports `thinking: true` but is in no family above. */
export const googleThinkingDefault: Pick<ModelFacts, "efforts" | "defaultEffort"> = {
  efforts: lmh,
  defaultEffort: "",
}

/** Conservative facts for a chat model in no family. */
export const unknownChatModel: Readonly<Record<Vendor, Omit<ModelFacts, "name">>> = {
  openai: { contextWindow: 128_000, maxOutputTokens: 16_384, efforts: [], defaultEffort: "" },
  anthropic: { contextWindow: 200_000, maxOutputTokens: 8_192, efforts: [], defaultEffort: "" },
  google: { contextWindow: 32_768, maxOutputTokens: 8_192, efforts: [], defaultEffort: "" },
}

/**
 * The family of `id` in `table`: the longest key equal to `id` or a prefix of it followed by `-`.
 * For Gemini a family may also be followed by `.` (`gemini-3` covers `gemini-3.1-pro`).
 */
export const familyOf = <F>(
  table: Readonly<Record<string, F>>,
  id: string,
  separators: ReadonlyArray<string> = ["-"],
): F | undefined => {
  let best: string | undefined
  for (const family of Object.keys(table)) {
    const matches = id === family || separators.some((sep) => id.startsWith(family + sep))
    if (matches && (best === undefined || family.length > best.length)) best = family
  }
  return best === undefined ? undefined : table[best]
}

/** Words in an OpenAI id that mark a model the chat endpoints do not serve. */
const openAiNotChat =
  /(embedding|whisper|tts|dall-e|davinci|babbage|moderation|audio|realtime|transcribe|search|image|sora|instruct|computer-use|deep-research)/

/** Whether an OpenAI id names a chat model at all (in the table or not). */
export const isOpenAiChatModel = (id: string): boolean =>
  !openAiNotChat.test(id) && /^(gpt-|chatgpt-|o\d)/.test(id)

/** Words in a Gemini id that mark a model that answers with something other than text. */
const googleNotChat = /(embedding|aqa|imagen|veo|image|tts|native-audio|live)/

/** Whether a Gemini id names a text chat model (the list already says it supports generateContent). */
export const isGoogleChatModel = (id: string): boolean => !googleNotChat.test(id)

/** The catalog entry of `id` from facts. */
export const entryOf = (id: string, name: string, facts: Omit<ModelFacts, "name">): CatalogModel => ({
  id,
  name,
  context_window: facts.contextWindow,
  max_output_tokens: facts.maxOutputTokens,
  efforts: [...facts.efforts],
  default_effort: facts.defaultEffort,
})

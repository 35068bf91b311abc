/**
 * The facts table's matching rules and the key scrubbing of vendors' messages.
 */
import { describe, expect, it } from "@effect/vitest"
import { anthropicFacts, familyOf, isGoogleChatModel, isOpenAiChatModel, openAiFacts } from "./Catalog.ts"
import { scrubKey } from "./Errors.ts"

describe("familyOf", () => {
  it("matches the id itself or a dated/variant id, the longest family winning", () => {
    expect(familyOf(openAiFacts, "gpt-4.1")?.name).toBe("GPT-4.1")
    expect(familyOf(openAiFacts, "gpt-4.1-2025-04-14")?.name).toBe("GPT-4.1")
    expect(familyOf(openAiFacts, "gpt-4.1-mini-2025-04-14")?.name).toBe("GPT-4.1 mini")
    expect(familyOf(openAiFacts, "gpt-5-chat-latest")?.efforts).toEqual([])
    expect(familyOf(openAiFacts, "o1-mini-2024-09-12")?.efforts).toEqual([])
    expect(familyOf(anthropicFacts, "claude-opus-4-1-20250805")?.maxOutputTokens).toBe(32_000)
    expect(familyOf(anthropicFacts, "claude-sonnet-4-5-20250929")?.name).toBe("Claude Sonnet 4.5")
    expect(familyOf(anthropicFacts, "claude-sonnet-4-20250514")?.name).toBe("Claude Sonnet 4")
  })

  it("does not match across a version dot or a partial word", () => {
    // gpt-5.3 is not gpt-5 (its efforts differ), and gpt-40 is not gpt-4.
    expect(familyOf(openAiFacts, "gpt-5.3")).toBeUndefined()
    expect(familyOf(openAiFacts, "gpt-40")).toBeUndefined()
    expect(familyOf({ "gemini-3": 1 }, "gemini-3.1-pro", ["-", "."])).toBe(1)
    expect(familyOf({ "gemini-3": 1 }, "gemini-30", ["-", "."])).toBeUndefined()
  })
})

describe("chat model filters", () => {
  it("keeps OpenAI chat models and leaves out the rest", () => {
    for (const id of ["gpt-4o", "gpt-5.3", "o3-pro", "chatgpt-4o-latest", "gpt-4.1-nano"]) {
      expect(isOpenAiChatModel(id), id).toBe(true)
    }
    for (const id of [
      "text-embedding-3-large",
      "tts-1-hd",
      "whisper-1",
      "dall-e-3",
      "omni-moderation-latest",
      "gpt-4o-realtime-preview",
      "gpt-4o-audio-preview",
      "gpt-4o-mini-tts",
      "gpt-4o-search-preview",
      "gpt-image-1",
      "davinci-002",
      "gpt-3.5-turbo-instruct",
      "o3-deep-research",
      "sora-2",
    ]) {
      expect(isOpenAiChatModel(id), id).toBe(false)
    }
  })

  it("keeps Gemini text models and leaves out image, speech, live and embedding models", () => {
    expect(isGoogleChatModel("gemini-2.5-flash")).toBe(true)
    expect(isGoogleChatModel("gemma-3-27b-it")).toBe(true)
    for (const id of [
      "gemini-2.5-flash-image",
      "gemini-2.5-flash-preview-tts",
      "gemini-2.0-flash-live-001",
      "gemini-2.5-flash-native-audio-latest",
      "gemini-embedding-001",
    ]) {
      expect(isGoogleChatModel(id), id).toBe(false)
    }
  })
})

describe("scrubKey", () => {
  const key = "sk-proj-abcdef0123456789WXYZ"

  it("removes the key, a masked echo of it, and its visible head or tail", () => {
    expect(scrubKey(`bad key ${key} here`, key)).toBe("bad key <key> here")
    expect(scrubKey("Incorrect API key provided: sk-proj-****************WXYZ. See docs.", key)).toBe(
      "Incorrect API key provided: <key> See docs.",
    )
    expect(scrubKey("key ending WXYZ. refused", key)).toBe("key ending <key> refused")
    expect(scrubKey("key sk-pro… refused", key)).toBe("key <key> refused")
  })

  it("leaves a message without the key alone, and cuts a long one at 500 characters", () => {
    expect(scrubKey("invalid x-api-key", key)).toBe("invalid x-api-key")
    const long = "a".repeat(600)
    expect(scrubKey(long, key)).toBe(`${"a".repeat(500)}…`)
    expect(scrubKey("a".repeat(500), key)).toBe("a".repeat(500))
  })
})

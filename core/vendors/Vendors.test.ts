/**
 * The vendor layer against the three vendor fakes (local HTTP servers speaking each vendor's wire
 * format): catalog mapping, paging and filtering; every kind of failure sorted into
 * `VendorRejectedKey` or `VendorUnavailable`; the key never in an error, a log line or a URL;
 * `checkKey` with a known and an unknown model.
 */
import { createServer } from "node:net"
import { FetchHttpClient } from "@effect/platform"
import { describe, expect, it } from "@effect/vitest"
import {
  ConfigProvider,
  Effect,
  Exit,
  Fiber,
  Layer,
  Logger,
  LogLevel,
  Option,
  Redacted,
  TestClock,
} from "effect"
import type { Vendor } from "../../schema/Provider.ts"
import * as AnthropicFake from "../../test/fakes/AnthropicFake.ts"
import * as GoogleFake from "../../test/fakes/GoogleFake.ts"
import * as OpenAiFake from "../../test/fakes/OpenAiFake.ts"
import * as Log from "../Log.ts"
import { toApiError, type VendorError } from "./Errors.ts"
import { maxPages } from "./Http.ts"
import { layer, make, VendorSettings, type VendorSettingsShape, Vendors } from "./Vendors.ts"

const KEY = "sk-proj-CANARY0123456789abcdefWXYZ"
const key = Redacted.make(KEY)
// The canary and the parts of it a vendor might echo: none may appear anywhere we write.
const canaryParts = [KEY, KEY.slice(0, 12), KEY.slice(-4), "CANARY"]

const vendorsFor = (settings: Partial<VendorSettingsShape>) =>
  make.pipe(Effect.provide(Layer.mergeAll(FetchHttpClient.layer, VendorSettings.layer(settings))))

/** A TCP port nothing listens on (bound, then closed). */
const closedPort = Effect.async<number>((resume) => {
  const server = createServer()
  server.listen(0, "127.0.0.1", () => {
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    server.close(() => resume(Effect.succeed(port)))
  })
})

const failureOf = <A, E>(exit: Exit.Exit<A, E>): E => {
  if (Exit.isSuccess(exit)) throw new Error("expected a failure")
  const failure = exit.cause._tag === "Fail" ? exit.cause.error : undefined
  if (failure === undefined) throw new Error(`expected a typed failure, got ${exit.cause._tag}`)
  return failure
}

const expectNoCanary = (text: string) => {
  for (const part of canaryParts) expect(text).not.toContain(part)
}

describe("OpenAI catalog", () => {
  it.scoped("lists chat models with facts, unknown chat models with defaults, and leaves the rest out", () =>
    Effect.gen(function* () {
      const fake = yield* OpenAiFake.make({
        keys: [KEY],
        models: [
          "gpt-4.1",
          "gpt-4.1-mini-2025-04-14",
          "gpt-5",
          "o3",
          "gpt-6-preview",
          "text-embedding-3-small",
          "tts-1",
          "whisper-1",
          "dall-e-3",
          "omni-moderation-latest",
          "gpt-4o-realtime-preview",
          "gpt-4o-mini-transcribe",
          "gpt-image-1",
          "babbage-002",
        ],
      })
      // A trailing slash on the configured base URL is fine.
      const vendors = yield* vendorsFor({ openaiBaseUrl: `${fake.url}/` })
      const models = yield* vendors.listModels("openai", key)
      expect(models.map((m) => m.id)).toEqual([
        "gpt-4.1",
        "gpt-4.1-mini-2025-04-14",
        "gpt-5",
        "gpt-6-preview",
        "o3",
      ])
      const byId = new Map(models.map((m) => [m.id, m]))
      expect(byId.get("gpt-4.1-mini-2025-04-14")).toEqual({
        id: "gpt-4.1-mini-2025-04-14",
        name: "GPT-4.1 mini",
        context_window: 1_047_576,
        max_output_tokens: 32_768,
        efforts: [],
        default_effort: "",
      })
      expect(byId.get("gpt-5")).toMatchObject({
        context_window: 400_000,
        max_output_tokens: 128_000,
        efforts: ["minimal", "low", "medium", "high"],
        default_effort: "medium",
      })
      expect(byId.get("o3")).toMatchObject({ efforts: ["low", "medium", "high"], default_effort: "medium" })
      // An unknown chat model: conservative defaults, no efforts.
      expect(byId.get("gpt-6-preview")).toEqual({
        id: "gpt-6-preview",
        name: "gpt-6-preview",
        context_window: 128_000,
        max_output_tokens: 16_384,
        efforts: [],
        default_effort: "",
      })
      expect(fake.requests).toHaveLength(1)
      const [req] = fake.requests
      expect(req?.method).toBe("GET")
      expect(req?.url).toBe("/v1/models")
      expect(req?.headers.authorization).toBe(`Bearer ${KEY}`)
    }),
  )
})

describe("Anthropic catalog", () => {
  it.scoped("follows has_more/last_id through every page and maps the facts", () =>
    Effect.gen(function* () {
      const fake = yield* AnthropicFake.make({
        keys: [KEY],
        models: [
          { id: "claude-opus-4-5-20251101", display_name: "Claude Opus 4.5" },
          { id: "claude-sonnet-4-5-20250929", display_name: "Claude Sonnet 4.5" },
          { id: "claude-opus-4-1-20250805", display_name: "Claude Opus 4.1" },
          { id: "claude-opus-4-20250514", display_name: "Claude Opus 4" },
          { id: "claude-3-5-haiku-20241022", display_name: "Claude Haiku 3.5" },
          { id: "claude-future-9", display_name: "Claude Future 9" },
        ],
      })
      fake.setMaxPageSize(2)
      const vendors = yield* vendorsFor({ anthropicBaseUrl: fake.url })
      const models = yield* vendors.listModels("anthropic", key)
      expect(models.map((m) => m.id)).toEqual([
        "claude-opus-4-5-20251101",
        "claude-sonnet-4-5-20250929",
        "claude-opus-4-1-20250805",
        "claude-opus-4-20250514",
        "claude-3-5-haiku-20241022",
        "claude-future-9",
      ])
      const byId = new Map(models.map((m) => [m.id, m]))
      expect(byId.get("claude-opus-4-1-20250805")).toEqual({
        id: "claude-opus-4-1-20250805",
        name: "Claude Opus 4.1",
        context_window: 200_000,
        max_output_tokens: 32_000,
        efforts: ["low", "medium", "high"],
        default_effort: "",
      })
      expect(byId.get("claude-sonnet-4-5-20250929")?.max_output_tokens).toBe(64_000)
      expect(byId.get("claude-3-5-haiku-20241022")).toMatchObject({ max_output_tokens: 8_192, efforts: [] })
      expect(byId.get("claude-future-9")).toEqual({
        id: "claude-future-9",
        name: "Claude Future 9",
        context_window: 200_000,
        max_output_tokens: 8_192,
        efforts: [],
        default_effort: "",
      })
      // Three pages of two, each after the previous page's last id.
      expect(fake.requests.map((r) => r.query.after_id)).toEqual([
        undefined,
        "claude-sonnet-4-5-20250929",
        "claude-opus-4-20250514",
      ])
      for (const r of fake.requests) {
        expect(r.path).toBe("/v1/models")
        expect(r.headers["x-api-key"]).toBe(KEY)
        expect(r.headers["anthropic-version"]).toBe("2023-06-01")
        expect(r.query.limit).toBe("1000")
      }
    }),
  )
})

describe("paging limit", () => {
  it.scoped(`reads a list of exactly ${maxPages} pages; one page more is VendorUnavailable`, () =>
    Effect.gen(function* () {
      const ids = Array.from({ length: maxPages + 1 }, (_, i) => `claude-x-${i}`)
      const fake = yield* AnthropicFake.make({ keys: [KEY], models: ids.slice(0, maxPages) })
      fake.setMaxPageSize(1)
      const vendors = yield* vendorsFor({ anthropicBaseUrl: fake.url })
      expect((yield* vendors.listModels("anthropic", key)).length).toBe(maxPages)
      fake.setModels(ids)
      const error = failureOf(yield* Effect.exit(vendors.listModels("anthropic", key)))
      expect(error).toMatchObject({ _tag: "VendorUnavailable", vendor: "anthropic" })
      expect(error.message).toContain(`${maxPages} pages`)
    }),
  )
})

describe("layer", () => {
  it.scoped("the exported layer talks HTTP with fetch over the given settings", () =>
    Effect.gen(function* () {
      const fake = yield* GoogleFake.make({ keys: [KEY], models: [{ id: "gemini-2.0-flash" }] })
      const models = yield* Vendors.pipe(
        Effect.flatMap((v) => v.listModels("google", key)),
        Effect.withSpan("listing"),
        Effect.provide(layer.pipe(Layer.provide(VendorSettings.layer({ googleBaseUrl: fake.url })))),
      )
      expect(models.map((m) => m.id)).toEqual(["gemini-2.0-flash"])
      // No tracing headers leave for a vendor, even from inside a span.
      for (const name of ["traceparent", "b3"])
        expect(Object.keys(fake.requests.at(-1)?.headers ?? {})).not.toContain(name)
    }),
  )

  it.effect("reads HANGAR_OPENAI_BASE_URL, _ANTHROPIC_, _GOOGLE_ and HANGAR_VENDOR_TIMEOUT_MS", () =>
    Effect.gen(function* () {
      const settings = yield* VendorSettings.Tag.pipe(
        Effect.provide(VendorSettings.layerFromEnv),
        Effect.withConfigProvider(
          ConfigProvider.fromMap(
            new Map([
              ["HANGAR_OPENAI_BASE_URL", "http://openai.internal"],
              ["HANGAR_ANTHROPIC_BASE_URL", "http://anthropic.internal"],
              ["HANGAR_GOOGLE_BASE_URL", "http://google.internal"],
              ["HANGAR_VENDOR_TIMEOUT_MS", "2500"],
            ]),
          ),
        ),
      )
      expect(settings).toEqual({
        openaiBaseUrl: "http://openai.internal",
        anthropicBaseUrl: "http://anthropic.internal",
        googleBaseUrl: "http://google.internal",
        timeoutMs: 2500,
      })
    }),
  )

  it("defaults to the vendors' public API origins and a 15 s timeout", () => {
    expect(VendorSettings.defaults).toEqual({
      openaiBaseUrl: "https://api.openai.com",
      anthropicBaseUrl: "https://api.anthropic.com",
      googleBaseUrl: "https://generativelanguage.googleapis.com",
      timeoutMs: 15_000,
    })
  })
})

describe("Google catalog", () => {
  it.scoped("follows nextPageToken, keeps text models with generateContent, key only in the header", () =>
    Effect.gen(function* () {
      const fake = yield* GoogleFake.make({
        keys: [KEY],
        models: [
          { id: "gemini-2.0-flash", displayName: "Gemini 2.0 Flash", outputTokenLimit: 8_192 },
          { id: "gemini-2.5-pro", displayName: "Gemini 2.5 Pro", thinking: true },
          { id: "gemini-3-pro-preview", displayName: "Gemini 3 Pro Preview", thinking: true },
          { id: "gemini-embedding-001", supportedGenerationMethods: ["embedContent", "countTextTokens"] },
          { id: "imagen-4.0-generate-001", supportedGenerationMethods: ["predict"] },
          {
            id: "gemini-2.5-flash-preview-tts",
            supportedGenerationMethods: ["generateContent", "countTokens"],
          },
          { id: "gemini-2.5-flash-image", supportedGenerationMethods: ["generateContent"] },
        ],
      })
      fake.setMaxPageSize(2)
      const vendors = yield* vendorsFor({ googleBaseUrl: fake.url })
      const models = yield* vendors.listModels("google", key)
      expect(models).toEqual([
        {
          id: "gemini-2.0-flash",
          name: "Gemini 2.0 Flash",
          context_window: 1_048_576,
          max_output_tokens: 8_192,
          efforts: [],
          default_effort: "",
        },
        {
          id: "gemini-2.5-pro",
          name: "Gemini 2.5 Pro",
          context_window: 1_048_576,
          max_output_tokens: 65_536,
          efforts: ["low", "medium", "high"],
          default_effort: "",
        },
        {
          id: "gemini-3-pro-preview",
          name: "Gemini 3 Pro Preview",
          context_window: 1_048_576,
          max_output_tokens: 65_536,
          efforts: ["low", "high"],
          default_effort: "high",
        },
      ])
      expect(fake.requests).toHaveLength(4)
      expect(fake.requests[0]?.query.pageToken).toBeUndefined()
      expect(fake.requests.slice(1).every((r) => r.query.pageToken !== undefined)).toBe(true)
      for (const r of fake.requests) {
        expect(r.path).toBe("/v1beta/models")
        expect(r.headers["x-goog-api-key"]).toBe(KEY)
        expect(r.query.key).toBeUndefined()
        expectNoCanary(r.url)
      }
    }),
  )
})

// Starts the fake of `vendor` accepting KEY with one model, and a service pointed at it.
const setUp = (vendor: Vendor, timeoutMs?: number) =>
  Effect.gen(function* () {
    const fake =
      vendor === "openai"
        ? yield* OpenAiFake.make({ keys: [KEY], models: ["gpt-4.1"] })
        : vendor === "anthropic"
          ? yield* AnthropicFake.make({ keys: [KEY], models: ["claude-sonnet-4-5-20250929"] })
          : yield* GoogleFake.make({ keys: [KEY], models: [{ id: "gemini-2.5-pro", thinking: true }] })
    const vendors = yield* vendorsFor({
      openaiBaseUrl: fake.url,
      anthropicBaseUrl: fake.url,
      googleBaseUrl: fake.url,
      ...(timeoutMs === undefined ? {} : { timeoutMs }),
    })
    return { fake, vendors }
  })

describe("vendor failures", () => {
  it.scoped("5xx, 429, 529 and 503 are VendorUnavailable with the vendor's words; the next call works", () =>
    Effect.gen(function* () {
      const cases = [
        ["openai", OpenAiFake.serverError(), 500, "The server had an error"],
        ["openai", OpenAiFake.rateLimited(), 429, "Rate limit reached"],
        ["anthropic", AnthropicFake.overloaded(), 529, "Overloaded"],
        ["anthropic", AnthropicFake.apiError(), 500, "Internal server error"],
        ["google", GoogleFake.unavailable(), 503, "The model is overloaded"],
      ] as const
      for (const [vendor, reply, status, words] of cases) {
        const { fake, vendors } = yield* setUp(vendor)
        fake.failNext(1, reply)
        const error = failureOf(yield* Effect.exit(vendors.listModels(vendor, key)))
        expect(error).toMatchObject({ _tag: "VendorUnavailable", vendor, status })
        expect(error.message).toContain(words)
        expect(toApiError(error)).toMatchObject({ code: "vendor_unavailable", status: 502 })
        expect((yield* vendors.listModels(vendor, key)).length).toBe(1)
      }
    }),
  )

  it.scoped("connection refused, a dropped connection, garbage and a wrong shape are VendorUnavailable", () =>
    Effect.gen(function* () {
      const port = yield* closedPort
      for (const vendor of ["openai", "anthropic", "google"] as const) {
        const refused = yield* vendorsFor({
          openaiBaseUrl: `http://127.0.0.1:${port}`,
          anthropicBaseUrl: `http://127.0.0.1:${port}`,
          googleBaseUrl: `http://127.0.0.1:${port}`,
        })
        const error = failureOf(yield* Effect.exit(refused.listModels(vendor, key)))
        expect(error).toMatchObject({ _tag: "VendorUnavailable", vendor, status: 0 })
        expect(error.message).toContain("ECONNREFUSED")

        const { fake, vendors } = yield* setUp(vendor)
        fake.failNext(1, { drop: true })
        expect(failureOf(yield* Effect.exit(vendors.listModels(vendor, key)))).toMatchObject({
          _tag: "VendorUnavailable",
          status: 0,
        })
        fake.failNext(1, { status: 200, text: "<html>hello from a captive portal</html>" })
        const garbage = failureOf(yield* Effect.exit(vendors.listModels(vendor, key)))
        expect(garbage).toMatchObject({
          _tag: "VendorUnavailable",
          status: 200,
          message: "the answer is not JSON",
        })
        fake.failNext(1, { status: 200, json: { data: "nope", models: "nope" } })
        const shape = failureOf(yield* Effect.exit(vendors.listModels(vendor, key)))
        expect(shape).toMatchObject({ _tag: "VendorUnavailable", status: 200 })
        expect(shape.message).toContain("unexpected shape")
        // An HTML error page from a proxy in front of the vendor.
        fake.failNext(1, { status: 502, text: "<html>Bad Gateway</html>" })
        expect(failureOf(yield* Effect.exit(vendors.listModels(vendor, key)))).toMatchObject({
          _tag: "VendorUnavailable",
          status: 502,
          message: "HTTP 502",
        })
      }
    }),
  )

  it.scoped(
    "no answer within the timeout (15 s by default) is VendorUnavailable; at 14.999 s it still waits",
    () =>
      Effect.gen(function* () {
        const { fake, vendors } = yield* setUp("anthropic")
        fake.failNext(1, { hang: true })
        const fiber = yield* Effect.fork(vendors.listModels("anthropic", key))
        yield* fake.awaitRequests(1)
        yield* TestClock.adjust("14999 millis")
        expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
        yield* TestClock.adjust("1 millis")
        const error = failureOf(yield* Fiber.await(fiber))
        expect(error).toMatchObject({
          _tag: "VendorUnavailable",
          vendor: "anthropic",
          status: 0,
          message: "no answer within 15000 ms",
        })
      }),
  )

  it.scoped("the timeout is a setting", () =>
    Effect.gen(function* () {
      const { fake, vendors } = yield* setUp("google", 50)
      fake.failNext(1, { hang: true })
      const fiber = yield* Effect.fork(vendors.listModels("google", key))
      yield* fake.awaitRequests(1)
      yield* TestClock.adjust("49 millis")
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      yield* TestClock.adjust("1 millis")
      expect(failureOf(yield* Fiber.await(fiber)).message).toBe("no answer within 50 ms")
    }),
  )
})

describe("rejected keys", () => {
  it.scoped("each vendor's refusal is VendorRejectedKey in its own words, and maps to 400 naming key", () =>
    Effect.gen(function* () {
      const wrong = Redacted.make("sk-wrong-key-000000000000000000")
      const cases = [
        ["openai", 401, "Incorrect API key provided"],
        ["anthropic", 401, "invalid x-api-key"],
        ["google", 400, "API key not valid. Please pass a valid API key."],
      ] as const
      for (const [vendor, status, words] of cases) {
        const { vendors } = yield* setUp(vendor)
        const error = failureOf(yield* Effect.exit(vendors.listModels(vendor, wrong)))
        expect(error).toMatchObject({ _tag: "VendorRejectedKey", vendor, status })
        expect(error.message).toContain(words)
        expect(error.message).not.toContain("sk-wrong")
        const api = toApiError(error)
        expect(api).toMatchObject({ code: "invalid_request", status: 400 })
        expect(api.message.startsWith("key: ")).toBe(true)
      }
    }),
  )

  it.scoped(
    "Google's 403 PERMISSION_DENIED (API not enabled for the key's project) is a rejected key too",
    () =>
      Effect.gen(function* () {
        const { fake, vendors } = yield* setUp("google")
        fake.failNext(
          1,
          GoogleFake.error(
            403,
            "PERMISSION_DENIED",
            "Generative Language API has not been used in project 123 before or it is disabled.",
          ),
        )
        const error = failureOf(yield* Effect.exit(vendors.listModels("google", key)))
        expect(error).toMatchObject({ _tag: "VendorRejectedKey", status: 403 })
        expect(error.message).toContain("has not been used in project")
      }),
  )
})

describe("the key stays secret", () => {
  it.scoped("a canary key appears in no error, log line or request URL, on any path", () =>
    Effect.gen(function* () {
      const lines: Array<string> = []
      const errors: Array<VendorError> = []
      const port = yield* closedPort
      for (const vendor of ["openai", "anthropic", "google"] as const) {
        // The fake accepts another key, so the canary is refused and echoed as each vendor does.
        const fake =
          vendor === "openai"
            ? yield* OpenAiFake.make({ keys: ["other"] })
            : vendor === "anthropic"
              ? yield* AnthropicFake.make({ keys: ["other"] })
              : yield* GoogleFake.make({ keys: ["other"] })
        const vendors = yield* vendorsFor({
          openaiBaseUrl: fake.url,
          anthropicBaseUrl: fake.url,
          googleBaseUrl: fake.url,
        })
        const refused = yield* vendorsFor({
          openaiBaseUrl: `http://127.0.0.1:${port}`,
          anthropicBaseUrl: `http://127.0.0.1:${port}`,
          googleBaseUrl: `http://127.0.0.1:${port}`,
        })
        const attempts: Array<Effect.Effect<unknown, VendorError>> = [
          vendors.listModels(vendor, key),
          vendors.checkKey(vendor, key, "some-model"),
          refused.listModels(vendor, key),
        ]
        fake.failNext(1, { status: 500, text: "boom" })
        attempts.unshift(vendors.listModels(vendor, key))
        for (const attempt of attempts) {
          const exit = yield* Effect.exit(
            attempt.pipe(Effect.provide(Log.layerCollect(lines)), Logger.withMinimumLogLevel(LogLevel.All)),
          )
          errors.push(failureOf(exit))
        }
        expect(fake.requests.length).toBe(3)
        for (const r of fake.requests) expectNoCanary(r.url)
      }
      expect(errors.map((e) => e._tag)).toContain("VendorRejectedKey")
      expect(errors.map((e) => e._tag)).toContain("VendorUnavailable")
      for (const error of errors) {
        expectNoCanary(String(error))
        expectNoCanary(JSON.stringify(error))
        expectNoCanary(toApiError(error).message)
      }
      expect(lines.length).toBeGreaterThanOrEqual(errors.length)
      for (const line of lines) expectNoCanary(line)
      // OpenAI echoed a masked copy of the canary; what we kept says where it was.
      const openAi = errors.find((e) => e.vendor === "openai" && e._tag === "VendorRejectedKey")
      expect(openAi?.message).toContain("Incorrect API key provided: <key>")
    }),
  )
})

describe("checkKey", () => {
  it.scoped("answers the model's entry when the key lists it, else UnknownModel naming the model", () =>
    Effect.gen(function* () {
      const fake = yield* OpenAiFake.make({ keys: [KEY], models: ["gpt-5", "text-embedding-3-large"] })
      const vendors = yield* vendorsFor({ openaiBaseUrl: fake.url })
      const entry = yield* vendors.checkKey("openai", key, "gpt-5")
      expect(entry).toMatchObject({ id: "gpt-5", default_effort: "medium" })

      for (const model of ["gpt-4o", "text-embedding-3-large"]) {
        const error = failureOf(yield* Effect.exit(vendors.checkKey("openai", key, model)))
        expect(error).toMatchObject({ _tag: "UnknownModel", vendor: "openai", model })
        expect(error.message).toContain(model)
        const api = toApiError(error)
        expect(api).toMatchObject({ code: "invalid_request", status: 400 })
        expect(api.message.startsWith("model.model: ")).toBe(true)
      }

      const wrong = failureOf(yield* Effect.exit(vendors.checkKey("openai", Redacted.make("nope"), "gpt-5")))
      expect(wrong._tag).toBe("VendorRejectedKey")
    }),
  )
})

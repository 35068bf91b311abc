/**
 * The model vendors behind one service: read a key's model catalog (`POST /v1/catalog`) and check
 * a key and model when a provider is published. The agent loop adds its chat calls here later.
 *
 * Decision: no vendor SDKs. The official SDKs (`openai` 7, `@anthropic-ai/sdk`, `@google/genai`)
 * now require Node ≥ 22, and `@effect/ai-google` 0.15 pins older `@effect/ai`/`@effect/platform`
 * than `@effect/ai-openai`/`-anthropic`, so they cannot be installed together with our effect 3.22
 * and platform 0.97. We talk to the vendors with our own thin clients over `@effect/platform`'s
 * `HttpClient` (`FetchHttpClient.layer`), decoding only the fields we use with `effect/Schema`:
 * one file per vendor (`OpenAi.ts`, `Anthropic.ts`, `Google.ts`), this service in front.
 *
 * The key is `Redacted` end to end: it is opened only into the request header, never put in a URL,
 * scrubbed from vendors' messages, and never logged or carried by an error.
 */
import { FetchHttpClient, HttpClient } from "@effect/platform"
import { Context, Effect, Layer, type Redacted } from "effect"
import type { CatalogModel, Vendor } from "../../schema/Provider.ts"
import { defineSettings, env } from "../Config.ts"
import * as Anthropic from "./Anthropic.ts"
import { UnknownModel, type VendorRejectedKey, type VendorUnavailable, vendorLabel } from "./Errors.ts"
import * as Google from "./Google.ts"
import type { Endpoint } from "./Http.ts"
import * as OpenAi from "./OpenAi.ts"

/** Where the vendors are and how long to wait for them. */
export interface VendorSettingsShape {
  /** OpenAI's API origin (paths start at `/v1`); an operator may point it at a proxy. */
  readonly openaiBaseUrl: string
  /** Anthropic's API origin (paths start at `/v1`). */
  readonly anthropicBaseUrl: string
  /** Google's Gemini API origin (paths start at `/v1beta`). */
  readonly googleBaseUrl: string
  /** How long one request may take before the vendor counts as unavailable. */
  readonly timeoutMs: number
}

/** The vendor layer's settings. */
export const VendorSettings = defineSettings(
  "hangar/VendorSettings",
  {
    openaiBaseUrl: "https://api.openai.com",
    anthropicBaseUrl: "https://api.anthropic.com",
    googleBaseUrl: "https://generativelanguage.googleapis.com",
    timeoutMs: 15_000,
  } as VendorSettingsShape,
  (d) => ({
    openaiBaseUrl: env.string("OPENAI_BASE_URL", d.openaiBaseUrl),
    anthropicBaseUrl: env.string("ANTHROPIC_BASE_URL", d.anthropicBaseUrl),
    googleBaseUrl: env.string("GOOGLE_BASE_URL", d.googleBaseUrl),
    timeoutMs: env.integer("VENDOR_TIMEOUT_MS", d.timeoutMs),
  }),
)

/** What the vendor layer offers. */
export interface VendorsService {
  /**
   * The chat models `key` may use at `vendor`, with context window, output limit and efforts.
   * Reads the vendor's list every time (no cache: a key's access changes, and the key is kept
   * nowhere). Fails with `VendorRejectedKey` when the vendor refuses the key, `VendorUnavailable`
   * for anything else that prevents an answer.
   */
  readonly listModels: (
    vendor: Vendor,
    key: Redacted.Redacted<string>,
  ) => Effect.Effect<ReadonlyArray<CatalogModel>, VendorRejectedKey | VendorUnavailable>
  /**
   * Checks, for publishing a provider, that `key` lists models at `vendor` and that `model` is
   * one of them; answers the model's catalog entry (for checking the effort and output limit).
   * Fails as `listModels` does, or with `UnknownModel` naming the model.
   */
  readonly checkKey: (
    vendor: Vendor,
    key: Redacted.Redacted<string>,
    model: string,
  ) => Effect.Effect<CatalogModel, VendorRejectedKey | VendorUnavailable | UnknownModel>
}

/** The vendor layer. */
export class Vendors extends Context.Tag("hangar/Vendors")<Vendors, VendorsService>() {}

/** Builds the service over an HTTP client and the settings. */
export const make = Effect.gen(function* () {
  // No `traceparent`/`b3` headers: our trace ids are nothing a vendor should see (platform adds
  // them to every request by default).
  const http = (yield* HttpClient.HttpClient).pipe(HttpClient.withTracerPropagation(false))
  const settings = yield* VendorSettings.Tag

  const baseUrl: Record<Vendor, string> = {
    openai: settings.openaiBaseUrl,
    anthropic: settings.anthropicBaseUrl,
    google: settings.googleBaseUrl,
  }
  const clients = { openai: OpenAi, anthropic: Anthropic, google: Google } as const

  const listModels = (vendor: Vendor, key: Redacted.Redacted<string>) => {
    const endpoint: Endpoint = { baseUrl: baseUrl[vendor], key, timeoutMs: settings.timeoutMs }
    return clients[vendor].listModels(http, endpoint).pipe(
      Effect.tap((models) =>
        Effect.logDebug("vendor catalog read").pipe(Effect.annotateLogs({ models: models.length })),
      ),
      // The error carries the vendor's scrubbed words and never the key; the logger prints tag and message.
      Effect.tapError((error) => Effect.logWarning("vendor catalog failed", error)),
      Effect.annotateLogs({ vendor }),
      Effect.withLogSpan("vendor_catalog"),
    )
  }

  const checkKey = (vendor: Vendor, key: Redacted.Redacted<string>, model: string) =>
    listModels(vendor, key).pipe(
      Effect.flatMap((models) => {
        const found = models.find((m) => m.id === model)
        return found
          ? Effect.succeed(found)
          : Effect.fail(
              new UnknownModel({
                vendor,
                model,
                message: `${model} is not a chat model in ${vendorLabel[vendor]}'s catalog for this key`,
              }),
            )
      }),
    )

  return { listModels, checkKey } satisfies VendorsService
})

/** The service over the given settings, talking HTTP with `fetch`. */
export const layer = Layer.effect(Vendors, make).pipe(Layer.provide(FetchHttpClient.layer))

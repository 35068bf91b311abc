/**
 * A fake of Google's Gemini API: `GET /v1beta/models` with `pageSize`/`pageToken` paging and
 * `nextPageToken`, the key checked from `x-goog-api-key` (or `?key=`, which the real API also
 * takes), errors in Google's `{error: {code, message, status, details}}` shape (a wrong key is 400
 * `INVALID_ARGUMENT` with an `ErrorInfo` of reason `API_KEY_INVALID`; no key at all is 403
 * `PERMISSION_DENIED`). `POST /v1beta/models/{model}:generateContent` answers only from its queue
 * (`enqueue("generateContent", …)`) for the agent loop's tests.
 */
import type { Scope } from "effect"
import { Effect } from "effect"
import { type FakeControls, pageOf, type Reply, start } from "./FakeServer.ts"

/** A model as the fake lists it; `name` without the `models/` prefix is filled in. */
export interface GoogleModel {
  readonly id: string
  readonly displayName?: string
  readonly inputTokenLimit?: number
  readonly outputTokenLimit?: number
  readonly supportedGenerationMethods?: ReadonlyArray<string>
  readonly thinking?: boolean
}

/** The Google fake's controls. */
export interface GoogleFake extends FakeControls {
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
          path: /^\/v1beta\/models\/([^/:]+):generateContent$/,
          handle: () => noScript("generateContent"),
        },
      ],
    })
    return {
      ...controls,
      setModels: (list: ReadonlyArray<GoogleModel>) => {
        models = list
      },
      setMaxPageSize: (n: number) => {
        maxPageSize = n
      },
    }
  })

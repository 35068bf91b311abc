/**
 * A fake of OpenAI's API: `GET /v1/models` as the real one answers it, the key checked from
 * `Authorization: Bearer`, errors in OpenAI's `{error: {message, type, param, code}}` shape (a
 * wrong key is 401 `invalid_api_key` with the key echoed masked, as the real API does).
 * `POST /v1/responses` and `POST /v1/chat/completions` answer only from their queues
 * (`enqueue("responses", …)`, `enqueue("chat.completions", …)`) for the agent loop's tests.
 */
import type { Scope } from "effect"
import { Effect } from "effect"
import { type FakeControls, type Reply, start } from "./FakeServer.ts"

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
}

/** An OpenAI error reply. */
export const error = (status: number, message: string, type: string, code: string | null = null): Reply => ({
  status,
  json: { error: { message, type, param: null, code } },
})

/** 500 as OpenAI sends it during an outage. */
export const serverError = (): Reply =>
  error(500, "The server had an error while processing your request. Sorry about that!", "server_error")

/** 429 as OpenAI sends it when the key's rate limit is reached. */
export const rateLimited = (): Reply =>
  error(429, "Rate limit reached for requests. Please try again in 20ms.", "requests", "rate_limit_exceeded")

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
        { name: "responses", method: "POST", path: /^\/v1\/responses$/, handle: () => noScript("responses") },
        {
          name: "chat.completions",
          method: "POST",
          path: /^\/v1\/chat\/completions$/,
          handle: () => noScript("chat.completions"),
        },
      ],
    })
    return { ...controls, setModels }
  })

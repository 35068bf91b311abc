/**
 * A fake of Anthropic's API: `GET /v1/models` with `limit`/`after_id`/`before_id` paging and
 * `has_more`/`first_id`/`last_id`, the key checked from `x-api-key` and `anthropic-version`
 * required, errors in Anthropic's `{type: "error", error: {type, message}}` shape (a wrong key is
 * 401 `authentication_error` "invalid x-api-key"). `POST /v1/messages` answers only from its queue
 * (`enqueue("messages", …)`) for the agent loop's tests.
 */
import type { Scope } from "effect"
import { Effect } from "effect"
import { type FakeControls, pageOf, type Reply, start } from "./FakeServer.ts"

/** A model as the fake lists it. */
export interface AnthropicModel {
  readonly id: string
  readonly display_name?: string
  readonly created_at?: string
}

/** The Anthropic fake's controls. */
export interface AnthropicFake extends FakeControls {
  /** Replaces the models `GET /v1/models` lists (in this order: the real API lists newest first). */
  readonly setModels: (models: ReadonlyArray<string | AnthropicModel>) => void
  /** The most models one page holds, whatever `limit` asks (the real API's is 1000). */
  readonly setMaxPageSize: (n: number) => void
}

/** An Anthropic error reply. */
export const error = (status: number, type: string, message: string): Reply => ({
  status,
  json: { type: "error", error: { type, message }, request_id: "req_fake" },
})

/** 529 as Anthropic sends it when overloaded. */
export const overloaded = (): Reply => error(529, "overloaded_error", "Overloaded")

/** 500 as Anthropic sends it on an internal error. */
export const apiError = (): Reply => error(500, "api_error", "Internal server error")

const noScript = (route: string): Reply =>
  error(500, "api_error", `the fake has no scripted reply for ${route}`)

/** Starts the fake accepting `keys`, listing `models`. */
export const make = (options: {
  readonly keys: ReadonlyArray<string>
  readonly models?: ReadonlyArray<string | AnthropicModel>
}): Effect.Effect<AnthropicFake, never, Scope.Scope> =>
  Effect.gen(function* () {
    const keys = new Set(options.keys)
    let models: ReadonlyArray<AnthropicModel> = []
    let maxPageSize = 1000
    const setModels = (list: ReadonlyArray<string | AnthropicModel>) => {
      models = list.map((m) => (typeof m === "string" ? { id: m } : m))
    }
    setModels(options.models ?? [])
    const controls = yield* start({
      authorize: (req) => {
        const key = req.headers["x-api-key"]
        if (key === undefined) return error(401, "authentication_error", "x-api-key header is required")
        if (!keys.has(key)) return error(401, "authentication_error", "invalid x-api-key")
        if (req.headers["anthropic-version"] === undefined) {
          return error(400, "invalid_request_error", "anthropic-version: header is required")
        }
        return undefined
      },
      notFound: () => error(404, "not_found_error", "Not found"),
      routes: [
        {
          name: "models",
          method: "GET",
          path: /^\/v1\/models$/,
          handle: (req) => {
            const limit = Number(req.query.limit ?? "20")
            if (!Number.isInteger(limit) || limit < 1 || limit > 1000) {
              return error(400, "invalid_request_error", "limit: Input should be less than or equal to 1000")
            }
            const size = Math.min(limit, maxPageSize)
            const after = req.query.after_id
            const start = after === undefined ? 0 : models.findIndex((m) => m.id === after) + 1
            if (after !== undefined && start === 0) {
              return error(400, "invalid_request_error", `after_id: unknown model ${after}`)
            }
            const { page, more } = pageOf(models, start, size)
            return {
              json: {
                data: page.map((m) => ({
                  type: "model",
                  id: m.id,
                  display_name: m.display_name ?? m.id,
                  created_at: m.created_at ?? "2025-01-01T00:00:00Z",
                })),
                has_more: more,
                first_id: page[0]?.id ?? null,
                last_id: page.at(-1)?.id ?? null,
              },
            }
          },
        },
        { name: "messages", method: "POST", path: /^\/v1\/messages$/, handle: () => noScript("messages") },
      ],
    })
    return {
      ...controls,
      setModels,
      setMaxPageSize: (n: number) => {
        maxPageSize = n
      },
    }
  })

/**
 * The vendor fakes' scripting, checked with plain `fetch`: queued replies per route (what the
 * agent loop's tests will use for the chat endpoints), `failNext` counting, delays, event streams,
 * a dropped connection, the auth each vendor checks, and request recording.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import * as AnthropicFake from "./AnthropicFake.ts"
import * as GoogleFake from "./GoogleFake.ts"
import * as OpenAiFake from "./OpenAiFake.ts"

const call = (url: string, init?: RequestInit) =>
  Effect.promise(async () => {
    const res = await fetch(url, init)
    return { status: res.status, type: res.headers.get("content-type") ?? "", text: await res.text() }
  })

describe("vendor fakes", () => {
  it.scoped("chat routes answer from their queue in order, then say nothing is scripted", () =>
    Effect.gen(function* () {
      const fake = yield* AnthropicFake.make({ keys: ["k"] })
      fake.enqueue(
        "messages",
        { json: { id: "msg_1", type: "message" } },
        { status: 529, json: { type: "error", error: { type: "overloaded_error", message: "Overloaded" } } },
      )
      const headers = {
        "x-api-key": "k",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
      }
      const post = () => call(`${fake.url}/v1/messages`, { method: "POST", headers, body: '{"model":"m"}' })
      expect(yield* post()).toMatchObject({ status: 200, text: '{"id":"msg_1","type":"message"}' })
      expect((yield* post()).status).toBe(529)
      const third = yield* post()
      expect(third.status).toBe(500)
      expect(JSON.parse(third.text)).toMatchObject({ type: "error", error: { type: "api_error" } })
      expect(fake.requests.map((r) => [r.method, r.path, r.body])).toEqual([
        ["POST", "/v1/messages", '{"model":"m"}'],
        ["POST", "/v1/messages", '{"model":"m"}'],
        ["POST", "/v1/messages", '{"model":"m"}'],
      ])
    }),
  )

  it.scoped("failNext answers exactly n requests, before the key check; the rest are normal", () =>
    Effect.gen(function* () {
      const fake = yield* OpenAiFake.make({ keys: ["k"], models: ["gpt-5"] })
      fake.failNext(2, OpenAiFake.serverError())
      const get = (key: string) =>
        call(`${fake.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } })
      expect((yield* get("wrong")).status).toBe(500)
      expect((yield* get("k")).status).toBe(500)
      const ok = yield* get("k")
      expect(ok.status).toBe(200)
      expect(JSON.parse(ok.text)).toEqual({
        object: "list",
        data: [{ id: "gpt-5", object: "model", created: 1_700_000_000, owned_by: "system" }],
      })
      const wrong = yield* get("sk-wrong-000000000000")
      expect(wrong.status).toBe(401)
      expect(JSON.parse(wrong.text)).toMatchObject({
        error: { type: "invalid_request_error", code: "invalid_api_key", param: null },
      })
      expect(wrong.text).not.toContain("sk-wrong-000000000000")
    }),
  )

  it.scoped("OpenAI answers an unknown path with its 404 shape; the responses route streams events", () =>
    Effect.gen(function* () {
      const fake = yield* OpenAiFake.make({ keys: ["k"] })
      const auth = { authorization: "Bearer k" }
      const missing = yield* call(`${fake.url}/v1/nothing`, { headers: auth })
      expect(missing.status).toBe(404)
      expect(JSON.parse(missing.text).error.message).toBe("Invalid URL (GET /v1/nothing)")
      fake.enqueue("responses", {
        sse: [
          { event: "response.created", data: { type: "response.created" } },
          { event: "response.completed", data: { type: "response.completed" } },
        ],
      })
      const streamed = yield* call(`${fake.url}/v1/responses`, { method: "POST", headers: auth, body: "{}" })
      expect(streamed.type).toBe("text/event-stream")
      expect(streamed.text).toBe(
        'event: response.created\ndata: {"type":"response.created"}\n\n' +
          'event: response.completed\ndata: {"type":"response.completed"}\n\n',
      )
    }),
  )

  it.scoped("Anthropic requires anthropic-version and pages with limit/after_id", () =>
    Effect.gen(function* () {
      const fake = yield* AnthropicFake.make({ keys: ["k"], models: ["a", "b", "c"] })
      const noVersion = yield* call(`${fake.url}/v1/models`, { headers: { "x-api-key": "k" } })
      expect(noVersion.status).toBe(400)
      const headers = { "x-api-key": "k", "anthropic-version": "2023-06-01" }
      const first = JSON.parse((yield* call(`${fake.url}/v1/models?limit=2`, { headers })).text)
      expect(first).toMatchObject({ has_more: true, first_id: "a", last_id: "b" })
      const second = JSON.parse((yield* call(`${fake.url}/v1/models?limit=2&after_id=b`, { headers })).text)
      expect(second).toMatchObject({ has_more: false, first_id: "c", last_id: "c" })
      expect(second.data[0]).toMatchObject({ type: "model", id: "c", display_name: "c" })
      // The real API's limit is 1 to 1000.
      expect((yield* call(`${fake.url}/v1/models?limit=1000`, { headers })).status).toBe(200)
      expect((yield* call(`${fake.url}/v1/models?limit=1001`, { headers })).status).toBe(400)
      const wrong = yield* call(`${fake.url}/v1/models`, { headers: { ...headers, "x-api-key": "x" } })
      expect(wrong.status).toBe(401)
      expect(JSON.parse(wrong.text)).toEqual({
        type: "error",
        error: { type: "authentication_error", message: "invalid x-api-key" },
        request_id: "req_fake",
      })
    }),
  )

  it.scoped("Google takes the key as header or ?key=, refuses a wrong one with API_KEY_INVALID", () =>
    Effect.gen(function* () {
      const fake = yield* GoogleFake.make({ keys: ["k"], models: [{ id: "gemini-2.5-pro" }] })
      expect((yield* call(`${fake.url}/v1beta/models?key=k`)).status).toBe(200)
      expect((yield* call(`${fake.url}/v1beta/models`, { headers: { "x-goog-api-key": "k" } })).status).toBe(
        200,
      )
      const wrong = yield* call(`${fake.url}/v1beta/models`, { headers: { "x-goog-api-key": "x" } })
      expect(wrong.status).toBe(400)
      const body = JSON.parse(wrong.text)
      expect(body.error).toMatchObject({ code: 400, status: "INVALID_ARGUMENT" })
      expect(body.error.details[0]).toMatchObject({ reason: "API_KEY_INVALID" })
      expect((yield* call(`${fake.url}/v1beta/models`)).status).toBe(403)
      fake.enqueue("generateContent", { json: { candidates: [] } })
      const generated = yield* call(`${fake.url}/v1beta/models/gemini-2.5-pro:generateContent`, {
        method: "POST",
        headers: { "x-goog-api-key": "k" },
        body: "{}",
      })
      expect(generated).toMatchObject({ status: 200, text: '{"candidates":[]}' })
    }),
  )

  it.scoped("delays answers, drops connections, and awaitRequests sees requests in flight", () =>
    Effect.gen(function* () {
      const fake = yield* OpenAiFake.make({ keys: ["k"], models: ["gpt-5"] })
      const headers = { authorization: "Bearer k" }
      fake.delay(30)
      const slow = yield* Effect.fork(call(`${fake.url}/v1/models`, { headers }))
      yield* fake.awaitRequests(1)
      expect(fake.requests).toHaveLength(1)
      expect((yield* slow.await)._tag).toBe("Success")
      fake.delay(0)
      fake.failNext(1, { drop: true })
      const dropped = yield* Effect.exit(call(`${fake.url}/v1/models`, { headers }))
      expect(dropped._tag).toBe("Failure")
    }),
  )
})

/**
 * The vendor fakes' scripting, checked with plain `fetch`: queued replies per route (what the
 * agent loop's tests will use for the chat endpoints), `failNext` counting, delays, event streams,
 * a dropped connection, the auth each vendor checks, request recording, the chat routes'
 * validation of malformed requests, and the chat scripting helpers (`replyText`,
 * `replyToolCalls`, `replyError`, `chats`). How the clients read these answers is checked in
 * `core/vendors/Chat.test.ts`.
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

describe("the Anthropic fake's prompt cache", () => {
  it("reads the longest prefix an earlier breakpoint cached, writes up to its own, and not under 1,024 tokens", () => {
    const cache = AnthropicFake.promptCache()
    const big = { type: "text", text: "x".repeat(8000) } // 2,000+ tokens
    const mark = (b: object) => ({ ...b, cache_control: { type: "ephemeral" } })
    const first = cache({
      system: [mark(big)],
      messages: [{ role: "user", content: [mark({ type: "text", text: "go" })] }],
    })
    expect(first.read).toBe(0)
    expect(first.write).toBeGreaterThan(2000)
    expect(first.input).toBe(0)
    const second = cache({
      system: [mark(big)],
      messages: [
        { role: "user", content: [{ type: "text", text: "go" }] },
        { role: "assistant", content: [{ type: "text", text: "ok" }] },
        { role: "user", content: [mark({ type: "text", text: "more" })] },
      ],
    })
    // The whole first prompt is read; what came after it is written.
    expect(second.read).toBe(first.write)
    expect(second.write).toBeGreaterThan(0)
    expect(second.input).toBe(0)
    // Without breakpoints nothing is read or written; a small prefix is not cached.
    expect(AnthropicFake.promptCache()({ system: [big], messages: [] })).toMatchObject({ read: 0, write: 0 })
    const small = AnthropicFake.promptCache()
    small({ system: [mark({ type: "text", text: "short" })], messages: [] })
    expect(small({ system: [mark({ type: "text", text: "short" })], messages: [] }).read).toBe(0)
  })
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
      const body = '{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}'
      const post = () => call(`${fake.url}/v1/messages`, { method: "POST", headers, body })
      expect(yield* post()).toMatchObject({ status: 200, text: '{"id":"msg_1","type":"message"}' })
      expect((yield* post()).status).toBe(529)
      const third = yield* post()
      expect(third.status).toBe(500)
      expect(JSON.parse(third.text)).toMatchObject({ type: "error", error: { type: "api_error" } })
      expect(fake.requests.map((r) => [r.method, r.path, r.body])).toEqual([
        ["POST", "/v1/messages", body],
        ["POST", "/v1/messages", body],
        ["POST", "/v1/messages", body],
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
      const streamed = yield* call(`${fake.url}/v1/responses`, {
        method: "POST",
        headers: auth,
        body: '{"model":"gpt-5","input":[]}',
      })
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

  it.scoped("Anthropic and Google refuse a body field their API does not know, in their own words", () =>
    Effect.gen(function* () {
      const anthropic = yield* AnthropicFake.make({ keys: ["k"] })
      const a = yield* call(`${anthropic.url}/v1/messages`, {
        method: "POST",
        headers: { "x-api-key": "k", "anthropic-version": "2023-06-01", "content-type": "application/json" },
        body: JSON.stringify({
          model: "m",
          max_tokens: 5,
          messages: [{ role: "user", content: "hi" }],
          cache: true,
        }),
      })
      expect(a.status).toBe(400)
      expect(JSON.parse(a.text)).toMatchObject({
        type: "error",
        error: { type: "invalid_request_error", message: "cache: Extra inputs are not permitted" },
      })
      const google = yield* GoogleFake.make({ keys: ["k"] })
      const g = yield* call(`${google.url}/v1beta/models/gemini-2.5-pro:generateContent`, {
        method: "POST",
        headers: { "x-goog-api-key": "k", "content-type": "application/json" },
        body: JSON.stringify({ contents: [{ role: "user", parts: [{ text: "hi" }] }], tool_config: {} }),
      })
      expect(g.status).toBe(400)
      expect(JSON.parse(g.text).error).toMatchObject({
        status: "INVALID_ARGUMENT",
        message: expect.stringContaining('Unknown name "tool_config"'),
      })
    }),
  )

  it.scoped("Google refuses search beside functions unless a Gemini 3 model opts in, as Gemini does", () =>
    Effect.gen(function* () {
      const fake = yield* GoogleFake.make({ keys: ["k"] })
      const post = (model: string, toolConfig?: unknown) => {
        fake.replyText("ok")
        return call(`${fake.url}/v1beta/models/${model}:generateContent`, {
          method: "POST",
          headers: { "x-goog-api-key": "k", "content-type": "application/json" },
          body: JSON.stringify({
            contents: [{ role: "user", parts: [{ text: "hi" }] }],
            tools: [{ functionDeclarations: [{ name: "f", description: "d" }] }, { googleSearch: {} }],
            ...(toolConfig === undefined ? {} : { toolConfig }),
          }),
        })
      }
      const old = yield* post("gemini-2.5-pro")
      expect(old.status).toBe(400)
      expect(JSON.parse(old.text)).toMatchObject({
        error: {
          code: 400,
          status: "INVALID_ARGUMENT",
          message: "Tool use with function calling is unsupported",
        },
      })
      expect((yield* post("gemini-2.5-pro", { includeServerSideToolInvocations: true })).status).toBe(400)
      expect((yield* post("gemini-3-pro-preview")).status).toBe(400)
      expect((yield* post("gemini-3-pro-preview", { includeServerSideToolInvocations: true })).status).toBe(
        200,
      )
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
        body: '{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}',
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

  it.scoped("chat routes refuse malformed requests as the vendors do, before the queue", () =>
    Effect.gen(function* () {
      const openai = yield* OpenAiFake.make({ keys: ["k"] })
      openai.replyText("never sent")
      const orphan = yield* call(`${openai.url}/v1/responses`, {
        method: "POST",
        headers: { authorization: "Bearer k" },
        body: JSON.stringify({
          model: "gpt-5",
          input: [{ type: "function_call_output", call_id: "c1", output: "x" }],
        }),
      })
      expect(orphan.status).toBe(400)
      expect(JSON.parse(orphan.text).error.message).toBe(
        "No tool call found for function call output with call_id c1.",
      )
      const tooFew = yield* call(`${openai.url}/v1/responses`, {
        method: "POST",
        headers: { authorization: "Bearer k" },
        body: JSON.stringify({ model: "gpt-5", input: [], max_output_tokens: 15 }),
      })
      expect(tooFew.status).toBe(400)
      expect(JSON.parse(tooFew.text).error).toMatchObject({
        param: "max_output_tokens",
        code: "integer_below_min_value",
      })

      const anthropic = yield* AnthropicFake.make({ keys: ["k"] })
      const headers = { "x-api-key": "k", "anthropic-version": "2023-06-01" }
      const post = (body: unknown) =>
        call(`${anthropic.url}/v1/messages`, { method: "POST", headers, body: JSON.stringify(body) })
      const user = { role: "user", content: "hi" }
      expect((yield* post({ model: "m", messages: [user] })).status).toBe(400)
      const thinking = yield* post({
        model: "m",
        max_tokens: 2000,
        messages: [user],
        thinking: { type: "enabled", budget_tokens: 4096 },
      })
      expect(JSON.parse(thinking.text).error.message).toContain("budget_tokens")
      const unanswered = yield* post({
        model: "m",
        max_tokens: 10,
        messages: [
          user,
          { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "bash", input: {} }] },
          user,
        ],
      })
      expect(JSON.parse(unanswered.text).error.message).toContain("without `tool_result` blocks")

      const google = yield* GoogleFake.make({ keys: ["k"] })
      const mismatch = yield* call(`${google.url}/v1beta/models/gemini-2.5-pro:generateContent`, {
        method: "POST",
        headers: { "x-goog-api-key": "k" },
        body: JSON.stringify({
          contents: [
            { role: "user", parts: [{ text: "hi" }] },
            {
              role: "model",
              parts: [{ functionCall: { name: "a", args: {} } }, { functionCall: { name: "b", args: {} } }],
            },
            { role: "user", parts: [{ functionResponse: { name: "a", response: { output: "" } } }] },
          ],
        }),
      })
      expect(mismatch.status).toBe(400)
      expect(JSON.parse(mismatch.text).error.message).toContain("number of function response parts")
    }),
  )

  it.scoped("the scripting helpers answer in each vendor's format and chats() reads what was sent", () =>
    Effect.gen(function* () {
      const openai = yield* OpenAiFake.make({ keys: ["k"] })
      openai.replyToolCalls([{ name: "bash", arguments: { command: "ls" }, id: "call_x" }], {
        input_tokens: 10,
        cache_read_tokens: 4,
        output_tokens: 3,
        web_searches: 1,
      })
      openai.replyError(429, OpenAiFake.quotaBody())
      const body = {
        model: "gpt-5",
        instructions: "sys",
        input: [
          { role: "user", content: [{ type: "input_text", text: "do it" }] },
          { type: "function_call", call_id: "c0", name: "screenshot", arguments: "{}" },
          {
            type: "function_call_output",
            call_id: "c0",
            output: [{ type: "input_image", image_url: "data:image/png;base64,AAAA" }],
          },
        ],
        tools: [{ type: "function", name: "bash" }, { type: "web_search" }],
      }
      const post = () =>
        call(`${openai.url}/v1/responses`, {
          method: "POST",
          headers: { authorization: "Bearer k" },
          body: JSON.stringify(body),
        })
      const first = JSON.parse((yield* post()).text)
      expect(first.output.map((o: { type: string }) => o.type)).toEqual(["web_search_call", "function_call"])
      expect(first.output[1]).toMatchObject({
        call_id: "call_x",
        name: "bash",
        arguments: '{"command":"ls"}',
      })
      expect(first.usage).toMatchObject({
        input_tokens: 14,
        input_tokens_details: { cached_tokens: 4 },
        output_tokens: 3,
      })
      const second = yield* post()
      expect(second.status).toBe(429)
      expect(JSON.parse(second.text).error.code).toBe("insufficient_quota")
      expect(openai.lastChat()).toMatchObject({
        model: "gpt-5",
        system: "sys",
        userTexts: ["do it"],
        toolResults: [{ id: "c0", text: "", images: ["AAAA"], isError: false }],
        images: ["AAAA"],
        tools: ["bash"],
        webSearch: true,
      })
      expect(openai.chats()).toHaveLength(2)
    }),
  )
})

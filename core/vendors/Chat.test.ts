/**
 * The chat clients (`Chat` over `ChatClient.layer`) against the three vendor fakes over real HTTP:
 * for each vendor a text reply, a tool call, a tool result with an image in the vendor's format,
 * the system prompt and first user message word for word, usage mapping with web searches, vendor
 * state sent back on the next turn, effort and output-limit mapping, every error class at its
 * status boundary (with the key never in an error), the chat timeout, and compaction.
 */
import { createServer } from "node:net"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Layer, Logger, LogLevel, Option, Redacted, type Scope, TestClock } from "effect"
import type { Vendor } from "../../schema/Provider.ts"
import * as AnthropicFake from "../../test/fakes/AnthropicFake.ts"
import type { FakeCall, FakeControls, FakeUsage, SeenChat } from "../../test/fakes/FakeServer.ts"
import * as GoogleFake from "../../test/fakes/GoogleFake.ts"
import * as OpenAiFake from "../../test/fakes/OpenAiFake.ts"
import * as Log from "../Log.ts"
import * as Anthropic from "./Anthropic.ts"
import { Chat, type ChatRequest, type Item } from "./Chat.ts"
import { ChatSettings, layer, summaryPrompt } from "./ChatClient.ts"
import * as Google from "./Google.ts"
import { compactionText, retryAfterMaxMs, retryAfterOf } from "./Http.ts"
import * as OpenAi from "./OpenAi.ts"
import { VendorSettings } from "./Vendors.ts"

const KEY = "sk-proj-CANARY0123456789abcdefWXYZ"
const key = Redacted.make(KEY)
const canaryParts = [KEY, KEY.slice(0, 12), KEY.slice(-4), "CANARY"]

const SYSTEM = 'You are the agent.\n  Keep   these spaces, and this: ü ✓ "quotes"\n'
const PROMPT = "  Write /workspace/out/a.txt\n\n\twith «hello»  "
// A 1x1 PNG.
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

const bash = {
  name: "bash",
  description: "Run a command",
  parameters: { type: "object", properties: { command: { type: "string" } }, required: ["command"] },
}

type ChatFake = FakeControls & {
  readonly replyText: (text: string, usage?: FakeUsage) => void
  readonly replyToolCalls: (calls: ReadonlyArray<FakeCall>, usage?: FakeUsage) => void
  readonly replyError: (status: number, body: unknown) => void
  readonly chats: () => ReadonlyArray<SeenChat>
  readonly lastChat: () => SeenChat
}

const models: Record<Vendor, string> = {
  openai: "gpt-5",
  anthropic: "claude-sonnet-4-5-20250929",
  google: "gemini-2.5-pro",
}

const fakeOf = (vendor: Vendor): Effect.Effect<ChatFake, never, Scope.Scope> =>
  vendor === "openai"
    ? OpenAiFake.make({ keys: [KEY] })
    : vendor === "anthropic"
      ? AnthropicFake.make({ keys: [KEY] })
      : GoogleFake.make({ keys: [KEY] })

/** The chat service pointed at `url` for every vendor. */
const chatAt = (url: string, timeoutMs?: number) =>
  Chat.pipe(
    Effect.provide(
      layer.pipe(
        Layer.provide(
          Layer.mergeAll(
            VendorSettings.layer({ openaiBaseUrl: url, anthropicBaseUrl: url, googleBaseUrl: url }),
            ChatSettings.layer(timeoutMs === undefined ? {} : { timeoutMs }),
          ),
        ),
      ),
    ),
  )

/** A fake and the chat service pointed at it. */
const over = <F extends FakeControls>(start: Effect.Effect<F, never, Scope.Scope>, timeoutMs?: number) =>
  Effect.gen(function* () {
    const fake = yield* start
    const chat = yield* chatAt(fake.url, timeoutMs)
    return { fake, chat }
  })

const setUp = (vendor: Vendor, timeoutMs?: number) => over(fakeOf(vendor), timeoutMs)

const prompt: Item = { role: "user", content: [{ type: "text", text: PROMPT }] }

const requestFor = (vendor: Vendor, over: Partial<ChatRequest> = {}): ChatRequest => ({
  provider: vendor,
  key,
  model: models[vendor],
  reasoning_effort: "",
  max_output_tokens: 0,
  system: SYSTEM,
  items: [prompt],
  tools: [bash],
  web_search: false,
  ...over,
})

const failureOf = <A, E>(exit: Exit.Exit<A, E>): E => {
  if (Exit.isSuccess(exit)) throw new Error("expected a failure")
  const failure = exit.cause._tag === "Fail" ? exit.cause.error : undefined
  if (failure === undefined) throw new Error(`expected a typed failure, got ${exit.cause._tag}`)
  return failure
}

const expectNoCanary = (value: unknown) => {
  const text = JSON.stringify(value)
  for (const part of canaryParts) expect(text).not.toContain(part)
}

/** A TCP port nothing listens on (bound, then closed). */
const closedPort = Effect.async<number>((resume) => {
  const server = createServer()
  server.listen(0, "127.0.0.1", () => {
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    server.close(() => resume(Effect.succeed(port)))
  })
})

const vendors = ["openai", "anthropic", "google"] as const

for (const vendor of vendors) {
  describe(`${vendor} chat`, () => {
    it.scoped("a text reply: the system prompt and prompt sent word for word, usage with web searches", () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* setUp(vendor)
        // Anthropic alone reports cache writes.
        const writes = vendor === "anthropic" ? 7 : 0
        fake.replyText("All done.", {
          input_tokens: 100,
          cache_read_tokens: 20,
          cache_write_tokens: writes,
          output_tokens: 30,
          web_searches: 2,
        })
        const reply = yield* chat.reply(requestFor(vendor, { web_search: true }))
        expect(reply.item).toMatchObject({ role: "assistant", text: "All done.", tool_calls: [] })
        expect(reply.item.vendor?.provider).toBe(vendor)
        expect(reply.stop).toBe("end")
        expect(reply.usage).toEqual({
          input_tokens: 100,
          cache_read_tokens: 20,
          cache_write_tokens: writes,
          output_tokens: 30,
          web_searches: 2,
        })
        expect(reply.context_tokens).toBe(150 + writes)
        const seen = fake.lastChat()
        expect(seen.system).toBe(SYSTEM)
        expect(seen.userTexts).toEqual([PROMPT])
        expect(seen.tools).toEqual(["bash"])
        // Gemini 2.5 cannot search in a turn that offers functions (Gemini 3 can: its own test).
        expect(seen.webSearch).toBe(vendor !== "google")
        expect(seen.model).toBe(models[vendor])
        const request = fake.requests.at(-1)
        expectNoCanary(request?.url)
        expectNoCanary(request?.body)
        // No tracing headers leave for a vendor, even from inside a span.
        fake.replyText("again")
        yield* chat.reply(requestFor(vendor)).pipe(Effect.withSpan("a turn"))
        const traced = Object.keys(fake.requests.at(-1)?.headers ?? {})
        for (const name of ["traceparent", "tracestate", "b3", "x-b3-traceid"])
          expect(traced).not.toContain(name)
      }),
    )

    it.scoped("a tool call, then its result with an image goes back in the vendor's format", () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* setUp(vendor)
        fake.replyToolCalls(
          [
            { name: "bash", arguments: { command: "ls -la" } },
            { name: "screenshot", arguments: {} },
          ],
          { input_tokens: 10, output_tokens: 5 },
        )
        const first = yield* chat.reply(requestFor(vendor))
        expect(first.stop).toBe("tool_calls")
        expect(first.item.tool_calls.map((c) => [c.name, c.arguments])).toEqual([
          ["bash", { command: "ls -la" }],
          ["screenshot", {}],
        ])
        const [ls, shot] = first.item.tool_calls
        if (ls === undefined || shot === undefined) throw new Error("two calls expected")
        expect(ls.id).not.toBe(shot.id)
        fake.replyText("I see the screen.")
        const items: ReadonlyArray<Item> = [
          prompt,
          first.item,
          {
            role: "tool",
            call_id: ls.id,
            name: "bash",
            content: [{ type: "text", text: "a.txt" }],
            is_error: false,
          },
          {
            role: "tool",
            call_id: shot.id,
            name: "screenshot",
            content: [
              { type: "text", text: "the screen" },
              { type: "image", media_type: "image/png", data: PNG },
            ],
            is_error: false,
          },
        ]
        const second = yield* chat.reply(requestFor(vendor, { items }))
        expect(second.item.text).toBe("I see the screen.")
        const seen = fake.lastChat()
        expect(seen.userTexts).toEqual([PROMPT])
        expect(seen.images).toEqual([PNG])
        expect(seen.toolResults.map((r) => r.text)).toEqual(["a.txt", "the screen"])
        expect(seen.toolResults.at(-1)?.images).toEqual([PNG])
        const body = seen.body
        if (vendor === "openai") {
          const outputs = (body.input as Array<Record<string, unknown>>).filter(
            (i) => i.type === "function_call_output",
          )
          expect(outputs).toEqual([
            { type: "function_call_output", call_id: ls.id, output: "a.txt" },
            {
              type: "function_call_output",
              call_id: shot.id,
              output: [
                { type: "input_text", text: "the screen" },
                { type: "input_image", image_url: `data:image/png;base64,${PNG}` },
              ],
            },
          ])
        } else if (vendor === "anthropic") {
          const messages = body.messages as Array<{ role: string; content: unknown }>
          expect(messages.map((m) => m.role)).toEqual(["user", "assistant", "user"])
          expect(messages[2]?.content).toEqual([
            { type: "tool_result", tool_use_id: ls.id, content: [{ type: "text", text: "a.txt" }] },
            {
              type: "tool_result",
              tool_use_id: shot.id,
              content: [
                { type: "text", text: "the screen" },
                { type: "image", source: { type: "base64", media_type: "image/png", data: PNG } },
              ],
              // The conversation's last block carries the cache breakpoint.
              cache_control: { type: "ephemeral" },
            },
          ])
          // Only the tail: the first user message has no breakpoint left behind.
          expect(JSON.stringify(messages[0])).not.toContain("cache_control")
        } else {
          const contents = body.contents as Array<{ role: string; parts: unknown }>
          expect(contents.map((c) => c.role)).toEqual(["user", "model", "user"])
          // Gemini 2.5: the image beside the responses.
          expect(contents[2]?.parts).toEqual([
            { functionResponse: { name: "bash", response: { output: "a.txt" } } },
            { functionResponse: { name: "screenshot", response: { output: "the screen" } } },
            { inlineData: { mimeType: "image/png", data: PNG } },
          ])
          // Gemini 3: inside its function response (multimodal function responses).
          fake.replyText("I see it again.")
          yield* chat.reply(requestFor(vendor, { items, model: "gemini-3-pro-preview" }))
          const three = fake.lastChat()
          expect(three.toolResults.at(-1)?.images).toEqual([PNG])
          expect((three.body.contents as Array<{ parts: unknown }>)[2]?.parts).toEqual([
            { functionResponse: { name: "bash", response: { output: "a.txt" } } },
            {
              functionResponse: {
                name: "screenshot",
                response: { output: "the screen" },
                parts: [{ inlineData: { mimeType: "image/png", data: PNG } }],
              },
            },
          ])
        }
      }),
    )

    it.scoped("a failed tool result is marked as an error", () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* setUp(vendor)
        fake.replyToolCalls([{ name: "bash", arguments: { command: "false" } }])
        const first = yield* chat.reply(requestFor(vendor))
        const call = first.item.tool_calls[0]
        if (call === undefined) throw new Error("a call expected")
        fake.replyText("ok")
        yield* chat.reply(
          requestFor(vendor, {
            items: [
              prompt,
              first.item,
              {
                role: "tool",
                call_id: call.id,
                name: "bash",
                content: [{ type: "text", text: "exit 1" }],
                is_error: true,
              },
            ],
          }),
        )
        expect(fake.lastChat().toolResults).toEqual([
          expect.objectContaining({ isError: true, text: vendor === "openai" ? "Error: exit 1" : "exit 1" }),
        ])
      }),
    )

    it.scoped("an empty tool output and an empty answer are sent in a form the vendor accepts", () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* setUp(vendor)
        fake.replyToolCalls([{ name: "bash", arguments: { command: "true" } }])
        const first = yield* chat.reply(requestFor(vendor))
        const call = first.item.tool_calls[0]
        if (call === undefined) throw new Error("a call expected")
        fake.replyText("")
        const items: Array<Item> = [
          prompt,
          first.item,
          {
            role: "tool",
            call_id: call.id,
            name: "bash",
            content: [{ type: "text", text: "" }],
            is_error: false,
          },
        ]
        const empty = yield* chat.reply(requestFor(vendor, { items }))
        expect(empty).toMatchObject({ stop: "end", item: { text: "", tool_calls: [] } })
        fake.replyText("ok")
        items.push(empty.item, { role: "user", content: [{ type: "text", text: "Go on." }] })
        expect((yield* chat.reply(requestFor(vendor, { items }))).item.text).toBe("ok")
        expect(fake.lastChat().toolResults).toEqual([expect.objectContaining({ text: "" })])
      }),
    )

    it.scoped("running out of output tokens is stop max_tokens", () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* setUp(vendor)
        const reply =
          vendor === "openai"
            ? OpenAiFake.textReply("cut", {}, { incomplete: true })
            : vendor === "anthropic"
              ? AnthropicFake.textReply("cut", {}, { stop: "max_tokens" })
              : GoogleFake.textReply("cut", {}, { finishReason: "MAX_TOKENS" })
        fake.enqueue(
          vendor === "openai" ? "responses" : vendor === "anthropic" ? "messages" : "generateContent",
          reply,
        )
        const answer = yield* chat.reply(requestFor(vendor))
        expect(answer).toMatchObject({ stop: "max_tokens", item: { text: "cut" } })
      }),
    )

    it.scoped("errors at each status boundary; the key never appears; the next call works", () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* setUp(vendor)
        const body = (message: string) =>
          vendor === "anthropic"
            ? { type: "error", error: { type: "some_error", message } }
            : vendor === "openai"
              ? { error: { message, type: "some_error", param: null, code: null } }
              : { error: { code: 0, message, status: "SOME_STATUS", details: [] } }
        const cases = [
          [401, "VendorRejectedKey"],
          [403, "VendorRejectedKey"],
          [400, "ChatRefused"],
          [404, "ChatRefused"],
          [413, "ChatRefused"],
          [422, "ChatRefused"],
          [429, "VendorUnavailable"],
          [500, "VendorUnavailable"],
          [502, "VendorUnavailable"],
          [503, "VendorUnavailable"],
          [529, "VendorUnavailable"],
        ] as const
        for (const [status, tag] of cases) {
          // The vendor echoes the key: it must not survive into the error.
          fake.failNext(1, { status, json: body(`failure ${status} for key ${KEY}`) })
          const error = failureOf(yield* Effect.exit(chat.reply(requestFor(vendor))))
          expect(error).toMatchObject({ _tag: tag, status })
          expect(error.message).toContain(`failure ${status} for key`)
          expectNoCanary(error)
          expectNoCanary(String(error))
        }
        fake.replyText("fine")
        expect((yield* chat.reply(requestFor(vendor))).item.text).toBe("fine")
      }),
    )

    it.scoped("garbage, a wrong shape, a dropped connection and a refused connection are unavailable", () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* setUp(vendor)
        fake.failNext(1, { status: 200, text: "<html>captive portal</html>" })
        expect(failureOf(yield* Effect.exit(chat.reply(requestFor(vendor))))).toMatchObject({
          _tag: "VendorUnavailable",
          status: 200,
          message: "the answer is not JSON",
        })
        fake.failNext(1, { status: 200, json: { output: "nope", content: "nope", candidates: "nope" } })
        const shape = failureOf(yield* Effect.exit(chat.reply(requestFor(vendor))))
        expect(shape).toMatchObject({ _tag: "VendorUnavailable", status: 200 })
        expect(shape.message).toContain("unexpected shape")
        fake.failNext(1, { drop: true })
        expect(failureOf(yield* Effect.exit(chat.reply(requestFor(vendor))))).toMatchObject({
          _tag: "VendorUnavailable",
          status: 0,
        })
        const port = yield* closedPort
        const nowhere = yield* chatAt(`http://127.0.0.1:${port}`)
        const refused = failureOf(yield* Effect.exit(nowhere.reply(requestFor(vendor))))
        expect(refused).toMatchObject({ _tag: "VendorUnavailable", status: 0 })
        expect(refused.message).toContain("ECONNREFUSED")
      }),
    )

    it.scoped("compaction is a summary turn without callable tools, and later turns start from it", () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* setUp(vendor)
        fake.replyToolCalls([{ name: "bash", arguments: { command: "ls" } }])
        const first = yield* chat.reply(requestFor(vendor))
        const call = first.item.tool_calls[0]
        if (call === undefined) throw new Error("a call expected")
        const items: ReadonlyArray<Item> = [
          prompt,
          first.item,
          {
            role: "tool",
            call_id: call.id,
            name: "bash",
            content: [{ type: "text", text: "a.txt" }],
            is_error: false,
          },
        ]
        fake.replyText("Task: write a.txt. Done: listed files.", { input_tokens: 500, output_tokens: 40 })
        const compacted = yield* chat.compact(requestFor(vendor, { items, web_search: true }))
        expect(compacted.item).toEqual({
          role: "compaction",
          summary: "Task: write a.txt. Done: listed files.",
        })
        expect(compacted.usage).toMatchObject({ input_tokens: 500, output_tokens: 40 })
        const asked = fake.lastChat()
        expect(asked.userTexts).toEqual([PROMPT, summaryPrompt])
        expect(asked.tools).toEqual(["bash"])
        const body = asked.body
        if (vendor === "openai") expect(body.tool_choice).toBe("none")
        if (vendor === "anthropic") expect(body.tool_choice).toEqual({ type: "none" })
        if (vendor === "google") expect(body.toolConfig).toEqual({ functionCallingConfig: { mode: "NONE" } })

        fake.replyText("Going on.")
        const note: Item = { role: "user", content: [{ type: "text", text: "Continue." }] }
        yield* chat.reply(requestFor(vendor, { items: [...items, compacted.item, note] }))
        // Only the summary and what follows it are sent (OpenAI keeps the two user messages apart,
        // the others merge neighbours of the same role).
        const after = fake.lastChat()
        expect(after.userTexts.join("\n")).toBe(
          `${compactionText("Task: write a.txt. Done: listed files.")}\nContinue.`,
        )
        expect(after.toolResults).toEqual([])
      }),
    )

    it.scoped("a summary turn that answers no text is unavailable, not an empty summary", () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* setUp(vendor)
        fake.replyText("")
        expect(failureOf(yield* Effect.exit(chat.compact(requestFor(vendor))))).toMatchObject({
          _tag: "VendorUnavailable",
          message: "the summary turn answered no text",
        })
      }),
    )
  })
}

describe("streamed turns", () => {
  for (const vendor of vendors) {
    it.scoped(
      `${vendor}: the turn is streamed; a stream cut mid-way is unavailable, and the next answer counts once`,
      () =>
        Effect.gen(function* () {
          const { fake, chat } = yield* setUp(vendor)
          const text = "a long answer that comes in pieces"
          const scripted = fake as unknown as {
            replyText: (t: string, u?: FakeUsage, o?: { cutAfter?: number }) => void
          }
          scripted.replyText(text, { input_tokens: 50, output_tokens: 9 }, { cutAfter: 2 })
          const cut = failureOf(yield* Effect.exit(chat.reply(requestFor(vendor))))
          expect(cut).toMatchObject({ _tag: "VendorUnavailable" })
          // OpenAI and Anthropic ask with `stream: true`, Google on its streaming route.
          if (vendor === "google") expect(fake.requests.at(-1)?.path).toMatch(/:streamGenerateContent$/)
          else expect(fake.lastChat().body.stream).toBe(true)
          scripted.replyText(text, { input_tokens: 50, output_tokens: 9 })
          const whole = yield* chat.reply(requestFor(vendor))
          expect(whole.item.text).toBe(text)
          expect(whole.usage).toMatchObject({ input_tokens: 50, output_tokens: 9 })
        }),
    )
  }

  it.scoped("anthropic: tool input, thinking and its signature are rebuilt from their deltas", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(AnthropicFake.make({ keys: [KEY] }))
      fake.replyToolCalls(
        [{ id: "toolu_s", name: "bash", arguments: { command: "echo 'a b' | wc -c", env: { X: "1" } } }],
        {},
        { thinking: "Let me count the bytes.", signature: "sig-streamed", text: "Counting." },
      )
      const reply = yield* chat.reply(requestFor("anthropic", { reasoning_effort: "low" }))
      expect(reply.item.text).toBe("Counting.")
      expect(reply.item.tool_calls).toEqual([
        { id: "toolu_s", name: "bash", arguments: { command: "echo 'a b' | wc -c", env: { X: "1" } } },
      ])
      const blocks =
        (reply.item.vendor?.data as { content: Array<Record<string, unknown>> } | undefined)?.content ?? []
      expect(blocks[0]).toEqual({
        type: "thinking",
        thinking: "Let me count the bytes.",
        signature: "sig-streamed",
      })
    }),
  )
})

describe("chat timeout", () => {
  it.scoped("no answer within the chat timeout (5 minutes by default) is unavailable", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* setUp("openai")
      fake.failNext(1, { hang: true })
      const fiber = yield* Effect.fork(chat.reply(requestFor("openai")))
      yield* fake.awaitRequests(1)
      yield* TestClock.adjust("299999 millis")
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      yield* TestClock.adjust("1 millis")
      expect(failureOf(yield* Fiber.await(fiber))).toMatchObject({
        _tag: "VendorUnavailable",
        status: 0,
        message: "no answer within 300000 ms",
      })
    }),
  )

  it.scoped("the chat timeout is a setting", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* setUp("google", 80)
      fake.failNext(1, { hang: true })
      const fiber = yield* Effect.fork(chat.reply(requestFor("google")))
      yield* fake.awaitRequests(1)
      yield* TestClock.adjust("79 millis")
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      yield* TestClock.adjust("1 millis")
      expect(failureOf(yield* Fiber.await(fiber)).message).toBe("no answer within 80 ms")
    }),
  )
})

describe("OpenAI specifics", () => {
  it.scoped("auth header, body fields, effort and output limit", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(OpenAiFake.make({ keys: [KEY] }))
      fake.replyText("a")
      fake.replyText("b")
      yield* chat.reply(
        requestFor("openai", {
          reasoning_effort: "high",
          max_output_tokens: 1000,
          web_search: true,
          cache_key: "run_cache_key",
        }),
      )
      const request = fake.requests.at(-1)
      expect(request?.path).toBe("/v1/responses")
      expect(fake.lastChat().body.prompt_cache_key).toBe("run_cache_key")
      expect(request?.headers.authorization).toBe(`Bearer ${KEY}`)
      expect(fake.lastChat().body).toMatchObject({
        model: "gpt-5",
        instructions: SYSTEM,
        input: [{ role: "user", content: [{ type: "input_text", text: PROMPT }] }],
        tools: [
          {
            type: "function",
            name: "bash",
            description: "Run a command",
            parameters: bash.parameters,
            strict: false,
          },
          { type: "web_search" },
        ],
        reasoning: { effort: "high" },
        max_output_tokens: 1000,
        store: false,
        include: ["reasoning.encrypted_content"],
      })
      // A model that does not reason: no include (OpenAI refuses it), no effort, no limit.
      yield* chat.reply(requestFor("openai", { model: "gpt-4.1", tools: [] }))
      const plain = fake.lastChat().body
      expect(plain.include).toBeUndefined()
      expect(plain.reasoning).toBeUndefined()
      expect(plain.max_output_tokens).toBeUndefined()
      expect(plain.tools).toBeUndefined()
      expect(plain.prompt_cache_key).toBeUndefined()
      // A parameter the Responses API does not know is refused, as OpenAI refuses it.
      const unknown = yield* Effect.promise(() =>
        fetch(`${fake.url}/v1/responses`, {
          method: "POST",
          headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "gpt-5", input: [], cache_key: "x" }),
        }).then(async (r) => ({
          status: r.status,
          body: (await r.json()) as { error: { code: string; param: string } },
        })),
      )
      expect(unknown.status).toBe(400)
      expect(unknown.body.error).toMatchObject({ code: "unknown_parameter", param: "cache_key" })
      expect(plain.store).toBe(false)
    }),
  )

  it.scoped(
    "reasoning, search, message and call items go back in output order as the API gave them, ids included",
    () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* over(OpenAiFake.make({ keys: [KEY] }))
        fake.replyToolCalls(
          [{ name: "bash", arguments: { command: "ls" }, id: "call_a" }],
          { web_searches: 1 },
          {
            reasoning: "enc-1",
            text: "Let me look.",
          },
        )
        const first = yield* chat.reply(requestFor("openai"))
        expect(first.item.text).toBe("Let me look.")
        expect(first.usage.web_searches).toBe(1)
        fake.replyText("done")
        const toolResult: Item = {
          role: "tool",
          call_id: "call_a",
          name: "bash",
          content: [{ type: "text", text: "x" }],
          is_error: false,
        }
        yield* chat.reply(requestFor("openai", { items: [prompt, first.item, toolResult] }))
        const input = fake.lastChat().body.input as Array<Record<string, unknown>>
        expect(input.map((i) => i.type ?? i.role)).toEqual([
          "user",
          "reasoning",
          "web_search_call",
          "message",
          "function_call",
          "function_call_output",
        ])
        // Each output item as given, with its id.
        const id = (prefix: string) => expect.stringMatching(new RegExp(`^${prefix}_`))
        expect(input[1]).toEqual({ type: "reasoning", id: id("rs"), summary: [], encrypted_content: "enc-1" })
        expect(input[2]).toMatchObject({ type: "web_search_call", id: id("ws"), status: "completed" })
        expect(input[3]).toEqual({
          type: "message",
          id: id("msg"),
          role: "assistant",
          status: "completed",
          content: [{ type: "output_text", text: "Let me look.", annotations: [] }],
        })
        expect(input[4]).toEqual({
          type: "function_call",
          id: id("fc"),
          call_id: "call_a",
          name: "bash",
          arguments: '{"command":"ls"}',
          status: "completed",
        })

        // The old form (a reasoning item without its id) is refused as OpenAI refuses it.
        const data =
          first.item.role === "assistant"
            ? (first.item.vendor?.data as { items: Array<Record<string, unknown>> })
            : undefined
        const stripped = data!.items.map(({ id: _id, ...rest }) =>
          rest.type === "reasoning" ? rest : { id: _id, ...rest },
        )
        const old: Item = { ...first.item, vendor: { provider: "openai", data: { items: stripped } } } as Item
        const refused = yield* chat
          .reply(requestFor("openai", { items: [prompt, old, toolResult] }))
          .pipe(Effect.flip)
        expect(refused).toMatchObject({ _tag: "ChatRefused", status: 400 })
        expect(refused.message).toContain("Missing required parameter: 'input[1].id'.")
      }),
  )

  it.scoped(
    "without a reasoning item (a model not known to reason), output items go back without their ids",
    () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* over(OpenAiFake.make({ keys: [KEY] }))
        fake.replyToolCalls(
          [{ name: "bash", arguments: { command: "ls" }, id: "call_n" }],
          {},
          { text: "Looking." },
        )
        const first = yield* chat.reply(requestFor("openai", { model: "gpt-4.1" }))
        fake.replyText("done")
        const result: Item = {
          role: "tool",
          call_id: "call_n",
          name: "bash",
          content: [{ type: "text", text: "x" }],
          is_error: false,
        }
        yield* chat.reply(requestFor("openai", { model: "gpt-4.1", items: [prompt, first.item, result] }))
        const input = fake.lastChat().body.input as Array<Record<string, unknown>>
        expect(input.slice(1, 3)).toEqual([
          { role: "assistant", content: "Looking." },
          { type: "function_call", call_id: "call_n", name: "bash", arguments: '{"command":"ls"}' },
        ])
      }),
  )

  it.scoped("an item another vendor made is rebuilt from its text and calls", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(OpenAiFake.make({ keys: [KEY] }))
      fake.replyText("ok")
      const foreign: Item = {
        role: "assistant",
        text: "hi",
        tool_calls: [{ id: "t1", name: "bash", arguments: { command: "ls" } }],
        vendor: { provider: "anthropic", data: { content: [{ type: "thinking", thinking: "secret" }] } },
      }
      yield* chat.reply(
        requestFor("openai", {
          items: [
            prompt,
            foreign,
            {
              role: "tool",
              call_id: "t1",
              name: "bash",
              content: [{ type: "text", text: "x" }],
              is_error: false,
            },
          ],
        }),
      )
      const sent = fake.requests.at(-1)?.body ?? ""
      expect(sent).not.toContain("secret")
      expect((fake.lastChat().body.input as Array<unknown>)[2]).toEqual({
        type: "function_call",
        call_id: "t1",
        name: "bash",
        arguments: '{"command":"ls"}',
      })
    }),
  )

  it.scoped("429 insufficient_quota is refused for good; a rate-limit 429 is unavailable", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(OpenAiFake.make({ keys: [KEY] }))
      fake.replyError(429, OpenAiFake.quotaBody())
      const quota = failureOf(yield* Effect.exit(chat.reply(requestFor("openai"))))
      expect(quota).toMatchObject({ _tag: "ChatRefused", provider: "openai", status: 429 })
      expect(quota.message).toContain("You exceeded your current quota")
      fake.failNext(1, OpenAiFake.rateLimited())
      expect(failureOf(yield* Effect.exit(chat.reply(requestFor("openai"))))).toMatchObject({
        _tag: "VendorUnavailable",
        status: 429,
      })
    }),
  )

  it.scoped(
    "a quota spent is refused for good and a rate limit is unavailable with the wait each vendor asks for",
    () =>
      Effect.gen(function* () {
        // Google: a per-day quota refuses; a per-minute limit waits its RetryInfo.
        const google = yield* over(GoogleFake.make({ keys: [KEY] }))
        google.fake.failNext(1, GoogleFake.quotaExhausted())
        const daily = failureOf(yield* Effect.exit(google.chat.reply(requestFor("google"))))
        expect(daily).toMatchObject({ _tag: "ChatRefused", provider: "google", status: 429 })
        expect(daily.message).toContain("You exceeded your current quota")
        google.fake.failNext(1, GoogleFake.rateLimited("2.5s"))
        expect(failureOf(yield* Effect.exit(google.chat.reply(requestFor("google"))))).toMatchObject({
          _tag: "VendorUnavailable",
          status: 429,
          retryAfterMs: 2500,
        })
        // OpenAI: retry-after-ms; Anthropic: retry-after in seconds; a spent credit balance refuses.
        const openai = yield* over(OpenAiFake.make({ keys: [KEY] }))
        openai.fake.failNext(1, OpenAiFake.rateLimited(1500))
        expect(failureOf(yield* Effect.exit(openai.chat.reply(requestFor("openai"))))).toMatchObject({
          _tag: "VendorUnavailable",
          retryAfterMs: 1500,
        })
        const anthropic = yield* over(AnthropicFake.make({ keys: [KEY] }))
        anthropic.fake.failNext(1, AnthropicFake.rateLimited(3))
        expect(failureOf(yield* Effect.exit(anthropic.chat.reply(requestFor("anthropic"))))).toMatchObject({
          _tag: "VendorUnavailable",
          retryAfterMs: 3000,
        })
        anthropic.fake.failNext(1, AnthropicFake.creditTooLow())
        const credit = failureOf(yield* Effect.exit(anthropic.chat.reply(requestFor("anthropic"))))
        expect(credit).toMatchObject({ _tag: "ChatRefused", status: 400 })
        expect(credit.message).toContain("credit balance is too low")
        // Without a hint there is none to follow.
        anthropic.fake.failNext(1, AnthropicFake.rateLimited())
        const plain = failureOf(yield* Effect.exit(anthropic.chat.reply(requestFor("anthropic"))))
        expect(plain).toMatchObject({ _tag: "VendorUnavailable" })
        expect(plain).not.toHaveProperty("retryAfterMs")
      }),
  )

  it("reads a retry hint from retry-after-ms, retry-after in seconds or as a date, or the body; capped at 15 minutes", () => {
    const now = Date.parse("2026-11-25T12:00:00Z")
    expect(retryAfterOf({ "retry-after-ms": "250" }, {}, OpenAi.dialect, now)).toBe(250)
    expect(retryAfterOf({ "retry-after": "7" }, {}, Anthropic.dialect, now)).toBe(7000)
    expect(retryAfterOf({ "retry-after": "Wed, 25 Nov 2026 12:00:30 GMT" }, {}, Anthropic.dialect, now)).toBe(
      30_000,
    )
    expect(retryAfterOf({}, GoogleFake.rateLimited("0.5s").json, Google.dialect, now)).toBe(500)
    expect(retryAfterOf({ "retry-after": "86400" }, {}, Anthropic.dialect, now)).toBe(retryAfterMaxMs)
    expect(retryAfterOf({ "retry-after": "soon" }, {}, Anthropic.dialect, now)).toBeUndefined()
    expect(retryAfterOf({}, {}, OpenAi.dialect, now)).toBeUndefined()
  })

  it.scoped("a wrong key is rejected with the masked key scrubbed", () =>
    Effect.gen(function* () {
      const { chat } = yield* over(OpenAiFake.make({ keys: [KEY] }))
      const wrong = "sk-proj-WRONG0123456789abcdefQRST"
      const error = failureOf(
        yield* Effect.exit(chat.reply(requestFor("openai", { key: Redacted.make(wrong) }))),
      )
      expect(error).toMatchObject({ _tag: "VendorRejectedKey", status: 401 })
      expect(error.message).toContain("Incorrect API key provided")
      expect(error.message).not.toContain(wrong.slice(0, 8))
      expect(error.message).not.toContain("QRST")
    }),
  )

  it.scoped("a failed response is unavailable", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(OpenAiFake.make({ keys: [KEY] }))
      fake.enqueue("responses", {
        json: { status: "failed", error: { code: "server_error", message: "boom" }, output: [] },
      })
      expect(failureOf(yield* Effect.exit(chat.reply(requestFor("openai"))))).toMatchObject({
        _tag: "VendorUnavailable",
        message: "boom",
      })
    }),
  )
})

describe("Anthropic specifics", () => {
  it("the tail breakpoint skips thinking blocks and empty texts; the messages given are left unchanged", () => {
    const messages = [
      { role: "user" as const, content: [{ type: "text", text: "go" }] },
      { role: "assistant" as const, content: [{ type: "thinking", thinking: "hm", signature: "s" }] },
    ]
    const marked = Anthropic.withTailBreakpoint(messages)
    expect(marked[0]?.content).toEqual([{ type: "text", text: "go", cache_control: { type: "ephemeral" } }])
    expect(marked[1]).toBe(messages[1])
    expect(messages[0]?.content).toEqual([{ type: "text", text: "go" }])
  })

  it.scoped("the fake refuses breakpoints as Anthropic does: more than 4, or on a thinking block", () =>
    Effect.gen(function* () {
      const fake = yield* AnthropicFake.make({ keys: [KEY] })
      const post = (body: unknown) =>
        Effect.promise(() =>
          fetch(`${fake.url}/v1/messages`, {
            method: "POST",
            headers: {
              "x-api-key": KEY,
              "anthropic-version": "2023-06-01",
              "content-type": "application/json",
            },
            body: JSON.stringify(body),
          }).then(async (r) => ({
            status: r.status,
            body: (await r.json()) as { error: { message: string } },
          })),
        )
      const cached = { type: "text", text: "x", cache_control: { type: "ephemeral" } }
      const five = yield* post({
        model: "m",
        max_tokens: 10,
        system: [cached, cached],
        messages: [{ role: "user", content: [cached, cached, cached] }],
      })
      expect(five.status).toBe(400)
      expect(five.body.error.message).toBe(
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
      )
      const thinking = yield* post({
        model: "m",
        max_tokens: 10,
        messages: [
          { role: "user", content: [{ type: "text", text: "go" }] },
          {
            role: "assistant",
            content: [
              { type: "thinking", thinking: "t", signature: "s", cache_control: { type: "ephemeral" } },
            ],
          },
        ],
      })
      expect(thinking.status).toBe(400)
    }),
  )

  it.scoped("headers, max_tokens from the model's maximum, thinking budgets, the web search tool", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(AnthropicFake.make({ keys: [KEY] }))
      for (let i = 0; i < 5; i++) fake.replyText("x")
      yield* chat.reply(requestFor("anthropic", { web_search: true }))
      const request = fake.requests.at(-1)
      expect(request?.headers["x-api-key"]).toBe(KEY)
      expect(request?.headers["anthropic-version"]).toBe("2023-06-01")
      expect(fake.lastChat().body).toMatchObject({
        model: "claude-sonnet-4-5-20250929",
        max_tokens: 64_000,
        // Prompt-cache breakpoints: after the system prompt, and on the conversation's last block.
        system: [{ type: "text", text: SYSTEM, cache_control: { type: "ephemeral" } }],
        messages: [
          { role: "user", content: [{ type: "text", text: PROMPT, cache_control: { type: "ephemeral" } }] },
        ],
        tools: [
          { name: "bash", description: "Run a command", input_schema: bash.parameters },
          { type: "web_search_20250305", name: "web_search", max_uses: 20 },
        ],
      })
      expect(fake.lastChat().body.thinking).toBeUndefined()
      yield* chat.reply(requestFor("anthropic", { reasoning_effort: "low" }))
      expect(fake.lastChat().body.thinking).toEqual({ type: "enabled", budget_tokens: 4096 })
      // The budget leaves a quarter of max_tokens (at least 1,024) for the answer…
      yield* chat.reply(requestFor("anthropic", { reasoning_effort: "high", max_output_tokens: 8000 }))
      expect(fake.lastChat().body).toMatchObject({ max_tokens: 8000, thinking: { budget_tokens: 6000 } })
      yield* chat.reply(requestFor("anthropic", { reasoning_effort: "high", max_output_tokens: 2048 }))
      expect(fake.lastChat().body).toMatchObject({ max_tokens: 2048, thinking: { budget_tokens: 1024 } })
      // …and when that leaves less than Anthropic's minimum budget (1,024), no thinking at all.
      yield* chat.reply(requestFor("anthropic", { reasoning_effort: "high", max_output_tokens: 2000 }))
      expect(fake.lastChat().body).toMatchObject({ max_tokens: 2000 })
      expect(fake.lastChat().body.thinking).toBeUndefined()
    }),
  )

  it.scoped("thinking blocks and search results go back whole with their signatures", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(AnthropicFake.make({ keys: [KEY] }))
      fake.replyToolCalls(
        [{ name: "bash", arguments: { command: "ls" }, id: "toolu_a" }],
        { web_searches: 1 },
        {
          thinking: "Let me think.",
          signature: "sig-abc",
        },
      )
      const first = yield* chat.reply(requestFor("anthropic", { reasoning_effort: "low", web_search: true }))
      expect(first.item.text).toBe("")
      expect(first.usage.web_searches).toBe(1)
      fake.replyText("done")
      yield* chat.reply(
        requestFor("anthropic", {
          reasoning_effort: "low",
          web_search: true,
          items: [
            prompt,
            first.item,
            {
              role: "tool",
              call_id: "toolu_a",
              name: "bash",
              content: [{ type: "text", text: "x" }],
              is_error: false,
            },
          ],
        }),
      )
      const messages = fake.lastChat().body.messages as Array<{
        role: string
        content: Array<{ type: string }>
      }>
      expect(messages[1]?.content.map((b) => b.type)).toEqual([
        "thinking",
        "server_tool_use",
        "web_search_tool_result",
        "tool_use",
      ])
      expect(messages[1]?.content[0]).toEqual({
        type: "thinking",
        thinking: "Let me think.",
        signature: "sig-abc",
      })
    }),
  )

  it.scoped("pause_turn is continued: one reply joining both calls' content and usage", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(AnthropicFake.make({ keys: [KEY] }))
      fake.enqueue(
        "messages",
        AnthropicFake.textReply(
          "Searching…",
          { input_tokens: 10, output_tokens: 2, web_searches: 1 },
          { stop: "pause_turn" },
        ),
        AnthropicFake.textReply(" Found.", { input_tokens: 30, output_tokens: 3, web_searches: 1 }),
      )
      const reply = yield* chat.reply(requestFor("anthropic", { web_search: true }))
      expect(reply.item.text).toBe("Searching… Found.")
      expect(reply.stop).toBe("end")
      expect(reply.usage).toEqual({
        input_tokens: 40,
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        output_tokens: 5,
        web_searches: 2,
      })
      expect(reply.context_tokens).toBe(33)
      const chats = fake.chats()
      expect(chats).toHaveLength(2)
      const messages = chats[1]?.body.messages as Array<{ role: string; content: Array<{ type: string }> }>
      expect(messages.map((m) => m.role)).toEqual(["user", "assistant"])
      expect(messages[1]?.content.map((b) => b.type)).toEqual([
        "server_tool_use",
        "web_search_tool_result",
        "text",
      ])
    }),
  )

  it.scoped("web search disabled for the organization is refused, 400 or 403; another 403 is the key", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(AnthropicFake.make({ keys: [KEY] }))
      fake.replyError(400, AnthropicFake.webSearchDisabledBody())
      const disabled = failureOf(
        yield* Effect.exit(chat.reply(requestFor("anthropic", { web_search: true }))),
      )
      expect(disabled).toMatchObject({ _tag: "ChatRefused", provider: "anthropic", status: 400 })
      expect(disabled.message).toContain("Web search is not enabled")
      fake.replyError(
        403,
        AnthropicFake.error(403, "permission_error", "Web search is disabled for your organization.").json,
      )
      expect(
        failureOf(yield* Effect.exit(chat.reply(requestFor("anthropic", { web_search: true })))),
      ).toMatchObject({
        _tag: "ChatRefused",
        status: 403,
      })
      fake.replyError(
        403,
        AnthropicFake.error(403, "permission_error", "Your API key does not have permission.").json,
      )
      expect(failureOf(yield* Effect.exit(chat.reply(requestFor("anthropic"))))).toMatchObject({
        _tag: "VendorRejectedKey",
        status: 403,
      })
    }),
  )

  it.scoped("a refusal stop is refused; a wrong key is rejected", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(AnthropicFake.make({ keys: [KEY] }))
      fake.enqueue("messages", AnthropicFake.textReply("", {}, { stop: "refusal" }))
      expect(failureOf(yield* Effect.exit(chat.reply(requestFor("anthropic"))))).toMatchObject({
        _tag: "ChatRefused",
        status: 200,
      })
      const wrong = failureOf(
        yield* Effect.exit(
          chat.reply(requestFor("anthropic", { key: Redacted.make("sk-ant-wrong-0000000000") })),
        ),
      )
      expect(wrong).toMatchObject({ _tag: "VendorRejectedKey", status: 401, message: "invalid x-api-key" })
    }),
  )
})

describe("Google specifics", () => {
  it.scoped("path, header, thinking level or budget, output limit, search tool", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(GoogleFake.make({ keys: [KEY] }))
      for (let i = 0; i < 3; i++) fake.replyText("x")
      yield* chat.reply(
        requestFor("google", { reasoning_effort: "high", max_output_tokens: 5000, web_search: true }),
      )
      const request = fake.requests.at(-1)
      // Streamed: server-sent events, one `GenerateContentResponse` per chunk.
      expect(request?.path).toBe("/v1beta/models/gemini-2.5-pro:streamGenerateContent")
      expect(request?.query.alt).toBe("sse")
      expect(request?.headers["x-goog-api-key"]).toBe(KEY)
      expect(request?.query.key).toBeUndefined()
      const declarations = {
        functionDeclarations: [
          { name: "bash", description: "Run a command", parametersJsonSchema: bash.parameters },
        ],
      }
      // Gemini 2.5 refuses search beside functions: it is left out.
      expect(fake.lastChat().body).toEqual({
        systemInstruction: { parts: [{ text: SYSTEM }] },
        contents: [{ role: "user", parts: [{ text: PROMPT }] }],
        tools: [declarations],
        generationConfig: { maxOutputTokens: 5000, thinkingConfig: { thinkingBudget: 24_576 } },
      })
      // Gemini 3 takes the pair with the documented opt-in; search alone needs none.
      for (let i = 0; i < 2; i++) fake.replyText("x")
      yield* chat.reply(requestFor("google", { model: "gemini-3-pro-preview", web_search: true }))
      expect(fake.lastChat().body.tools).toEqual([declarations, { googleSearch: {} }])
      expect(fake.lastChat().body.toolConfig).toEqual({ includeServerSideToolInvocations: true })
      yield* chat.reply(requestFor("google", { tools: [], web_search: true }))
      expect(fake.lastChat().body.tools).toEqual([{ googleSearch: {} }])
      expect(fake.lastChat().body.toolConfig).toBeUndefined()
      yield* chat.reply(requestFor("google", { model: "gemini-3-pro-preview", reasoning_effort: "low" }))
      expect(fake.lastChat().body.generationConfig).toEqual({ thinkingConfig: { thinkingLevel: "low" } })
      yield* chat.reply(requestFor("google", { tools: [] }))
      expect(fake.lastChat().body.generationConfig).toBeUndefined()
      expect(fake.lastChat().body.tools).toBeUndefined()
    }),
  )

  it.scoped(
    "calls get unique ids; parts go back with their thought signatures; results map by name and order",
    () =>
      Effect.gen(function* () {
        const { fake, chat } = yield* over(GoogleFake.make({ keys: [KEY] }))
        const google = fake as unknown as GoogleFake.GoogleFake
        google.replyToolCalls(
          [
            { name: "bash", arguments: { command: "a" } },
            { name: "bash", arguments: { command: "b" } },
          ],
          {},
          { thoughtSignature: "sig-g", thought: "Thinking about it" },
        )
        const first = yield* chat.reply(requestFor("google", { reasoning_effort: "high" }))
        expect(first.item.text).toBe("")
        const [a, b] = first.item.tool_calls
        if (a === undefined || b === undefined) throw new Error("two calls expected")
        expect(a.id).not.toBe(b.id)
        fake.replyText("ok")
        yield* chat.reply(
          requestFor("google", {
            items: [
              prompt,
              first.item,
              {
                role: "tool",
                call_id: a.id,
                name: "bash",
                content: [{ type: "text", text: "A" }],
                is_error: false,
              },
              {
                role: "tool",
                call_id: b.id,
                name: "bash",
                content: [{ type: "text", text: "B" }],
                is_error: true,
              },
            ],
          }),
        )
        const contents = fake.lastChat().body.contents as Array<{ role: string; parts: unknown }>
        expect(contents[1]).toEqual({
          role: "model",
          parts: [
            { text: "Thinking about it", thought: true },
            { functionCall: { name: "bash", args: { command: "a" } }, thoughtSignature: "sig-g" },
            { functionCall: { name: "bash", args: { command: "b" } } },
          ],
        })
        expect(contents[2]?.parts).toEqual([
          { functionResponse: { name: "bash", response: { output: "A" } } },
          { functionResponse: { name: "bash", response: { error: "B" } } },
        ])
      }),
  )

  it.scoped("an id Gemini gave is kept and echoed", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(GoogleFake.make({ keys: [KEY] }))
      fake.replyToolCalls([{ name: "bash", arguments: {}, id: "g-1" }])
      const first = yield* chat.reply(requestFor("google"))
      expect(first.item.tool_calls[0]?.id).toBe("g-1")
      fake.replyText("ok")
      yield* chat.reply(
        requestFor("google", {
          items: [
            prompt,
            first.item,
            {
              role: "tool",
              call_id: "g-1",
              name: "bash",
              content: [{ type: "text", text: "A" }],
              is_error: false,
            },
          ],
        }),
      )
      const contents = fake.lastChat().body.contents as Array<{ parts: Array<Record<string, unknown>> }>
      expect(contents[2]?.parts[0]).toEqual({
        functionResponse: { id: "g-1", name: "bash", response: { output: "A" } },
      })
    }),
  )

  it.scoped("a wrong key (400 API_KEY_INVALID) is rejected; a blocked prompt or answer is refused", () =>
    Effect.gen(function* () {
      const { fake, chat } = yield* over(GoogleFake.make({ keys: [KEY] }))
      const wrong = failureOf(
        yield* Effect.exit(chat.reply(requestFor("google", { key: Redacted.make("AIza-wrong") }))),
      )
      expect(wrong).toMatchObject({ _tag: "VendorRejectedKey", status: 400 })
      fake.enqueue("generateContent", { json: { promptFeedback: { blockReason: "SAFETY" } } })
      expect(failureOf(yield* Effect.exit(chat.reply(requestFor("google"))))).toMatchObject({
        _tag: "ChatRefused",
        status: 200,
        message: "the prompt was blocked (SAFETY)",
      })
      fake.enqueue("generateContent", { json: { candidates: [{ finishReason: "SAFETY" }] } })
      expect(failureOf(yield* Effect.exit(chat.reply(requestFor("google"))))).toMatchObject({
        _tag: "ChatRefused",
        message: "the answer was blocked (SAFETY)",
      })
      fake.enqueue("generateContent", { json: { candidates: [{ finishReason: "MALFORMED_FUNCTION_CALL" }] } })
      expect(failureOf(yield* Effect.exit(chat.reply(requestFor("google"))))).toMatchObject({
        _tag: "VendorUnavailable",
      })
    }),
  )
})

describe("chat logs", () => {
  it.scoped("a turn and a failure are logged without the key, the prompt or the reply", () =>
    Effect.gen(function* () {
      const lines: Array<string> = []
      const { fake, chat } = yield* setUp("anthropic")
      fake.replyText("the secret answer", { input_tokens: 3, output_tokens: 4 })
      fake.replyError(400, AnthropicFake.error(400, "invalid_request_error", `bad request for ${KEY}`).json)
      const logged = <A, E>(effect: Effect.Effect<A, E>) =>
        effect.pipe(Effect.provide(Log.layerCollect(lines)), Logger.withMinimumLogLevel(LogLevel.All))
      yield* logged(chat.reply(requestFor("anthropic")))
      yield* logged(Effect.exit(chat.reply(requestFor("anthropic"))))
      const messages = lines.map((l) => JSON.stringify(JSON.parse(l).msg))
      expect(messages).toHaveLength(2)
      expect(messages[0]).toBe(JSON.stringify("vendor turn"))
      expect(messages[1]).toContain("vendor turn failed")
      expect(messages[1]).toContain("ChatRefused")
      expect(JSON.parse(lines[0] ?? "{}")).toMatchObject({
        vendor: "anthropic",
        stop: "end",
        output_tokens: 4,
      })
      for (const line of lines) {
        expectNoCanary(line)
        expect(line).not.toContain("secret answer")
        expect(line).not.toContain("hello")
      }
    }),
  )
})

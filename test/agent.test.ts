/**
 * The agent end to end through HTTP on the whole stack (`test/harness/Stack.ts`: nats-server, actor
 * worker with the agent supervisor, host agent with the namespace driver, gateway), the model
 * played by the vendor fakes of `test/fakes/` (real wire format, scripted per test): a function
 * with a provider runs, the loop turns the model's tool calls into `source: "agent"` commands,
 * `submit_result` delivers, and every failure path ends the run as the spec says. A custom tool
 * is served on loopback over HTTPS (a self-signed certificate trusted through
 * `HANGAR_AGENT_TOOL_CA_FILE`, loopback allowed by the test-only `HANGAR_AGENT_TOOL_ALLOW_PRIVATE`).
 */
import { spawnSync } from "node:child_process"
import { randomBytes } from "node:crypto"
import { mkdtemp, rm } from "node:fs/promises"
import { createServer, type Server } from "node:https"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Schema, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Kv from "../core/Kv.ts"
import { Storage } from "../core/Storage.ts"
import * as AnthropicFake from "./fakes/AnthropicFake.ts"
import type { FakeUsage } from "./fakes/FakeServer.ts"
import * as GoogleFake from "./fakes/GoogleFake.ts"
import * as OpenAiFake from "./fakes/OpenAiFake.ts"
import {
  call,
  closeStack,
  createAccount,
  expectStatus,
  type Json,
  publish,
  publishProvider,
  request,
  runLog,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
  waitRun,
} from "./harness/Stack.ts"
import { selfSigned } from "./harness/Tls.ts"

const KEY = "sk-test-agentKEY0123456789abcdefWXYZ"
const TOOL_SECRET = "tool-secret-0123456789"

let stack: Stack
let acct: TestAccount
let openai: OpenAiFake.OpenAiFake
let anthropic: AnthropicFake.AnthropicFake
let google: GoogleFake.GoogleFake
let provider: string
const providers: Record<string, string> = {}
let dir: string
let tool: ToolServer
const scope = Effect.runSync(Scope.make())

interface ToolCallSeen {
  readonly path: string
  readonly authorization: string
  readonly run: string
  readonly body: string
  readonly headers: ReadonlyArray<string>
}

interface ToolServer {
  readonly url: string
  readonly calls: Array<ToolCallSeen>
  readonly close: () => Promise<void>
}

/** A custom tool: `/ok` answers JSON, `/fail` 500, `/slow` never answers. */
const toolServer = async (tls: { key: Buffer; cert: Buffer }): Promise<ToolServer> => {
  const calls: Array<ToolCallSeen> = []
  const server: Server = createServer(tls, (req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      const path = req.url ?? ""
      calls.push({
        path,
        authorization: String(req.headers.authorization),
        run: String(req.headers["service-run"]),
        body: Buffer.concat(chunks).toString("utf8"),
        headers: Object.keys(req.headers),
      })
      if (path === "/ok")
        res.writeHead(200, { "content-type": "application/json" }).end('{"weather":"sunny"}')
      else if (path === "/fail") res.writeHead(500).end("tool broke")
      // /slow: no answer; the request is destroyed by the caller's timeout.
    })
  })
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok))
  const address = server.address()
  const port = typeof address === "object" && address !== null ? address.port : 0
  return {
    url: `https://127.0.0.1:${port}`,
    calls,
    close: () =>
      new Promise<void>((ok) => {
        server.closeAllConnections()
        server.close(() => ok())
      }),
  }
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "hangar-agent-test-"))
  const tls = await selfSigned(dir)
  tool = await toolServer(tls)
  openai = await Effect.runPromise(
    OpenAiFake.make({ keys: [KEY], models: ["gpt-fake", "gpt-5"] }).pipe(Scope.extend(scope)),
  )
  anthropic = await Effect.runPromise(
    AnthropicFake.make({ keys: [KEY], models: ["claude-sonnet-4-5-20250929"] }).pipe(Scope.extend(scope)),
  )
  google = await Effect.runPromise(
    GoogleFake.make({
      keys: [KEY],
      models: [
        { id: "gemini-2.5-pro", supportedGenerationMethods: ["generateContent"] },
        { id: "gemini-3-pro-preview", supportedGenerationMethods: ["generateContent"] },
      ],
    }).pipe(Scope.extend(scope)),
  )
  stack = await startStack({
    queueTimeoutMs: 120_000,
    logFlushMs: 500,
    settings: {
      OPENAI_BASE_URL: openai.url,
      ANTHROPIC_BASE_URL: anthropic.url,
      GOOGLE_BASE_URL: google.url,
      AGENT_LEASE_MS: 1500,
      AGENT_RENEW_MS: 300,
      AGENT_RETRY_BASE_MS: 50,
      AGENT_RETRY_MAX_MS: 200,
      AGENT_TOOL_ALLOW_PRIVATE: true,
      AGENT_TOOL_CA_FILE: tls.certFile,
    },
  })
  acct = await createAccount(stack, { creditUsd: 100 })
  provider = await publishProvider(
    stack,
    acct,
    "fake-openai",
    { provider: "openai", model: "gpt-fake", compact_at_tokens: 8000 },
    KEY,
  )
  for (const [vendor, model, compact] of [
    ["anthropic", "claude-sonnet-4-5-20250929", 50_000],
    ["google", "gemini-2.5-pro", 8000],
  ] as const) {
    providers[vendor] = await publishProvider(
      stack,
      acct,
      `fake-${vendor}`,
      { provider: vendor, model, compact_at_tokens: compact },
      KEY,
    )
  }
}, 180_000)

afterAll(async () => {
  try {
    await closeStack(stack)
  } finally {
    await tool?.close()
    await Effect.runPromise(Scope.close(scope, Exit.void))
    if (dir !== undefined) await rm(dir, { recursive: true, force: true })
  }
}, 120_000)

/** Lines of the stack's logs at warning or above (shown when a test fails). */
const problems = () =>
  stack.lines
    .filter((l) => /"level":"(warn|warning|error|fatal)"/i.test(l.line))
    .map((l) => `${l.role} ${l.line}`)
    .slice(-30)
    .join("\n")

/** A function with the OpenAI fake as its agent. */
const agentFunction = (definition: Record<string, unknown> = {}) =>
  publish(stack, acct, {
    provider,
    system_prompt: "You are a careful agent.",
    tools: ["bash", "read", "write", "edit"],
    output_manifest: [{ path: "result.txt" }],
    timeout_minutes: 10,
    ...definition,
  })

/** A `bash` tool call writing `text` into the run's output file, `result.txt`. */
const writeOutput = (id: string, text: string) => ({
  id,
  name: "bash",
  arguments: { command: `mkdir -p /workspace/out && echo ${text} > /workspace/out/result.txt` },
})

/** The run's commands, in sequence order. */
const commandsOf = async (run: string): Promise<Array<Json>> => {
  const list = expectStatus(
    await call(stack, "GET", `/v1/runs/${run}/commands`, acct.admin),
    200,
    "GET commands",
  )
  return [...list.commands].sort((a: Json, b: Json) => a.sequence - b.sequence)
}

/** One file of a `.tar.gz` archive. */
const fileIn = (archive: Buffer, path: string): string => {
  const listed = spawnSync("tar", ["-tzf", "-"], { input: archive }).stdout.toString("utf8").split("\n")
  const entry = listed.find((e) => e === path || e.endsWith(`/${path}`)) ?? path
  const r = spawnSync("tar", ["-xzOf", "-", entry], { input: archive })
  if (r.status !== 0) throw new Error(`tar: ${r.stderr.toString()}`)
  return r.stdout.toString("utf8")
}

/** The chats the fake received since `from` (an index into `openai.chats()`). */
const chatsSince = (from: number) => openai.chats().slice(from)

const ended = async (run: string, state: "succeeded" | "failed", timeoutMs = 90_000) => {
  const r = await waitRun(stack, acct, run, { timeoutMs }).catch(async (e) => {
    throw new Error(`${String(e)}\ncommands: ${JSON.stringify(await commandsOf(run))}\n${problems()}`)
  })
  expect(r.state, `${JSON.stringify(r)}\n${problems()}`).toBe(state)
  return r
}

const usage = (u: FakeUsage) => u

/** Keys KV `agents` holds for `run` (its record, lease, head and items). */
const agentKeys = (run: string) =>
  stack.run(
    Effect.gen(function* () {
      const { names } = yield* Storage
      const kv = yield* Kv.make(names.kv.agents.name, Schema.Unknown)
      return (yield* kv.keys(">")).filter((k) => k.includes(run))
    }),
  )

/** Waits (bounded) until the run's agent keys are gone: the owner removes them when the run ends. */
const agentCleared = async (run: string) => {
  const deadline = Date.now() + 20_000
  let keys = await agentKeys(run)
  while (keys.length > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100))
    keys = await agentKeys(run)
  }
  return keys
}

describe("the agent with OpenAI", () => {
  it("writes the output with bash, submits, and the run succeeds with the file and the usage the vendor reported", async () => {
    const fn = await agentFunction()
    const from = openai.chats().length
    openai.replyToolCalls(
      [
        {
          id: "call_a",
          name: "bash",
          arguments: {
            command: "mkdir -p /workspace/out && echo hello from the agent > /workspace/out/result.txt",
          },
        },
      ],
      usage({ input_tokens: 100, cache_read_tokens: 20, output_tokens: 30 }),
      { text: "I will write the file." },
    )
    openai.replyToolCalls(
      [{ id: "call_b", name: "submit_result", arguments: { summary: "wrote result.txt" } }],
      usage({ input_tokens: 150, cache_read_tokens: 40, output_tokens: 10 }),
    )
    const started = await startRun(stack, acct, fn.function, { prompt: "Write hello into result.txt." })
    const run = await ended(started.id, "succeeded")
    expect(run.message).toBe("wrote result.txt")
    expect(run.usage.model).toEqual({
      calls: 2,
      input_tokens: 250,
      cache_read_tokens: 60,
      cache_write_tokens: 0,
      output_tokens: 40,
      web_searches: 0,
    })
    const archive = await request(run.output.url)
    expect(archive.status).toBe(200)
    expect(fileIn(archive.data, "result.txt")).toBe("hello from the agent\n")

    // What the model saw: the system prompt, the prompt word for word, the tools, the bash result.
    const chats = chatsSince(from)
    expect(chats).toHaveLength(2)
    expect(chats[0]!.system).toBe("You are a careful agent.")
    expect(chats[0]!.userTexts[0]).toBe("Write hello into result.txt.")
    expect([...chats[0]!.tools].sort()).toEqual(["bash", "edit", "read", "submit_result", "write"])
    expect(chats[0]!.webSearch).toBe(false)
    expect(chats[1]!.toolResults).toHaveLength(1)
    expect(chats[1]!.toolResults[0]!.id).toBe("call_a")
    expect(chats[1]!.toolResults[0]!.text).toContain('"exit_code":0')

    // Every tool call was one command of the agent's.
    const commands = await commandsOf(started.id)
    expect(commands.map((c) => [c.kind, c.source, c.state])).toEqual([
      ["bash", "agent", "succeeded"],
      ["finish", "agent", "succeeded"],
    ])
    expect(commands[1].arguments).toEqual({ state: "succeeded", detail: "wrote result.txt" })
    // The run ended: its loop stopped and the conversation, lease and record are gone.
    expect(await agentCleared(started.id)).toEqual([])

    // The run log holds the model's messages (each turn once, in order) and each tool call with its
    // result. (The two come by different paths, so how they interleave is not asserted.)
    const lines = await runLog(stack, acct, started.id)
    const said = lines.filter((l) => l.kind === "assistant")
    expect(said.map((l) => [l.turn, l.text, l.tool_calls])).toEqual([
      [1, "I will write the file.", ["bash"]],
      [2, "", ["submit_result"]],
    ])
    const calls = lines.filter((l) => l.kind === "tool_call")
    expect(calls.map((l) => [l.name, l.state, l.result.exit_code])).toEqual([["bash", "succeeded", 0]])
  }, 120_000)

  it("with a reasoning model, each turn's reasoning goes back with its id and the item it led to, and the run succeeds", async () => {
    const reasoning = await publishProvider(
      stack,
      acct,
      "fake-openai-reasoning",
      { provider: "openai", model: "gpt-5", reasoning_effort: "medium", compact_at_tokens: 8000 },
      KEY,
    )
    const fn = await agentFunction({ provider: reasoning })
    const from = openai.chats().length
    openai.replyToolCalls(
      [{ id: "call_r1", name: "bash", arguments: { command: "echo one > /workspace/out/result.txt" } }],
      usage({ input_tokens: 100, output_tokens: 30 }),
      { reasoning: "enc-turn-1", text: "Writing." },
    )
    openai.replyToolCalls(
      [{ id: "call_r2", name: "bash", arguments: { command: "cat /workspace/out/result.txt" } }],
      usage({ input_tokens: 150, output_tokens: 20 }),
      { reasoning: "enc-turn-2" },
    )
    openai.replyToolCalls(
      [{ id: "call_r3", name: "submit_result", arguments: { summary: "done" } }],
      usage({ input_tokens: 200, output_tokens: 10 }),
      { reasoning: "enc-turn-3" },
    )
    const started = await startRun(stack, acct, fn.function, { prompt: "Write one." })
    const run = await ended(started.id, "succeeded")
    expect(run.message).toBe("done")
    const chats = chatsSince(from)
    expect(chats).toHaveLength(3)
    expect(chats[0]!.body.include).toEqual(["reasoning.encrypted_content"])
    expect(chats[0]!.body.reasoning).toEqual({ effort: "medium" })
    // The third turn carries both earlier reasonings, each with its id, each before its own items.
    const input = chats[2]!.body.input as Array<Record<string, unknown>>
    const kinds = input.map((i) => String(i.type ?? i.role))
    expect(kinds).toEqual([
      "user",
      "reasoning",
      "message",
      "function_call",
      "function_call_output",
      "reasoning",
      "function_call",
      "function_call_output",
    ])
    const reasonings = input.filter((i) => i.type === "reasoning")
    expect(reasonings.map((r) => r.encrypted_content)).toEqual(["enc-turn-1", "enc-turn-2"])
    for (const r of reasonings) expect(String(r.id)).toMatch(/^rs_/)
  }, 120_000)

  it("bad arguments and unknown tools go back as errors and run nothing", async () => {
    const fn = await agentFunction({ tools: ["bash"] })
    const from = openai.chats().length
    openai.replyToolCalls([
      { id: "e1", name: "bash", arguments: { cmd: "ls" } },
      { id: "e2", name: "write", arguments: { file_path: "/tmp/x", content: "not offered" } },
      { id: "e3", name: "teleport", arguments: {} },
      { id: "e4", name: "submit_result", arguments: {} },
    ])
    openai.replyToolCalls([
      writeOutput("ok", "x"),
      { id: "s", name: "submit_result", arguments: { summary: "fine" } },
    ])
    const started = await startRun(stack, acct, fn.function)
    await ended(started.id, "succeeded")
    const results = new Map(chatsSince(from)[1]!.toolResults.map((t) => [t.id, t.text]))
    expect(results.get("e1")).toContain("invalid arguments")
    expect(results.get("e2")).toContain('no tool named "write"')
    expect(results.get("e3")).toContain('no tool named "teleport"')
    expect(results.get("e4")).toContain("invalid arguments")
    expect((await commandsOf(started.id)).map((c) => c.kind)).toEqual(["bash", "finish"])
  }, 120_000)

  it("sends manifest problems back; the model fixes them and the run succeeds", async () => {
    const fn = await agentFunction()
    const from = openai.chats().length
    openai.replyToolCalls([{ id: "s1", name: "submit_result", arguments: { summary: "too early" } }])
    openai.replyToolCalls([
      { id: "w1", name: "write", arguments: { file_path: "/workspace/out/result.txt", content: "fixed\n" } },
    ])
    openai.replyToolCalls([{ id: "s2", name: "submit_result", arguments: { summary: "fixed it" } }])
    const started = await startRun(stack, acct, fn.function)
    const run = await ended(started.id, "succeeded")
    expect(run.message).toBe("fixed it")
    const chats = chatsSince(from)
    expect(chats).toHaveLength(3)
    const refused = chats[1]!.toolResults.find((t) => t.id === "s1")!
    expect(refused.text).toContain("not accepted")
    expect(refused.text).toContain("result.txt")
    expect(fileIn((await request(run.output.url)).data, "result.txt")).toBe("fixed\n")
  }, 120_000)

  it("fails no_submission when the model stops without delivering, after one reminder", async () => {
    const fn = await agentFunction()
    const from = openai.chats().length
    openai.replyText("All done, I think.")
    openai.replyText("I have nothing more to add.")
    const started = await startRun(stack, acct, fn.function)
    const run = await ended(started.id, "failed")
    expect(run.failure).toBe("no_submission")
    expect(run.detail).toContain("I have nothing more to add.")
    const chats = chatsSince(from)
    expect(chats).toHaveLength(2)
    expect(chats[1]!.userTexts.at(-1)).toContain("submit_result")
  }, 120_000)

  it("fails provider with the vendor's words when the vendor refuses the key", async () => {
    const fn = await agentFunction()
    openai.replyError(
      401,
      OpenAiFake.error(
        401,
        "Incorrect API key provided: sk-test-********WXYZ. You can find your API key at https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        "invalid_api_key",
      ).json,
    )
    const started = await startRun(stack, acct, fn.function)
    const run = await ended(started.id, "failed")
    expect(run.failure).toBe("provider")
    expect(run.detail).toContain("Incorrect API key provided")
    expect(run.detail).not.toContain(KEY)
    expect(await commandsOf(started.id)).toEqual([])
  }, 120_000)

  it("fails provider with the vendor's words when the vendor refuses the request for good", async () => {
    const fn = await agentFunction()
    openai.replyError(
      400,
      OpenAiFake.error(400, "Invalid value for 'reasoning.effort': 'huge'.", "invalid_request_error").json,
    )
    const started = await startRun(stack, acct, fn.function)
    const run = await ended(started.id, "failed")
    expect(run.failure).toBe("provider")
    expect(run.detail).toContain("Invalid value for 'reasoning.effort'")
  }, 120_000)

  it("a turn whose stream is cut mid-way is asked again and counted once", async () => {
    const fn = await agentFunction()
    const from = openai.chats().length
    const write = writeOutput("cut_1", "streamed")
    openai.replyToolCalls([write], usage({ input_tokens: 100, output_tokens: 10 }), { cutAfter: 3 })
    openai.replyToolCalls([write], usage({ input_tokens: 100, output_tokens: 10 }))
    openai.replyToolCalls(
      [{ id: "cut_2", name: "submit_result", arguments: { summary: "after the cut" } }],
      usage({ input_tokens: 120, output_tokens: 5 }),
    )
    const started = await startRun(stack, acct, fn.function)
    const run = await ended(started.id, "succeeded")
    expect(run.message).toBe("after the cut")
    expect(
      openai
        .chats()
        .slice(from)
        .every((c) => c.body.stream === true),
    ).toBe(true)
    expect(openai.chats().length - from).toBe(3)
    // The cut answer is not counted: two calls, their tokens once.
    expect(run.usage.model).toMatchObject({ calls: 2, input_tokens: 220, output_tokens: 15 })
    const commands = await commandsOf(started.id)
    expect(commands.filter((c) => c.kind === "bash")).toHaveLength(1)
  }, 120_000)

  it("retries a vendor that answers 503 and goes on", async () => {
    const fn = await agentFunction()
    const from = openai.requests.length
    // Scripted before the start, on the model's route alone (the catalog and other requests are
    // not hit): armed once the run was seen running, the first ask could come before it and get
    // the fake's "nothing scripted" 500, a fifth request.
    const overloaded = { status: 503, json: { error: { message: "overloaded", type: "server_error" } } }
    openai.enqueue("responses", overloaded, overloaded)
    openai.replyToolCalls([writeOutput("b", "ok")])
    openai.replyToolCalls([{ id: "s", name: "submit_result", arguments: { summary: "after retries" } }])
    const started = await startRun(stack, acct, fn.function)
    const run = await ended(started.id, "succeeded")
    expect(run.message).toBe("after retries")
    const chatRequests = openai.requests.slice(from).filter((r) => r.path === "/v1/responses")
    expect(chatRequests.length).toBe(4)
    expect(run.usage.model.calls).toBe(2)
  }, 120_000)
})

describe("the other vendors", () => {
  for (const vendor of ["anthropic", "google"] as const) {
    it(`${vendor}: writes the output with bash, submits, and the usage is what the vendor reported`, async () => {
      const fake = vendor === "anthropic" ? anthropic : google
      const fn = await agentFunction({ provider: providers[vendor] })
      const from = fake.chats().length
      fake.replyToolCalls(
        [writeOutput("toolu_1", `${vendor}`)],
        usage({
          input_tokens: 70,
          cache_read_tokens: 5,
          cache_write_tokens: vendor === "anthropic" ? 9 : 0,
          output_tokens: 11,
        }),
      )
      fake.replyToolCalls(
        [{ id: "toolu_2", name: "submit_result", arguments: { summary: `done by ${vendor}` } }],
        usage({ input_tokens: 80, output_tokens: 12 }),
      )
      const started = await startRun(stack, acct, fn.function, { prompt: `Say ${vendor}.` })
      const run = await ended(started.id, "succeeded")
      expect(run.message).toBe(`done by ${vendor}`)
      expect(run.usage.model).toEqual({
        calls: 2,
        input_tokens: 150,
        cache_read_tokens: 5,
        cache_write_tokens: vendor === "anthropic" ? 9 : 0,
        output_tokens: 23,
        web_searches: 0,
      })
      expect(fileIn((await request(run.output.url)).data, "result.txt")).toBe(`${vendor}\n`)
      const chats = fake.chats().slice(from)
      expect(chats).toHaveLength(2)
      expect(chats[0]!.system).toBe("You are a careful agent.")
      expect(chats[0]!.userTexts[0]).toBe(`Say ${vendor}.`)
      expect(chats[1]!.toolResults).toHaveLength(1)
      expect(chats[1]!.toolResults[0]!.text).toContain('"exit_code":0')
    }, 120_000)
  }
})

describe("quotas and rate limits", () => {
  it("google: a daily quota spent fails the run provider at once with Google's words; a per-minute limit is waited out", async () => {
    const fn = await agentFunction({ provider: providers.google })
    // Each run's answers are scripted before it starts, on the model's route alone (the catalog
    // and other requests are not hit; armed once a run was seen running, its first ask could
    // come before them and get the fake's "nothing scripted" 500, one ask more).
    google.enqueue("generateContent", GoogleFake.quotaExhausted())
    let started = await startRun(stack, acct, fn.function)
    const spent = await ended(started.id, "failed")
    expect(spent.failure).toBe("provider")
    expect(spent.detail).toContain("You exceeded your current quota")

    const from = google.requests.length
    google.enqueue("generateContent", GoogleFake.rateLimited("1s"))
    google.replyToolCalls([writeOutput("q1", "ok")])
    google.replyToolCalls([{ id: "q2", name: "submit_result", arguments: { summary: "after the wait" } }])
    started = await startRun(stack, acct, fn.function)
    const run = await ended(started.id, "succeeded")
    expect(run.message).toBe("after the wait")
    // The limited call, then the next one no sooner than the RetryInfo asked (the loop's own backoff
    // here is 50–200 ms).
    const turns = google.requests.slice(from).filter((r) => r.path.endsWith(":streamGenerateContent"))
    expect(turns).toHaveLength(3)
    expect(turns[1]!.at - turns[0]!.at).toBeGreaterThanOrEqual(1000)
  }, 120_000)
})

describe("google web search with functions", () => {
  it("gemini 2.5 runs without search and says so in the run log; gemini 3 searches with the documented opt-in", async () => {
    const three = await publishProvider(
      stack,
      acct,
      "fake-gemini-3",
      { provider: "google", model: "gemini-3-pro-preview", compact_at_tokens: 8000 },
      KEY,
    )
    for (const [provider, searches] of [
      [providers.google, false],
      [three, true],
    ] as const) {
      const fn = await agentFunction({ provider, tools: ["bash", "read", "write", "edit", "web_search"] })
      const from = google.chats().length
      google.replyToolCalls([writeOutput("w1", "found")])
      google.replyToolCalls([{ id: "w2", name: "submit_result", arguments: { summary: "searched" } }])
      const started = await startRun(stack, acct, fn.function)
      const run = await ended(started.id, "succeeded")
      const chats = google.chats().slice(from)
      expect(chats).toHaveLength(2)
      for (const chat of chats) {
        expect(chat.webSearch).toBe(searches)
        expect(chat.body.toolConfig).toEqual(
          searches ? { includeServerSideToolInvocations: true } : undefined,
        )
      }
      // The whole log (the route answers an ended run's log whole).
      const lines = await runLog(stack, acct, run.id)
      const notices = lines.filter((l) => l.kind === "notice")
      if (searches) expect(notices).toEqual([])
      else {
        expect(notices).toHaveLength(1)
        expect(notices[0].text).toContain("web search is left out: gemini-2.5-pro")
      }
    }
  }, 180_000)
})

describe("screenshots, web search and compaction", () => {
  // A 1x1 PNG; the test base has no display, so the test puts a `screenshot` that copies it.
  const PIXEL =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

  it("a screenshot reaches the model as an image; web searches are offered and counted", async () => {
    const fn = await agentFunction({ tools: ["bash", "read", "write", "edit", "screenshot", "web_search"] })
    const from = openai.chats().length
    openai.replyToolCalls([
      {
        id: "setup",
        name: "bash",
        arguments: {
          command: `printf '%s' '${PIXEL}' | base64 -d > /tmp/pixel.png && printf '#!/bin/sh\\ncp /tmp/pixel.png "$1"\\n' > /usr/local/bin/screenshot && chmod 755 /usr/local/bin/screenshot`,
        },
      },
    ])
    openai.replyToolCalls([{ id: "shot", name: "screenshot", arguments: {} }], usage({ web_searches: 2 }))
    openai.replyToolCalls([
      writeOutput("w", "seen"),
      { id: "s", name: "submit_result", arguments: { summary: "looked" } },
    ])
    const started = await startRun(stack, acct, fn.function)
    const run = await ended(started.id, "succeeded")
    expect(run.usage.model.web_searches).toBe(2)
    const chats = chatsSince(from)
    expect(chats).toHaveLength(3)
    expect(chats[0]!.webSearch).toBe(true)
    expect(chats[0]!.tools).toContain("screenshot")
    expect(chats[0]!.tools).not.toContain("web_search")
    const shot = chats[2]!.toolResults.find((t) => t.id === "shot")!
    expect(shot.images).toEqual([PIXEL])
    expect(
      (await commandsOf(started.id)).map((c) => [
        c.kind,
        c.arguments.command ?? c.arguments.file_path ?? c.arguments.state,
      ]),
    ).toEqual([
      ["bash", expect.stringContaining("base64 -d")],
      ["bash", "screenshot /tmp/screen.png"],
      ["read", "/tmp/screen.png"],
      ["bash", expect.stringContaining("echo seen")],
      ["finish", "succeeded"],
    ])
  }, 120_000)

  it("a read of a JPEG reaches the model as a JPEG", async () => {
    // SOI, a baseline frame header of 1x1 pixels, EOI: what `read` looks at to call it an image.
    const JPEG = "/9j/wAALCAABAAEBAREA/9k="
    const fn = await agentFunction()
    const from = openai.chats().length
    openai.replyToolCalls([
      { id: "make", name: "bash", arguments: { command: `printf '%s' '${JPEG}' | base64 -d > /tmp/p.jpg` } },
    ])
    openai.replyToolCalls([{ id: "look", name: "read", arguments: { file_path: "/tmp/p.jpg" } }])
    openai.replyToolCalls([
      writeOutput("w", "seen"),
      { id: "s", name: "submit_result", arguments: { summary: "looked" } },
    ])
    const started = await startRun(stack, acct, fn.function)
    await ended(started.id, "succeeded")
    const chats = chatsSince(from)
    const look = chats[2]!.toolResults.find((t) => t.id === "look")!
    expect(look).toMatchObject({ images: [JPEG], isError: false })
    expect(JSON.stringify(chats[2]!.body)).toContain(`data:image/jpeg;base64,${JPEG}`)
  }, 120_000)

  it("compacts at compact_at_tokens and goes on from the summary", async () => {
    const fn = await agentFunction()
    const from = openai.chats().length
    // 9000 + 100 tokens of context: past the provider's 8000.
    openai.replyToolCalls([writeOutput("w", "long")], usage({ input_tokens: 9000, output_tokens: 100 }))
    openai.replyText(
      "SUMMARY: result.txt is written; submit next.",
      usage({ input_tokens: 9100, output_tokens: 20 }),
    )
    openai.replyToolCalls([{ id: "s", name: "submit_result", arguments: { summary: "after compaction" } }])
    const started = await startRun(stack, acct, fn.function, { prompt: "A long task." })
    const run = await ended(started.id, "succeeded")
    expect(run.message).toBe("after compaction")
    expect(run.usage.model.calls).toBe(3)
    const chats = chatsSince(from)
    expect(chats).toHaveLength(3)
    // The compaction request: the conversation so far, then the request for a summary.
    expect(chats[1]!.toolResults.map((t) => t.id)).toEqual(["w"])
    expect(chats[1]!.userTexts.at(-1)).toContain("summary")
    // The next turn starts from the summary alone.
    expect(chats[2]!.toolResults).toEqual([])
    expect(chats[2]!.userTexts.join("\n")).toContain("SUMMARY: result.txt is written")
    expect(chats[2]!.userTexts.join("\n")).not.toContain("A long task.")
  }, 120_000)
})

describe("custom tools", () => {
  it("carry the bearer secret and Service-Run; a 500, a timeout and bad arguments reach the model as errors", async () => {
    const schema = (props: Record<string, unknown>) => ({
      type: "object",
      properties: props,
      required: Object.keys(props),
      additionalProperties: false,
    })
    const fn = await agentFunction({
      custom_tools: [
        {
          name: "weather",
          description: "The weather.",
          parameters: schema({ city: { type: "string" } }),
          url: `${tool.url}/ok`,
          secret: TOOL_SECRET,
        },
        {
          name: "broken",
          description: "Always fails.",
          parameters: schema({}),
          url: `${tool.url}/fail`,
          secret: TOOL_SECRET,
        },
        {
          name: "slow",
          description: "Never answers.",
          parameters: schema({}),
          url: `${tool.url}/slow`,
          secret: TOOL_SECRET,
          timeout_seconds: 1,
        },
      ],
    })
    const from = openai.chats().length
    const before = tool.calls.length
    openai.replyToolCalls([
      { id: "t1", name: "weather", arguments: { city: "Paris" } },
      { id: "t2", name: "weather", arguments: { town: "Paris" } },
      { id: "t3", name: "broken", arguments: {} },
      { id: "t4", name: "slow", arguments: {} },
    ])
    openai.replyToolCalls([writeOutput("b", "sunny")])
    openai.replyToolCalls([{ id: "s", name: "submit_result", arguments: { summary: "checked the weather" } }])
    const started = await startRun(stack, acct, fn.function)
    await ended(started.id, "succeeded")

    const calls = tool.calls.slice(before)
    expect(calls.map((c) => c.path)).toEqual(["/ok", "/fail", "/slow"])
    for (const c of calls) {
      expect(c.authorization).toBe(`Bearer ${TOOL_SECRET}`)
      expect(c.run).toBe(started.id)
      // No tracing headers leave for a tool.
      for (const name of ["traceparent", "tracestate", "b3"]) expect(c.headers).not.toContain(name)
    }
    expect(JSON.parse(calls[0]!.body)).toEqual({ city: "Paris" })

    const results = new Map(chatsSince(from)[1]!.toolResults.map((t) => [t.id, t]))
    expect(results.get("t1")!.text).toContain('"weather":"sunny"')
    expect(results.get("t2")!.text).toContain("invalid arguments")
    expect(results.get("t3")!.text).toContain("HTTP 500")
    expect(results.get("t4")!.text).toContain("no answer within 1 seconds")
    for (const id of ["t2", "t3", "t4"]) expect(results.get(id)!.text).not.toContain(TOOL_SECRET)
    // Custom tools are not commands.
    expect((await commandsOf(started.id)).map((c) => c.kind)).toEqual(["bash", "finish"])
  }, 120_000)
})

describe("durability", () => {
  it("a killed worker's loop resumes elsewhere: the run succeeds and every agent command ran once", async () => {
    const fn = await agentFunction()
    const marker = randomBytes(4).toString("hex")
    openai.replyToolCalls([
      {
        id: "slow",
        name: "bash",
        arguments: {
          command: `mkdir -p /workspace/out; sleep 4; echo one-${marker} >> /workspace/out/result.txt`,
        },
      },
    ])
    openai.replyToolCalls([
      { id: "next", name: "bash", arguments: { command: `echo two-${marker} >> /workspace/out/result.txt` } },
    ])
    openai.replyToolCalls([{ id: "s", name: "submit_result", arguments: { summary: "survived" } }])
    const started = await startRun(stack, acct, fn.function)
    const run = started.id as string

    // Kill the worker while the first command runs.
    const deadline = Date.now() + 60_000
    while (Date.now() < deadline) {
      const commands = await commandsOf(run)
      if (commands.some((c) => c.state === "running")) break
      await new Promise((r) => setTimeout(r, 100))
    }
    await stack.killActors()
    await stack.startActors()

    const done = await ended(run, "succeeded")
    expect(done.message).toBe("survived")
    expect(fileIn((await request(done.output.url)).data, "result.txt")).toBe(`one-${marker}\ntwo-${marker}\n`)
    const commands = await commandsOf(run)
    expect(commands.map((c) => [c.kind, c.source, c.state])).toEqual([
      ["bash", "agent", "succeeded"],
      ["bash", "agent", "succeeded"],
      ["finish", "agent", "succeeded"],
    ])
    expect(stack.lines.some((l) => l.line.includes("agent loop resumed"))).toBe(true)
  }, 180_000)
})

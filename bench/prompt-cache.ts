/**
 * Prompt caching through the whole stack (`test/harness/Stack.ts`, namespace driver): one agent run
 * on an Anthropic provider whose model calls `bash` for `turns` turns (each printing about 1 KB),
 * then submits. The Anthropic fake counts usage as Anthropic's prompt cache would
 * (`AnthropicFake.promptCache`: reads at block boundaries up to the last breakpoint, writes at
 * breakpoints, 1,024-token minimum), so the figures measure where the client puts its breakpoints.
 * Printed per turn: the share of the prompt read from cache; and over the turns after the second.
 * Baseline in the same run: the same requests with their breakpoints taken out (what the client sent
 * before it placed any), counted by a fresh cache.
 * Goal: at least 80 % of input tokens read from cache after turn 2. Prints figures; asserts nothing.
 *
 *   node --import tsx bench/prompt-cache.ts [turns=20]
 */
import { Effect, Exit, Scope } from "effect"
import * as AnthropicFake from "../test/fakes/AnthropicFake.ts"
import {
  call,
  createAccount,
  expectStatus,
  publish,
  startRun,
  startStack,
  waitRun,
} from "../test/harness/Stack.ts"

const turns = Number(process.argv[2] ?? 20)
const KEY = "sk-ant-bench-cacheKEY0123456789abcdefWXYZ"
const MODEL = "claude-sonnet-4-5-20250929"

const scope = Effect.runSync(Scope.make())
const fake = await Effect.runPromise(
  AnthropicFake.make({ keys: [KEY], models: [MODEL], promptCache: true }).pipe(Scope.extend(scope)),
)
const stack = await startStack({ settings: { ANTHROPIC_BASE_URL: fake.url } })
try {
  const acct = await createAccount(stack, { creditUsd: 100 })
  const made = expectStatus(
    await call(stack, "POST", "/v1/providers", acct.admin, {
      name: "bench",
      model: { provider: "anthropic", model: MODEL, compact_at_tokens: 1_000_000 },
      key: KEY,
    }),
    201,
    "POST /v1/providers",
  )
  const fn = await publish(stack, acct, {
    provider: `${made.id}@latest`,
    // A system prompt of a realistic size (about 1,500 tokens).
    system_prompt: `You are a careful engineer. ${"Follow the task, check each step, and keep notes. ".repeat(110)}`,
    tools: ["bash", "read", "write", "edit"],
    output_manifest: [{ path: "result.txt" }],
  })
  for (let i = 0; i < turns; i++)
    fake.replyToolCalls(
      [{ id: `c${i}`, name: "bash", arguments: { command: `seq ${i * 1000} ${i * 1000 + 250}` } }],
      {
        output_tokens: 40,
      },
    )
  fake.replyToolCalls([
    {
      id: "w",
      name: "bash",
      arguments: { command: "mkdir -p /workspace/out && echo ok > /workspace/out/result.txt" },
    },
  ])
  fake.replyToolCalls([{ id: "s", name: "submit_result", arguments: { summary: "bench" } }])
  const started = await startRun(stack, acct, fn.function)
  const ended = await waitRun(stack, acct, started.id, { timeoutMs: 600_000 })
  if (ended.state !== "succeeded") throw new Error(`the run ended ${ended.state}: ${ended.detail}`)

  // The same counting over the requests the fake received, and over them without breakpoints.
  const bodies = fake.chats().map((c) => c.body)
  const withBreakpoints = AnthropicFake.promptCache()
  const without = AnthropicFake.promptCache()
  const strip = (value: unknown): unknown =>
    Array.isArray(value)
      ? value.map(strip)
      : typeof value === "object" && value !== null
        ? Object.fromEntries(
            Object.entries(value)
              .filter(([k]) => k !== "cache_control")
              .map(([k, v]) => [k, strip(v)]),
          )
        : value
  const share = (u: { read: number; write: number; input: number }) => u.read / (u.read + u.write + u.input)
  const rows = bodies.map((b) => ({
    cached: withBreakpoints(b),
    plain: without(strip(b) as Record<string, unknown>),
  }))
  console.log(
    `prompt cache over ${rows.length} turns of one agent run (Anthropic fake counting as its cache would)`,
  )
  for (const [i, r] of rows.entries())
    console.log(
      `  turn ${String(i + 1).padStart(2)}: prompt ${r.cached.read + r.cached.write + r.cached.input} tokens, read from cache ${(share(r.cached) * 100).toFixed(1)} % (written ${r.cached.write}); without breakpoints ${(share(r.plain) * 100).toFixed(1)} %`,
    )
  const after = rows.slice(2)
  const total = (pick: (r: (typeof rows)[number]) => { read: number; write: number; input: number }) =>
    after.reduce(
      (a, r) => ({
        read: a.read + pick(r).read,
        write: a.write + pick(r).write,
        input: a.input + pick(r).input,
      }),
      { read: 0, write: 0, input: 0 },
    )
  console.log(
    `after turn 2: ${(share(total((r) => r.cached)) * 100).toFixed(1)} % of input tokens read from cache (goal ≥ 80 %); baseline without breakpoints ${(share(total((r) => r.plain)) * 100).toFixed(1)} %`,
  )
  console.log(`run usage as reported: ${JSON.stringify(ended.usage.model)}`)
} finally {
  await stack.close()
  await Effect.runPromise(Scope.close(scope, Exit.void))
}

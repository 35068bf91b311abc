/**
 * Agent loop overhead through the whole stack (`test/harness/Stack.ts`, namespace driver) with the
 * OpenAI fake answering at once: one run whose model calls `bash true` for `turns` turns, then
 * writes the output and submits. The overhead of a turn is the loop's own time from a vendor reply
 * arriving to the next request leaving, without the time its tool calls took (the loop logs it as
 * `overhead_ms` on its `agent turn` line: persisting the reply, sending usage, adding the command,
 * persisting the result). Printed beside the whole turn (reply to reply, tool included) p50/p99.
 * Goal: overhead p50 < 10 ms. Prints figures; asserts nothing.
 *
 *   node --import tsx bench/agent.ts [turns=200]
 */
import { Effect, Exit, Scope } from "effect"
import * as OpenAiFake from "../test/fakes/OpenAiFake.ts"
import {
  call,
  createAccount,
  expectStatus,
  publish,
  startRun,
  startStack,
  waitRun,
} from "../test/harness/Stack.ts"

const turns = Number(process.argv[2] ?? 200)
const KEY = "sk-bench-agentKEY0123456789abcdefWXYZ"

const pct = (xs: Array<number>, p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] as number
}
const ms = (n: number) => `${n.toFixed(2)} ms`

const scope = Effect.runSync(Scope.make())
const fake = await Effect.runPromise(
  OpenAiFake.make({ keys: [KEY], models: ["gpt-fake"] }).pipe(Scope.extend(scope)),
)
const stack = await startStack({ settings: { OPENAI_BASE_URL: fake.url } })
try {
  const acct = await createAccount(stack, { creditUsd: 100 })
  const made = expectStatus(
    await call(stack, "POST", "/v1/providers", acct.admin, {
      name: "bench",
      model: { provider: "openai", model: "gpt-fake", compact_at_tokens: 1_000_000 },
      key: KEY,
    }),
    201,
    "POST /v1/providers",
  )
  const fn = await publish(stack, acct, {
    provider: `${made.id}@latest`,
    tools: ["bash"],
    output_manifest: [{ path: "result.txt" }],
  })
  for (let i = 0; i < turns; i++)
    fake.replyToolCalls([{ id: `c${i}`, name: "bash", arguments: { command: "true" } }], { input_tokens: 10 })
  fake.replyToolCalls([
    {
      id: "w",
      name: "bash",
      arguments: { command: "mkdir -p /workspace/out && echo ok > /workspace/out/result.txt" },
    },
    { id: "s", name: "submit_result", arguments: { summary: "bench" } },
  ])
  const started = await startRun(stack, acct, fn.function)
  const ended = await waitRun(stack, acct, started.id, { timeoutMs: 600_000 })
  if (ended.state !== "succeeded") throw new Error(`the run ended ${ended.state}: ${ended.detail}`)

  const lines = stack.lines
    .filter((l) => l.line.includes('"agent turn"') && l.line.includes(started.id))
    .map((l) => JSON.parse(l.line) as { at: string; overhead_ms: number })
  const overhead = lines.map((l) => Number(l.overhead_ms))
  // Whole turns, tool included: one turn line to the next (millisecond timestamps).
  const at = lines.map((l) => Date.parse(l.at))
  const whole = at.slice(1).map((t, i) => t - at[i]!)

  console.log(`agent turns: ${overhead.length} (fake answering at once, bash true per turn)`)
  console.log(
    `  loop overhead per turn (reply in → next request out, tools excluded): p50 ${ms(pct(overhead, 50))}  p99 ${ms(pct(overhead, 99))}  (goal p50 < 10 ms)`,
  )
  if (whole.length > 0)
    console.log(
      `  whole turn (request to request, tool included): p50 ${ms(pct(whole, 50))}  p99 ${ms(pct(whole, 99))}`,
    )
  console.log(`  run usage: ${JSON.stringify(ended.usage.model)}`)
} finally {
  await stack.close()
  await Effect.runPromise(Scope.close(scope, Exit.void))
}

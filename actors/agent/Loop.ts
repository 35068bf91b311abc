/**
 * The agent loop (DESIGN.md "agent loop"; issue 8): one fiber per run with an agent, in an actor
 * worker, never in the guest (the vendor key and custom-tool secrets never enter the machine). It
 * acts on the run only through commands with `source: "agent"`, exactly as a caller would.
 *
 * Life: the run actor writes `r.<run>` in KV `agents` when a run whose provider is not `none` is
 * ready, and deletes it when the run ends. Every worker's supervisor (`Supervisor.ts`) watches
 * those records and leases (`l.<run>`, compare-and-set, renewed, expiring like partition leases);
 * a run without a live lease is claimed and its loop started here; the end of the run, or a lost
 * lease, interrupts it. A dead worker's loops resume on another worker from the last persisted
 * item.
 *
 * Inputs, read at every (re)start: the run (KV `runs`), its function version (system prompt,
 * tools, custom tools), the provider version the run resolved (`prv_<id>@<n>`: vendor, model,
 * effort, output limit, `compact_at_tokens`) and its key, opened from `Secrets` as `Redacted`. The
 * run's `prompt` is the first user item, word for word; the system prompt is the instructions.
 *
 * A turn: compact first when the last reply's `context_tokens` reached `compact_at_tokens`
 * (`Chat.compact`; its item replaces everything before it), then ask the model (`Chat.reply`),
 * append its item, persist, send the run actor `Usage` (the running totals, message id
 * `usage:<run>:<turn>`, so the run shows usage while it works), then run its tool calls in order,
 * persisting each result as it comes.
 *
 * Durability (`Store.ts`): the conversation is append-only items (sealed for the account) plus a
 * head written by compare-and-set on the revision this loop last wrote — the loop's fence: a
 * loop whose head write conflicts has been replaced and stops. The model's reply is persisted
 * before its tools run, so a resumed loop never asks the model again for a reply it already had.
 * A tool call of turn `t` with call id `c` is the command `derivedId("cmd", "<run>:<t>:<c>")`
 * (screenshot: `…:capture` and `…:read` appended); the run actor's `AddCommand` is idempotent by id and answers the stored record, so a resumed loop waits
 * for the command its predecessor sent instead of running it again. Waits are KV waits on the
 * command's record (`awaitValue`), never sleeps. A custom tool call whose result was not persisted
 * before a crash is made again (it is not a command; receivers see the same `Service-Run`).
 *
 * Tool calls (`Tools.ts`, `CustomTools.ts`): arguments that do not fit a tool's schema, and unknown
 * tools, go back as the tool's error without running anything. `submit_result` is a `finish`
 * `{state: "succeeded", detail: summary}`: `problems` go back to the model; accepted ends the loop
 * (the host agent packs the output and tells the run actor). A command that failed or was
 * cancelled is the tool's error.
 *
 * Stopping without delivering: the first time the model answers without tool calls (`stop` `end`
 * or `max_tokens`), the loop adds one user reminder to call `submit_result` (setting `remind`);
 * the next time (once per run) it sends `finish {state: "failed", detail}`, so the run fails
 * `no_submission` with the model's last words in its detail.
 *
 * Vendor failures: `VendorRejectedKey` and `ChatRefused` fail the run `provider` with the vendor's
 * own (key-scrubbed) words in `detail` (a quota spent is such a refusal: OpenAI's
 * `insufficient_quota`, Anthropic's credit balance, Google's per-day `QuotaFailure`);
 * `VendorUnavailable` (rate limits, overload, outages) is retried with exponential backoff
 * (`retryBaseMs`…`retryMaxMs`), never sooner than the wait the vendor asked for (`Retry-After`,
 * `retry-after-ms`, Google's `RetryInfo`, at most 15 minutes), until it answers or the run's own
 * timeout ends the run (which interrupts the loop).
 *
 * Log: the host agent logs each agent command as a `tool_call` line; the model's messages reach
 * the run log through the host actor of the run's host (`Log`: `assistant` lines with the turn,
 * the text and the tools called; `compaction` lines with the summary), since the host agent
 * numbers the log's parts.
 */
import { readFileSync } from "node:fs"
import { rootCertificates } from "node:tls"
import { Clock, Data, Duration, Effect, Option, type Redacted, Schedule } from "effect"
import type { MailboxService } from "../../core/actors/Mailbox.ts"
import type { FunctionsService } from "../../core/Functions.ts"
import { derivedId } from "../../core/Ids.ts"
import * as Kv from "../../core/Kv.ts"
import { Nats } from "../../core/Nats.ts"
import type { ProvidersService } from "../../core/Providers.ts"
import type { SealService } from "../../core/Seal.ts"
import type { SecretsService } from "../../core/Secrets.ts"
import type { Storage } from "../../core/Storage.ts"
import {
  type ChatError,
  type ChatReply,
  type ChatRequest,
  type ChatService,
  type Item,
  isImageType,
  type Part,
  type ToolCall,
} from "../../core/vendors/Chat.ts"
import { vendorLabel } from "../../core/vendors/Errors.ts"
import * as Google from "../../core/vendors/Google.ts"
import { Host } from "../../schema/actors/Host.ts"
import { Run } from "../../schema/actors/Run.ts"
import { type CommandKind, CommandRecord, endedCommandStates } from "../../schema/Command.ts"
import { timestamp } from "../../schema/Common.ts"
import type { CustomTool } from "../../schema/Definition.ts"
import type { Version } from "../../schema/Function.ts"
import type { CommandId, RunId } from "../../schema/Ids.ts"
import { noProvider, parseProviderRef } from "../../schema/Ids.ts"
import type { Model } from "../../schema/Provider.ts"
import { endedRunStates, type RunFailure, StoredRun } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import * as CustomTools from "./CustomTools.ts"
import type { AgentSettingsShape } from "./Settings.ts"
import {
  type AgentRun,
  emptyUsage,
  type Head,
  type ModelUsage,
  readItem,
  type Views,
  writeItem,
} from "./Store.ts"
import {
  commandTools,
  decodeArguments,
  isCommandTool,
  SubmitArguments,
  screenshotCapture,
  screenshotRead,
  toolSpecs,
} from "./Tools.ts"

/** What a loop reaches. */
export interface LoopDeps {
  readonly nats: Nats["Type"]
  readonly storage: Storage["Type"]
  readonly seal: SealService
  readonly secrets: SecretsService
  readonly functions: FunctionsService
  readonly providers: ProvidersService
  readonly chat: ChatService
  readonly mailbox: MailboxService
  readonly settings: AgentSettingsShape
  readonly views: Views
  /** Trusted CAs for custom tools: the system's plus `toolCaFile`, or undefined for the default. */
  readonly toolCa: ReadonlyArray<string> | undefined
}

/** Another loop wrote the head: this one has been replaced and stops. */
export class StaleLoop extends Data.TaggedError("StaleLoop")<{ readonly run: string }> {}

/** The reminder sent once when the model stops talking without delivering. */
export const reminder =
  "You stopped without calling submit_result. If the task is done, put the required files in /workspace/out and call submit_result with a summary; otherwise keep working with the tools."

/** The extra CAs for custom tools from the settings (system roots plus the file), or undefined. */
export const loadToolCa = (settings: AgentSettingsShape) =>
  settings.toolCaFile === ""
    ? Effect.succeed(undefined)
    : Effect.try({
        try: () => [...rootCertificates, readFileSync(settings.toolCaFile, "utf8")],
        catch: (e) => new Error(`cannot read HANGAR_AGENT_TOOL_CA_FILE ${settings.toolCaFile}: ${String(e)}`),
      })

const addUsage = (a: ModelUsage, b: Omit<ModelUsage, "calls">): ModelUsage => ({
  calls: a.calls + 1,
  input_tokens: a.input_tokens + b.input_tokens,
  cache_read_tokens: a.cache_read_tokens + b.cache_read_tokens,
  cache_write_tokens: a.cache_write_tokens + b.cache_write_tokens,
  output_tokens: a.output_tokens + b.output_tokens,
  web_searches: a.web_searches + b.web_searches,
})

const text = (t: string): Part => ({ type: "text", text: t })
const toolItem = (call: ToolCall, content: ReadonlyArray<Part>, isError: boolean): Item => ({
  role: "tool",
  call_id: call.id,
  name: call.name,
  content,
  is_error: isError,
})
const toolError = (call: ToolCall, message: string) => toolItem(call, [text(message)], true)

/** How a loop ended on its own. */
export type LoopEnd = "done" | "run_ended"

/** The command's result as the model sees it: text parts (an image for a read image), and whether it is an error. */
export const resultParts = (
  record: CommandRecord,
): { readonly content: ReadonlyArray<Part>; readonly isError: boolean } => {
  if (record.state === "failed")
    return { content: [text(record.error ?? "the command failed")], isError: true }
  if (record.state === "cancelled") return { content: [text("the command was cancelled")], isError: true }
  const result = record.result as Record<string, unknown> | undefined
  if (result === undefined) return { content: [text("the command gave no result")], isError: true }
  if (typeof result.error === "string") return { content: [text(result.error)], isError: true }
  if (record.kind === "read") {
    if (typeof result.output === "string") return { content: [text(result.output)], isError: false }
    if (typeof result.image_url === "string") {
      const match = /^data:(image\/[a-z]+);base64,(.*)$/s.exec(result.image_url)
      const type = match?.[1]
      if (type !== undefined && isImageType(type))
        return { content: [{ type: "image", media_type: type, data: match![2]! }], isError: false }
      return {
        content: [text(`an image of type ${type ?? "unknown"} cannot be shown`)],
        isError: true,
      }
    }
  }
  return { content: [text(JSON.stringify(result))], isError: false }
}

/** Runs the loop of `agent` until it has nothing more to do. */
export const run = (deps: LoopDeps, agent: AgentRun): Effect.Effect<LoopEnd, unknown> =>
  Effect.gen(function* () {
    const { views, settings, chat, mailbox, seal } = deps
    const names = deps.storage.names
    const runId = agent.run as RunId
    const account = agent.account

    // --- inputs --------------------------------------------------------------------------------
    const runs = yield* Kv.make(names.kv.runs.name, StoredRun).pipe(Effect.provideService(Nats, deps.nats))
    const commands = yield* Kv.make(names.kv.commands.name, CommandRecord).pipe(
      Effect.provideService(Nats, deps.nats),
    )
    const stored = yield* runs.get(kvKeys.run(account, runId))
    if (Option.isNone(stored) || endedRunStates.has(stored.value.value.state)) return "run_ended" as const
    const theRun = stored.value.value

    const runEnded = runs
      .get(kvKeys.run(account, runId))
      .pipe(Effect.map((r) => Option.isNone(r) || endedRunStates.has(r.value.value.state)))

    // A line for the run's log, kept by the host agent running the machine (it numbers the parts).
    // Message id per turn, so a resumed loop logs a turn once.
    const logLine = (
      kind: "assistant" | "compaction" | "notice",
      key: string,
      fields: Record<string, unknown>,
    ) =>
      theRun.host === undefined
        ? Effect.void
        : mailbox
            .send(
              Host,
              theRun.host,
              { _tag: "Log", run: runId, kind, fields },
              { msgId: `log:${runId}:${key}` },
            )
            .pipe(Effect.ignore)

    const fail = (failure: RunFailure, detail: string) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        mailbox.send(
          Run,
          runId,
          { _tag: "Fail", failure, detail, at: timestamp(now) },
          { msgId: `agent-fail:${runId}` },
        ),
      )

    const version = yield* deps.functions.version(theRun.function, theRun.version)
    if (Option.isNone(version)) {
      yield* fail("infrastructure", `the function's version ${theRun.version} could not be read`)
      return "done" as const
    }
    const fn: Version = version.value
    if (theRun.provider === noProvider) return "done" as const
    const ref = parseProviderRef(theRun.provider)
    const providerVersion =
      ref.isId && typeof ref.version === "number"
        ? yield* deps.providers.version(account, ref.provider, ref.version)
        : Option.none()
    const key = Option.isSome(providerVersion)
      ? yield* deps.secrets.open(account, providerVersion.value.key_secret)
      : Option.none<Redacted.Redacted<string>>()
    if (Option.isNone(providerVersion) || Option.isNone(key)) {
      yield* fail("provider", `the provider ${theRun.provider} or its key could not be found`)
      return "done" as const
    }
    const model: Model = providerVersion.value.provider.model
    const tools = toolSpecs(fn.tools, fn.custom_tools)
    const customByName = new Map<string, CustomTool>(fn.custom_tools.map((t) => [t.name, t]))

    // --- the conversation ----------------------------------------------------------------------
    const headKey = kvKeys.agentHead(runId)
    let head: Head
    let revision: number
    let items: Array<Item>
    const found = yield* views.heads.get(headKey)
    if (Option.isSome(found)) {
      head = found.value.value
      revision = found.value.revision
      items = []
      for (let n = head.base; n < head.count; n++)
        items.push(yield* readItem(views, seal, account, runId, n, head.parts[n - head.base] ?? 1))
      yield* Effect.logInfo("agent loop resumed").pipe(
        Effect.annotateLogs({ items: head.count, turn: head.turn }),
      )
    } else {
      const first: Item = { role: "user", content: [text(theRun.prompt)] }
      const parts = yield* writeItem(views, seal, account, runId, 0, first)
      head = {
        account,
        count: 1,
        base: 0,
        parts: [parts],
        turn: 0,
        usage: emptyUsage,
        context_tokens: 0,
        reminded: false,
        done: false,
      }
      revision = yield* views.heads
        .update(headKey, head, 0)
        .pipe(Effect.catchTag("StateConflict", () => Effect.fail(new StaleLoop({ run: runId }))))
      items = [first]
      yield* Effect.logInfo("agent loop started").pipe(
        Effect.annotateLogs({ vendor: model.provider, model: model.model }),
      )
    }

    const saveHead = (next: Head) =>
      views.heads.update(headKey, next, revision).pipe(
        Effect.tap((r) =>
          Effect.sync(() => {
            revision = r
            head = next
          }),
        ),
        Effect.catchTag("StateConflict", () => Effect.fail(new StaleLoop({ run: runId }))),
      )

    /** Appends items (each written, then the head once), with head changes. */
    const append = (added: ReadonlyArray<Item>, change: Partial<Head> = {}) =>
      Effect.gen(function* () {
        const parts = yield* Effect.forEach(
          added.map((item, i) => [item, head.count + i] as const),
          ([item, n]) => writeItem(views, seal, account, runId, n, item),
          { concurrency: "unbounded" },
        )
        yield* saveHead({
          ...head,
          ...change,
          count: head.count + added.length,
          parts: [...head.parts, ...parts],
        })
        items.push(...added)
      })

    /** Starts a new conversation base at the compaction item. */
    const compacted = (item: Item, usage: ModelUsage) =>
      Effect.gen(function* () {
        const n = head.count
        const parts = yield* writeItem(views, seal, account, runId, n, item)
        yield* saveHead({ ...head, count: n + 1, base: n, parts: [parts], usage, context_tokens: 0 })
        items = [item]
      })

    const request = (): ChatRequest => ({
      provider: model.provider,
      key: key.value,
      model: model.model,
      reasoning_effort: model.reasoning_effort,
      max_output_tokens: model.max_output_tokens,
      system: fn.system_prompt,
      items,
      tools,
      web_search: fn.tools.includes("web_search"),
      cache_key: runId,
    })

    // Vendor calls: retried while unavailable (backing off, and never sooner than the vendor asked:
    // `Retry-After`, `retry-after-ms`, Google's `RetryInfo`); a refusal (a quota spent, say) fails the run.
    const retry = Schedule.exponential(Duration.millis(settings.retryBaseMs)).pipe(
      Schedule.modifyDelay((d) => Duration.min(d, Duration.millis(settings.retryMaxMs))),
      Schedule.intersect(Schedule.identity<ChatError>()),
      Schedule.modifyDelay(([, e], d) =>
        e._tag === "VendorUnavailable" && e.retryAfterMs !== undefined
          ? Duration.max(d, Duration.millis(e.retryAfterMs))
          : d,
      ),
    )
    const vendorCall = <A>(what: string, call: Effect.Effect<A, ChatError>) =>
      call.pipe(
        Effect.tapError((e) =>
          e._tag === "VendorUnavailable"
            ? Effect.logWarning(`${what}: the vendor is unavailable, retrying`).pipe(
                Effect.annotateLogs({
                  status: e.status,
                  error: e.message,
                  ...(e.retryAfterMs === undefined ? {} : { retry_after_ms: e.retryAfterMs }),
                }),
              )
            : Effect.void,
        ),
        Effect.retry({ schedule: retry, while: (e) => e._tag === "VendorUnavailable" }),
        Effect.map(Option.some),
        Effect.catchAll((e) => {
          const label = vendorLabel[model.provider]
          const detail =
            e._tag === "VendorRejectedKey"
              ? `${label} refused the key (HTTP ${e.status}): ${e.message}`
              : `${label} refused the request (HTTP ${e.status}): ${e.message}`
          return Effect.as(
            Effect.zipRight(
              Effect.logWarning("the vendor refused: failing the run").pipe(
                Effect.annotateLogs({ status: e.status }),
              ),
              fail("provider", detail),
            ),
            Option.none<A>(),
          )
        }),
      )

    // --- commands ------------------------------------------------------------------------------
    /** Sends a command (or finds the one already sent) and waits for its end; none when the run ended. */
    const command = (id: CommandId, kind: CommandKind, args: unknown) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const reply = yield* mailbox
          .ask(
            Run,
            runId,
            { _tag: "AddCommand", id, kind, arguments: args, source: "agent", created_at: timestamp(now) },
            // A fresh message id per ask: the stream drops a repeated one (its duplicate window),
            // and a resumed loop's ask must reach the actor to get the record its predecessor made.
            { timeout: "10 seconds" },
          )
          .pipe(Effect.retry({ while: (e) => e._tag === "AskTimeout", times: 5 }))
        if (!("command" in reply)) return Option.none<CommandRecord>()
        const { sequence } = reply.command
        if (endedCommandStates.has(reply.command.state)) return Option.some(reply.command)
        const ended = yield* commands.awaitValue(
          kvKeys.command(runId, sequence),
          (r) => r.id === id && endedCommandStates.has(r.state),
        )
        // Commands are cancelled when the run ends: then there is no next turn to pay for.
        if (ended.state === "cancelled" && (yield* runEnded)) return Option.none<CommandRecord>()
        return Option.some(ended)
      })

    /** Runs one tool call of turn `turn`: its tool item, or none when the run ended; `accepted` when it delivered. */
    const runTool = (turn: number, call: ToolCall) =>
      Effect.gen(function* () {
        const idOf = (suffix = "") => derivedId("cmd", `${runId}:${turn}:${call.id}${suffix}`) as CommandId
        const viaCommand = (kind: CommandKind, args: unknown) =>
          Effect.map(
            command(idOf(), kind, args),
            Option.map((r) => {
              const { content, isError } = resultParts(r)
              return { item: toolItem(call, content, isError), accepted: false }
            }),
          )
        const answer = (item: Item) => Effect.succeed(Option.some({ item, accepted: false }))

        if (call.name === "submit_result") {
          const args = decodeArguments(SubmitArguments, call.arguments)
          if (!args.ok) return yield* answer(toolError(call, `invalid arguments: ${args.error}`))
          const record = yield* command(idOf(), "finish", { state: "succeeded", detail: args.value.summary })
          if (Option.isNone(record)) return Option.none()
          const r = record.value
          if (r.state === "succeeded" && r.kind === "finish" && r.result?.accepted === true)
            return Option.some({
              item: toolItem(call, [text("accepted: the run succeeds")], false),
              accepted: true,
            })
          if (r.state === "succeeded" && r.kind === "finish")
            return yield* answer(
              toolError(
                call,
                `not accepted: the output does not match the manifest:\n${(r.result?.problems ?? []).map((p) => `- ${p}`).join("\n")}`,
              ),
            )
          const { content } = resultParts(r)
          return yield* answer(toolItem(call, content, true))
        }
        if (isCommandTool(call.name, fn.tools)) {
          const args = decodeArguments(commandTools[call.name] as never, call.arguments)
          if (!args.ok) return yield* answer(toolError(call, `invalid arguments: ${args.error}`))
          return yield* viaCommand(call.name, args.value)
        }
        if (call.name === "screenshot" && fn.tools.includes("screenshot")) {
          const captured = yield* command(idOf(":capture"), "bash", {
            ...screenshotCapture,
            timeout_ms: 60_000,
          })
          if (Option.isNone(captured)) return Option.none()
          const c = captured.value
          if (c.state !== "succeeded" || c.kind !== "bash" || c.result?.exit_code !== 0) {
            const { content } = resultParts(c)
            return yield* answer(
              toolItem(call, [text("the screenshot could not be taken"), ...content], true),
            )
          }
          const read = yield* command(idOf(":read"), "read", screenshotRead)
          return Option.map(read, (r) => {
            const { content, isError } = resultParts(r)
            return { item: toolItem(call, content, isError), accepted: false }
          })
        }
        const custom = customByName.get(call.name)
        if (custom !== undefined) {
          const problem = CustomTools.checkArguments(custom, call.arguments)
          if (problem !== undefined) return yield* answer(toolError(call, `invalid arguments: ${problem}`))
          const secret = yield* deps.secrets.open(account, custom.secret_id)
          if (Option.isNone(secret))
            return yield* answer(toolError(call, "the tool's secret could not be found"))
          const result = yield* CustomTools.call({
            tool: custom,
            secret: secret.value,
            run: runId,
            args: call.arguments,
            allowPrivate: settings.toolAllowPrivate,
            maxBytes: settings.toolAnswerMaxBytes,
            ca: deps.toolCa,
          })
          return yield* answer(
            result.ok ? toolItem(call, [text(result.text)], false) : toolError(call, result.error),
          )
        }
        return yield* answer(toolError(call, `there is no tool named ${JSON.stringify(call.name)}`))
      })

    // --- the turns -----------------------------------------------------------------------------
    // The loop's own time per turn, logged as `overhead_ms` (bench/agent.ts): from a reply's
    // arrival to the next request leaving, without the time its tools took.
    let overhead = 0
    let since: number | undefined
    const pause = () => {
      if (since !== undefined) overhead += performance.now() - since
      since = undefined
    }
    const resume = () => {
      since = performance.now()
    }
    // Gemini before 3 cannot search the web in a turn that offers functions: search is left out
    // (rather than every turn refused) and the run log says so, once.
    if (
      fn.tools.includes("web_search") &&
      model.provider === "google" &&
      !Google.searchesWithFunctions(model.model)
    )
      yield* logLine("notice", "web_search", {
        text: `web search is left out: ${model.model} cannot search the web in a turn that also offers tools (Gemini 3 and later can)`,
      })
    while (!head.done) {
      // Tool calls of the last reply without a result yet (after a restart, some may be done).
      const lastAssistant = items.findLastIndex((i) => i.role === "assistant")
      const assistant = lastAssistant >= 0 ? items[lastAssistant] : undefined
      if (assistant?.role === "assistant" && assistant.tool_calls.length > 0) {
        const answered = new Set(
          items.slice(lastAssistant + 1).flatMap((i) => (i.role === "tool" ? [i.call_id] : [])),
        )
        for (const call of assistant.tool_calls.filter((c) => !answered.has(c.id))) {
          pause()
          const outcome = yield* runTool(head.turn, call)
          resume()
          if (Option.isNone(outcome)) return "run_ended" as const
          yield* append([outcome.value.item], outcome.value.accepted ? { done: true } : {})
          if (outcome.value.accepted) return "done" as const
        }
      }

      // Compact when the conversation reached the threshold.
      if (head.context_tokens >= model.compact_at_tokens && items.length > 1) {
        pause()
        const result = yield* vendorCall("compaction", chat.compact(request()))
        resume()
        if (Option.isNone(result)) {
          yield* saveHead({ ...head, done: true })
          return "done" as const
        }
        yield* compacted(result.value.item, addUsage(head.usage, result.value.usage))
        yield* logLine("compaction", `compaction:${head.turn}`, {
          turn: head.turn,
          summary: result.value.item.summary,
        })
        yield* Effect.logInfo("conversation compacted")
      }

      const next = request()
      pause()
      if (head.turn > 0)
        yield* Effect.logInfo("agent turn").pipe(
          Effect.annotateLogs({ turn: head.turn, overhead_ms: Math.round(overhead * 1000) / 1000 }),
        )
      const replied = yield* vendorCall("reply", chat.reply(next))
      overhead = 0
      resume()
      if (Option.isNone(replied)) {
        yield* saveHead({ ...head, done: true })
        return "done" as const
      }
      const reply: ChatReply = replied.value
      const turn = head.turn + 1
      const usage = addUsage(head.usage, reply.usage)
      yield* append([reply.item], { turn, usage, context_tokens: reply.context_tokens })
      yield* mailbox.send(Run, runId, { _tag: "Usage", model: usage }, { msgId: `usage:${runId}:${turn}` })
      yield* logLine("assistant", String(turn), {
        turn,
        text: reply.item.text,
        tool_calls: reply.item.tool_calls.map((c) => c.name),
      })

      if (reply.item.tool_calls.length === 0) {
        if (settings.remind && !head.reminded) {
          yield* append([{ role: "user", content: [text(reminder)] }], { reminded: true })
          continue
        }
        const said = reply.item.text.trim()
        const detail = `the agent stopped without calling submit_result${said === "" ? "" : `: ${said.slice(0, 2000)}`}`
        const ended = yield* command(derivedId("cmd", `${runId}:${turn}:stopped`) as CommandId, "finish", {
          state: "failed",
          detail,
        })
        yield* saveHead({ ...head, done: true })
        return Option.isNone(ended) ? ("run_ended" as const) : ("done" as const)
      }
    }
    return "done" as const
  }).pipe(Effect.annotateLogs({ run: agent.run, role: "agent" }))

/**
 * Calls of a function's custom tools (spec "CustomTool", "Secrets" 8).
 *
 * The model's arguments are first checked against the tool's JSON Schema (Ajv, draft 2020-12,
 * which also reads the draft-07 keywords callers use; a compiled schema is kept per tool URL and
 * name); arguments that do not fit go back to the model as the tool's error and nothing is sent.
 * Then the arguments are POSTed as JSON to the tool's URL with `Authorization: Bearer <secret>`
 * and `Service-Run: <run>`, exactly as webhooks are sent (`actors/webhooks/Webhook.ts`): `https:`
 * only, the host resolved and every address checked public (`core/PublicAddress.ts`, unless the
 * test-only `toolAllowPrivate`), the connection pinned to the checked address (TLS still checks the
 * name), no redirects. The whole call, from resolving to the last byte of the answer, is bounded
 * by the tool's `timeout_seconds`; an answer above `toolAnswerMaxBytes` is cut off.
 *
 * Every failure (refused address, network, TLS, non-2xx status, too large, timeout) is the tool's
 * error for the model, worded without the secret; the run goes on. A 2xx answer's body is given
 * to the model as text (JSON answers as sent).
 */
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js"
import { Data, Duration, Effect, Redacted } from "effect"
import { postPinned } from "../../core/PinnedPost.ts"
import { resolvePublic } from "../../core/PublicAddress.ts"
import type { CustomTool } from "../../schema/Definition.ts"

/** What a custom tool call gave: the answer's text, or an error for the model. */
export type ToolAnswer =
  | { readonly ok: true; readonly text: string }
  | { readonly ok: false; readonly error: string }

class CallFailed extends Data.TaggedError("CallFailed")<{ readonly message: string }> {}

const ajv = new Ajv2020({ strict: false, allErrors: false, validateFormats: false })
const compiled = new Map<string, ValidateFunction | string>()

/** The tool's compiled schema (or why it does not compile), kept per tool. */
const validatorOf = (tool: CustomTool): ValidateFunction | string => {
  const key = `${tool.url} ${tool.name} ${JSON.stringify(tool.parameters)}`
  let found = compiled.get(key)
  if (found === undefined) {
    try {
      found = ajv.compile(tool.parameters)
    } catch (e) {
      found = `the tool's parameters are not a usable JSON Schema: ${(e as Error).message}`
    }
    if (compiled.size > 1000) compiled.clear()
    compiled.set(key, found)
  }
  return found
}

/** Why `args` does not fit the tool's schema, or undefined when it does. */
export const checkArguments = (tool: CustomTool, args: unknown): string | undefined => {
  if (typeof args === "string") return "the arguments are not a JSON object"
  const validate = validatorOf(tool)
  if (typeof validate === "string") return validate
  if (validate(args)) return undefined
  return (validate.errors ?? [])
    .map(
      (e) =>
        `${e.instancePath === "" ? "arguments" : `arguments${e.instancePath}`} ${e.message ?? "is invalid"}`,
    )
    .join("; ")
}

/** Calls `tool` with `args` (already checked) for `run`. */
export const call = (options: {
  readonly tool: CustomTool
  readonly secret: Redacted.Redacted<string>
  readonly run: string
  readonly args: unknown
  readonly allowPrivate: boolean
  readonly maxBytes: number
  readonly ca: ReadonlyArray<string> | undefined
}): Effect.Effect<ToolAnswer> => {
  const { tool } = options
  const timeoutMs = tool.timeout_seconds * 1000
  return Effect.gen(function* () {
    const url = new URL(tool.url)
    if (url.protocol !== "https:") return yield* new CallFailed({ message: "the tool's URL is not https" })
    const address = yield* resolvePublic(url.hostname, { allowPrivate: options.allowPrivate }).pipe(
      Effect.mapError((e) => new CallFailed({ message: e.message })),
    )
    const answer = yield* postPinned({
      url,
      address,
      headers: { authorization: `Bearer ${Redacted.value(options.secret)}`, "service-run": options.run },
      body: JSON.stringify(options.args),
      userAgent: "Hangar-Agent/1",
      maxBytes: options.maxBytes,
      ca: options.ca,
    }).pipe(Effect.mapError((e) => new CallFailed({ message: e.message })))
    if (answer.status < 200 || answer.status > 299) {
      const said = answer.text.trim().slice(0, 2000)
      return {
        ok: false,
        error: `the tool answered HTTP ${answer.status}${said === "" ? "" : `: ${said}`}`,
      } as const
    }
    return { ok: true, text: answer.text } as const
  }).pipe(
    Effect.timeoutFail({
      duration: Duration.millis(timeoutMs),
      onTimeout: () => new CallFailed({ message: `no answer within ${tool.timeout_seconds} seconds` }),
    }),
    Effect.catchTag("CallFailed", (e) =>
      Effect.succeed({ ok: false, error: `the tool call failed: ${e.message}` } as const),
    ),
    // A tool that echoes the secret back does not get it shown to the model.
    Effect.map((answer): ToolAnswer => {
      const secret = Redacted.value(options.secret)
      return answer.ok || secret === ""
        ? answer
        : { ok: false, error: answer.error.split(secret).join("<secret>") }
    }),
  )
}

/**
 * The tools shown to the model and what each call becomes.
 *
 * - `bash`, `read`, `write`, `edit`: the command of the same name with the same arguments; their
 *   names, descriptions and JSON Schemas are `GET /v1/tools`'s (`schema/Tools.ts`), so a model sees
 *   here what a caller's own loop would show it.
 * - `screenshot`: no arguments; a `bash` running the base's `screenshot` (the 1440x900 display to
 *   `/tmp/screen.png`), then a `read` of the file, whose image goes back to the model as an image.
 * - `web_search`: not a function tool: the vendor's own search (`ChatRequest.web_search`).
 * - the function's custom tools, with their own schemas (checked by `CustomTools.ts`).
 * - `submit_result` (always): a `finish` command with `succeeded` and the summary as detail.
 */
import { ParseResult, Schema } from "effect"
import type { ToolSpec } from "../../core/vendors/Chat.ts"
import {
  BashArguments,
  type CommandKind,
  EditArguments,
  ReadArguments,
  WriteArguments,
} from "../../schema/Command.ts"
import type { CustomTool, Tool } from "../../schema/Definition.ts"
import { inputSchemaOf, tools } from "../../schema/Tools.ts"

/** `submit_result`'s arguments. */
export const SubmitArguments = Schema.Struct({
  summary: Schema.String.annotations({ description: "What was done, for the caller." }),
})

/** The command tools and the schemas of their arguments. */
export const commandTools = {
  bash: BashArguments,
  read: ReadArguments,
  write: WriteArguments,
  edit: EditArguments,
} as const
export type CommandTool = keyof typeof commandTools

// The tools of `GET /v1/tools` by name, as a caller's own loop would show them.
const listed = new Map<string, ToolSpec>(
  tools.map((t) => [t.name, { name: t.name, description: t.description, parameters: t.input_schema }]),
)
const builtIn = (name: Exclude<Tool, "web_search">): ToolSpec => listed.get(name) as ToolSpec

/** `submit_result`, always shown. */
export const submitSpec: ToolSpec = {
  name: "submit_result",
  description:
    "Deliver the result: the files the task requires are in /workspace/out. They are checked against the output manifest; if something is missing or too large you get the problems and may fix them and call this again. When they match, the run ends as succeeded with your summary.",
  parameters: inputSchemaOf(SubmitArguments),
}

/** The tools shown to the model for a function's `tools` and custom tools. */
export const toolSpecs = (
  shown: ReadonlyArray<Tool>,
  custom: ReadonlyArray<CustomTool>,
): ReadonlyArray<ToolSpec> => [
  ...shown.flatMap((t) => (t === "web_search" ? [] : [builtIn(t)])),
  ...custom.map((t) => ({ name: t.name, description: t.description, parameters: t.parameters })),
  submitSpec,
]

/** The screenshot's commands. */
export const screenshotPath = "/tmp/screen.png"
export const screenshotCapture = { command: `screenshot ${screenshotPath}` }
export const screenshotRead = { file_path: screenshotPath }

/** A model's arguments decoded with `schema`, or the reason they do not fit. */
export const decodeArguments = <A, I>(
  schema: Schema.Schema<A, I, never>,
  args: unknown,
): { readonly ok: true; readonly value: A } | { readonly ok: false; readonly error: string } => {
  if (typeof args === "string") return { ok: false, error: "the arguments are not a JSON object" }
  const decoded = Schema.decodeUnknownEither(schema, { onExcessProperty: "error" })(args)
  return decoded._tag === "Right"
    ? { ok: true, value: decoded.right }
    : { ok: false, error: ParseResult.TreeFormatter.formatErrorSync(decoded.left) }
}

/** Whether `name` is a command tool the function gave its agent. */
export const isCommandTool = (name: string, tools: ReadonlyArray<Tool>): name is CommandTool & CommandKind =>
  name in commandTools && tools.includes(name as Tool)

/**
 * The tools shown to the model: `GET /v1/tools` lists them for callers' own agent loops (DESIGN.md
 * envelope), and Hangar's agent loop (`actors/agent/Tools.ts`) shows its models the same names,
 * descriptions and schemas. Input schemas are generated from the command argument schemas of
 * `Command.ts` (the tool calls become those commands), and from the small schemas below for the
 * tools that are not commands of their own; none is written by hand as JSON.
 */
import { JSONSchema, Schema } from "effect"
import { BashArguments, EditArguments, ReadArguments, WriteArguments } from "./Command.ts"
import { NonEmptyString } from "./Common.ts"

/** A tool: its name, what it does, and the JSON Schema of its input. */
export const ToolInfo = Schema.Struct({
  name: Schema.String,
  description: Schema.String,
  input_schema: Schema.Record({ key: Schema.String, value: Schema.Unknown }),
}).annotations({ identifier: "ToolInfo" })
export type ToolInfo = typeof ToolInfo.Type

/** `GET /v1/tools`. */
export const ToolList = Schema.Struct({ tools: Schema.Array(ToolInfo) }).annotations({
  identifier: "ToolList",
})
export type ToolList = typeof ToolList.Type

/** `screenshot`: no arguments; a `bash` capture of the display to `/tmp/screen.png`, then a `read` of it. */
export const ScreenshotArguments = Schema.Struct({}).annotations({ identifier: "ScreenshotArguments" })
/** `web_search`: what to search for; the caller searches itself. */
export const WebSearchArguments = Schema.Struct({
  query: NonEmptyString.annotations({ description: "What to search the web for." }),
}).annotations({ identifier: "WebSearchArguments" })
/** `complete`: `finish` with state `succeeded`; the summary becomes the finish detail. */
export const CompleteArguments = Schema.Struct({
  summary: Schema.optional(Schema.String.annotations({ description: "What was done, for the caller." })),
}).annotations({ identifier: "CompleteArguments" })
/** `give_up`: `finish` with state `failed` and the reason as detail. */
export const GiveUpArguments = Schema.Struct({
  reason: NonEmptyString.annotations({ description: "Why the task cannot be done." }),
}).annotations({ identifier: "GiveUpArguments" })

/** A self-contained JSON Schema (no `$ref`s out of it) of a tool's arguments. */
// biome-ignore lint/suspicious/noExplicitAny: any schema without requirements
export const inputSchemaOf = (schema: Schema.Schema<any, any, never>): Record<string, unknown> => {
  // `Struct({})` means "any non-nullish value" to JSONSchema; a tool without arguments takes `{}`.
  const ast = schema.ast
  if (ast._tag === "TypeLiteral" && ast.propertySignatures.length === 0 && ast.indexSignatures.length === 0)
    return { type: "object", properties: {}, additionalProperties: false }
  const definitions: Record<string, JSONSchema.JsonSchema7> = {}
  const root = JSONSchema.fromAST(schema.ast, {
    definitions,
    target: "jsonSchema2020-12",
    topLevelReferenceStrategy: "skip",
  }) as unknown as Record<string, unknown>
  return Object.keys(definitions).length === 0 ? root : { ...root, $defs: definitions }
}

const tool = (
  name: string,
  description: string,
  // biome-ignore lint/suspicious/noExplicitAny: any schema without requirements
  schema: Schema.Schema<any, any, never>,
): ToolInfo => ({ name, description, input_schema: inputSchemaOf(schema) })

/** The tools in the spec's order. */
export const tools: ReadonlyArray<ToolInfo> = [
  tool(
    "bash",
    "Run a command in its own `bash -c` as root in the machine (working folder /workspace unless `workdir` is given). Only files carry over between commands. Returns the exit code and the first and last 16 KiB of the output.",
    BashArguments,
  ),
  tool(
    "read",
    "Read a text file's lines (from `offset`, counting from 1, at most `limit` lines). An image (PNG, JPEG, GIF or WebP up to 3.75 MiB and 2000 pixels a side) is returned as an image.",
    ReadArguments,
  ),
  tool("write", "Replace a file with `content`, making its parent folders.", WriteArguments),
  tool(
    "edit",
    "Edit a file: each `old_text` must occur exactly once and is replaced by its `new_text`; all edits apply or none.",
    EditArguments,
  ),
  tool("screenshot", "Capture the machine's 1440x900 display and look at it.", ScreenshotArguments),
  tool("web_search", "Search the web.", WebSearchArguments),
  tool(
    "complete",
    "The task is done: the files the function requires are in /workspace/out. Ends the run as succeeded.",
    CompleteArguments,
  ),
  tool("give_up", "The task cannot be done. Ends the run as failed, with the reason.", GiveUpArguments),
]

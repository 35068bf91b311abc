/** `GET /v1/tools`: the tools shown to the model, for callers' own agent loops (DESIGN.md envelope). */
import { Schema } from "effect"

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

/** Functions and their versions (spec "Function", "Version", the `/v1/functions` responses). */
import { Schema } from "effect"
import { IntAtLeast, Timestamp } from "./Common.ts"
import { definitionFields } from "./Definition.ts"
import { Actor, FunctionId } from "./Ids.ts"
import { Run } from "./Run.ts"

/**
 * A published version: the Definition as filled in, plus who published it and when. A version
 * never changes. `external_reference` is present only when it was sent.
 */
export const Version = Schema.Struct({
  ...definitionFields,
  function: FunctionId,
  version: IntAtLeast(1),
  external_reference: Schema.optional(Schema.String),
  created_at: Timestamp,
  created_by: Actor,
}).annotations({ identifier: "Version" })
export type Version = typeof Version.Type

/**
 * A function (the spec's "Function"; named so as not to shadow the global): its name and its
 * newest version number; the id is its address.
 */
export const FunctionRecord = Schema.Struct({
  id: FunctionId,
  name: Schema.String,
  latest: IntAtLeast(1),
  updated_at: Timestamp,
  updated_by: Actor,
}).annotations({ identifier: "Function" })
export type FunctionRecord = typeof FunctionRecord.Type

/** An item of `GET /v1/functions`: the function, its latest version, and its last run if any. */
export const FunctionSummary = Schema.Struct({
  ...FunctionRecord.fields,
  definition: Version,
  last: Schema.optional(Run),
}).annotations({ identifier: "FunctionSummary" })
export type FunctionSummary = typeof FunctionSummary.Type

/** `GET /v1/functions`. */
export const FunctionList = Schema.Struct({ functions: Schema.Array(FunctionSummary) }).annotations({
  identifier: "FunctionList",
})
export type FunctionList = typeof FunctionList.Type

/** `GET /v1/functions/{id}`: the function and its versions, oldest first. */
export const FunctionDetail = Schema.Struct({
  function: FunctionRecord,
  versions: Schema.Array(Version),
}).annotations({
  identifier: "FunctionDetail",
})
export type FunctionDetail = typeof FunctionDetail.Type

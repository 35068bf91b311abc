/**
 * The body of a function version (spec "Definition", "ManifestEntry", "CustomTool", "EnvVar").
 *
 * Two shapes of each: the *request* shape a caller publishes (optional fields, static defaults
 * filled by decoding, secrets sent as `secret`), and the *stored* shape a version keeps and returns
 * (every field present, base and provider resolved, secrets replaced by `secret_id`).
 * `base` and `provider` stay optional in the request: their defaults (the newest base, the
 * account's only provider) are looked up when publishing, not by the schema.
 */
import { Schema } from "effect"
import {
  ArrayMax,
  Enum,
  ExternalReference,
  HttpsUrl,
  IntBetween,
  maxBytes,
  StringMaxBytes,
  utf8Bytes,
} from "./Common.ts"
import { BaseName, FunctionName, ProviderRef, ProviderRefInput, SecretId } from "./Ids.ts"
import {
  customToolDescriptionMaxBytes,
  customToolParametersMaxBytes,
  customToolSecretMaxBytes,
  customToolsMax,
  customToolTimeoutDefaultSeconds,
  customToolTimeoutMaxSeconds,
  customToolTimeoutMinSeconds,
  environmentMaxVariables,
  envNameMaxChars,
  envSecretMaxBytes,
  envValueMaxBytes,
  inputMaxBytesDefault,
  manifestDescriptionMaxBytes,
  manifestMaxEntries,
  manifestPathMaxBytes,
  outputMaxBytes,
  reservedEnvPrefix,
  setupCommandMaxBytes,
  setupMaxCommands,
  sizes,
  systemPromptMaxBytes,
  timeoutMinutesDefault,
  timeoutMinutesMax,
  timeoutMinutesMin,
} from "./Limits.ts"

/** The built-in tools a function may give its agent. */
export const toolNames = ["bash", "read", "write", "edit", "screenshot", "web_search"] as const
/** A built-in tool. */
export const Tool = Enum(...toolNames).annotations({ identifier: "Tool" })
export type Tool = typeof Tool.Type

/** A machine size. */
export const Size = Enum(...(Object.keys(sizes) as Array<keyof typeof sizes>)).annotations({
  identifier: "Size",
})
export type Size = typeof Size.Type

// ---------------------------------------------------------------------------------------------
// ManifestEntry

// Paths are relative to `/workspace/in` (input) or `/workspace/out` (output): no leading `/`, no
// empty, `.` or `..` segments, so an entry cannot point outside its folder. A trailing `/` marks
// a folder.
const ManifestPath = Schema.String.pipe(
  Schema.filter((p) => {
    if (p === "") return "must not be empty"
    if (utf8Bytes(p) > manifestPathMaxBytes) return `at most ${manifestPathMaxBytes} bytes`
    if (p.startsWith("/")) return "must be relative to the folder (no leading /)"
    if (p.includes("\0")) return "must not contain a NUL character"
    const segments = (p.endsWith("/") ? p.slice(0, -1) : p).split("/")
    if (segments.some((s) => s === "" || s === "." || s === ".."))
      return "must not contain empty, . or .. segments"
    return true
  }),
)

const manifestEntry = (defaultMaxBytes: number, maxMaxBytes: number) =>
  Schema.Struct({
    path: ManifestPath,
    description: Schema.optional(StringMaxBytes(manifestDescriptionMaxBytes)),
    max_bytes: Schema.optionalWith(IntBetween(0, maxMaxBytes), { default: () => defaultMaxBytes }),
  })

/** An input manifest entry; `max_bytes` defaults to 5 GB (10^9 bytes) and may be up to the largest disk. */
export const InputManifestEntry = manifestEntry(inputMaxBytesDefault, sizes.xl.diskBytes).annotations({
  identifier: "InputManifestEntry",
})
/** An output manifest entry; `max_bytes` defaults to, and is at most, 50 GiB. */
export const OutputManifestEntry = manifestEntry(outputMaxBytes, outputMaxBytes).annotations({
  identifier: "OutputManifestEntry",
})
/** A manifest entry as stored (every field filled; `description` only when given). */
export const ManifestEntry = Schema.Struct({
  path: Schema.String,
  description: Schema.optional(Schema.String),
  max_bytes: Schema.Number,
}).annotations({ identifier: "ManifestEntry" })
export type ManifestEntry = typeof ManifestEntry.Type

const uniqueBy =
  <A>(key: (a: A) => string, what: string) =>
  (items: ReadonlyArray<A>): true | Schema.FilterIssue => {
    const seen = new Map<string, number>()
    for (const [i, item] of items.entries()) {
      const k = key(item)
      if (seen.has(k)) return { path: [i], message: `${what} ${JSON.stringify(k)} is given twice` }
      seen.set(k, i)
    }
    return true
  }

const manifest = <A extends { readonly path: string }, I>(entry: Schema.Schema<A, I, never>) =>
  ArrayMax(entry, manifestMaxEntries).pipe(
    Schema.filter(uniqueBy((e: { readonly path: string }) => e.path, "path")),
  )

// ---------------------------------------------------------------------------------------------
// CustomTool

/** The pattern of a custom tool's name. */
export const customToolNamePattern = /^[a-z][a-z0-9_]{0,63}$/

// Names the model already has; a custom tool with one of them would be ambiguous.
const reservedToolNames: ReadonlySet<string> = new Set([...toolNames, "submit_result", "complete", "give_up"])

const CustomToolName = Schema.String.pipe(
  Schema.pattern(customToolNamePattern, { message: () => `must match ${customToolNamePattern.source}` }),
  Schema.filter((n) => !reservedToolNames.has(n) || `${n} is the name of a built-in tool`),
)

type Json = unknown
const isObject = (v: Json): v is Record<string, Json> =>
  typeof v === "object" && v !== null && !Array.isArray(v)

// Keywords whose value is one schema, a list of schemas, or a map of name to schema.
const schemaKeys = ["items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames"]
const schemaListKeys = ["allOf", "anyOf", "oneOf", "prefixItems"]
const schemaMapKeys = ["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"]

/**
 * The first place in a JSON Schema where an object schema does not set `additionalProperties` to
 * `false`, as a path from the root, or undefined when there is none. An object schema is one whose
 * `type` is or includes `object`, or that has `properties` or `patternProperties`.
 */
export const openObjectAt = (
  schema: Json,
  path: ReadonlyArray<PropertyKey> = [],
): ReadonlyArray<PropertyKey> | undefined => {
  if (Array.isArray(schema)) {
    for (const [i, s] of schema.entries()) {
      const found = openObjectAt(s, [...path, i])
      if (found) return found
    }
    return undefined
  }
  if (!isObject(schema)) return undefined
  const type = schema.type
  const isObjectSchema =
    type === "object" ||
    (Array.isArray(type) && type.includes("object")) ||
    "properties" in schema ||
    "patternProperties" in schema
  if (isObjectSchema && schema.additionalProperties !== false) return path
  for (const key of schemaKeys) {
    if (key in schema) {
      const found = openObjectAt(schema[key], [...path, key])
      if (found) return found
    }
  }
  for (const key of schemaListKeys) {
    const list = schema[key]
    if (Array.isArray(list)) {
      const found = openObjectAt(list, [...path, key])
      if (found) return found
    }
  }
  for (const key of schemaMapKeys) {
    const map = schema[key]
    if (isObject(map)) {
      for (const [name, s] of Object.entries(map)) {
        const found = openObjectAt(s, [...path, key, name])
        if (found) return found
      }
    }
  }
  return undefined
}

/**
 * A custom tool's `parameters`: a JSON Schema for an object of arguments, in which every object
 * schema sets `additionalProperties: false` (so the model cannot invent arguments), at most 64 KiB.
 */
export const ToolParameters = Schema.Record({ key: Schema.String, value: Schema.Unknown })
  .pipe(
    Schema.filter((schema): true | Schema.FilterIssue | string => {
      if (schema.type !== "object") return { path: ["type"], message: 'must be "object"' }
      const open = openObjectAt(schema)
      if (open) return { path: open, message: "must set additionalProperties to false" }
      if (utf8Bytes(JSON.stringify(schema)) > customToolParametersMaxBytes)
        return `at most ${customToolParametersMaxBytes} bytes of JSON`
      return true
    }),
  )
  .annotations({ identifier: "ToolParameters" })

const customToolCommon = {
  name: CustomToolName,
  description: StringMaxBytes(customToolDescriptionMaxBytes),
  parameters: ToolParameters,
  url: HttpsUrl,
}

/**
 * A custom tool as published. Exactly one of `secret` (a new value, sent once) and `secret_id`
 * (the stored secret of an earlier version's tool at the same URL, checked when publishing):
 * calls always carry a bearer secret, and the receiver must refuse calls without it.
 */
export const CustomToolInput = Schema.Struct({
  ...customToolCommon,
  secret: Schema.optional(
    Schema.String.pipe(
      Schema.minLength(1, { message: () => "must not be empty" }),
      maxBytes(customToolSecretMaxBytes),
    ),
  ),
  secret_id: Schema.optional(SecretId),
  timeout_seconds: Schema.optionalWith(IntBetween(customToolTimeoutMinSeconds, customToolTimeoutMaxSeconds), {
    default: () => customToolTimeoutDefaultSeconds,
  }),
})
  .pipe(
    Schema.filter((t) => {
      if (t.secret !== undefined && t.secret_id !== undefined)
        return { path: ["secret_id"], message: "give secret or secret_id, not both" }
      if (t.secret === undefined && t.secret_id === undefined)
        return { path: ["secret"], message: "is required (or secret_id to keep a stored secret)" }
      return true
    }),
  )
  .annotations({ identifier: "CustomToolInput" })
export type CustomToolInput = typeof CustomToolInput.Type

/** A custom tool as a version stores and returns it: the secret only as `secret_id`. */
export const CustomTool = Schema.Struct({
  ...customToolCommon,
  secret_id: SecretId,
  timeout_seconds: Schema.Number,
}).annotations({ identifier: "CustomTool" })
export type CustomTool = typeof CustomTool.Type

// ---------------------------------------------------------------------------------------------
// EnvVar

/** The pattern of environment variable names (what a POSIX shell can name). */
export const envNamePattern = /^[A-Za-z_][A-Za-z0-9_]*$/

const EnvName = Schema.String.pipe(
  Schema.filter((n) => {
    if (!envNamePattern.test(n)) return `must match ${envNamePattern.source}`
    if (n.length > envNameMaxChars) return `at most ${envNameMaxChars} characters`
    if (n.startsWith(reservedEnvPrefix))
      return `must not start with ${reservedEnvPrefix} (reserved for the service)`
    return true
  }),
)

/**
 * An environment variable as published: exactly one of `value` (plain, up to 64 KiB),
 * `secret` (up to 4 KiB, stored encrypted, never returned) or `secret_id` (keep a stored secret).
 */
export const EnvVarInput = Schema.Struct({
  name: EnvName,
  value: Schema.optional(StringMaxBytes(envValueMaxBytes)),
  secret: Schema.optional(StringMaxBytes(envSecretMaxBytes)),
  secret_id: Schema.optional(SecretId),
})
  .pipe(
    Schema.filter((v) => {
      const given = (["value", "secret", "secret_id"] as const).filter((k) => v[k] !== undefined)
      if (given.length === 0) return { path: ["value"], message: "is required (or secret, or secret_id)" }
      if (given.length > 1)
        return { path: [given[1]!], message: `give only one of value, secret and secret_id` }
      return true
    }),
  )
  .annotations({ identifier: "EnvVarInput" })
export type EnvVarInput = typeof EnvVarInput.Type

/** An environment variable as stored and returned: a plain `value` or a `secret_id`. */
export const EnvVar = Schema.Union(
  Schema.Struct({ name: Schema.String, value: Schema.String }),
  Schema.Struct({ name: Schema.String, secret_id: SecretId }),
).annotations({ identifier: "EnvVar" })
export type EnvVar = typeof EnvVar.Type

// ---------------------------------------------------------------------------------------------
// Definition

const SetupCommand = StringMaxBytes(setupCommandMaxBytes)
const SystemPrompt = StringMaxBytes(systemPromptMaxBytes)
const TimeoutMinutes = IntBetween(timeoutMinutesMin, timeoutMinutesMax)

const Tools = Schema.Array(Tool).pipe(Schema.filter(uniqueBy((t: string) => t, "tool")))

/**
 * The fields of a Definition as published. `system_prompt` and `output_manifest` are required;
 * `base` and `provider` are filled when publishing; everything else gets the spec's default.
 */
export const definitionRequestFields = {
  base: Schema.optional(BaseName),
  setup: Schema.optionalWith(ArrayMax(SetupCommand, setupMaxCommands), { default: () => [] }),
  provider: Schema.optional(ProviderRefInput),
  system_prompt: SystemPrompt,
  tools: Schema.optionalWith(Tools, { default: () => [...toolNames] }),
  custom_tools: Schema.optionalWith(
    ArrayMax(CustomToolInput, customToolsMax).pipe(
      Schema.filter(uniqueBy((t: CustomToolInput) => t.name, "custom tool name")),
    ),
    { default: () => [] },
  ),
  input_manifest: Schema.optionalWith(manifest(InputManifestEntry), { default: () => [] }),
  output_manifest: manifest(OutputManifestEntry).pipe(
    Schema.minItems(1, { message: () => "at least one entry is required" }),
  ),
  environment: Schema.optionalWith(
    ArrayMax(EnvVarInput, environmentMaxVariables).pipe(
      Schema.filter(uniqueBy((v: EnvVarInput) => v.name, "variable")),
    ),
    { default: () => [] },
  ),
  size: Schema.optionalWith(Size, { default: () => "m" as const }),
  timeout_minutes: Schema.optionalWith(TimeoutMinutes, { default: () => timeoutMinutesDefault }),
}

/** A Definition as published (defaults filled, `base`/`provider` possibly still open). */
export const DefinitionInput = Schema.Struct(definitionRequestFields).annotations({
  identifier: "DefinitionInput",
})
export type DefinitionInput = typeof DefinitionInput.Type

/** The fields of a Definition as a version stores them: every field filled, secrets as ids. */
export const definitionFields = {
  base: BaseName,
  setup: Schema.Array(Schema.String),
  provider: ProviderRef,
  system_prompt: Schema.String,
  tools: Schema.Array(Tool),
  custom_tools: Schema.Array(CustomTool),
  input_manifest: Schema.Array(ManifestEntry),
  output_manifest: Schema.Array(ManifestEntry),
  environment: Schema.Array(EnvVar),
  size: Size,
  timeout_minutes: Schema.Number,
}

/** A Definition as stored in a version. */
export const Definition = Schema.Struct(definitionFields).annotations({ identifier: "Definition" })
export type Definition = typeof Definition.Type

/** `POST /v1/functions`: a name, an optional external reference, and a Definition. */
export const CreateFunctionRequest = Schema.Struct({
  name: FunctionName,
  external_reference: Schema.optional(ExternalReference),
  ...definitionRequestFields,
}).annotations({ identifier: "CreateFunctionRequest" })
export type CreateFunctionRequest = typeof CreateFunctionRequest.Type

/** `POST /v1/functions/{id}/versions`: a Definition and an optional external reference. */
export const PublishVersionRequest = Schema.Struct({
  ...definitionRequestFields,
  external_reference: Schema.optional(ExternalReference),
}).annotations({ identifier: "PublishVersionRequest" })
export type PublishVersionRequest = typeof PublishVersionRequest.Type

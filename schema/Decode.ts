/**
 * Decoding request bodies into the contract's types, turning a schema failure into
 * `400 invalid_request` whose message names the field, e.g. `setup[3]: at most 16384 bytes`.
 *
 * Unknown fields are refused (`onExcessProperty: "error"`), naming the field: a typo such as
 * `timeout_minute` would otherwise be dropped silently and the default used, which a caller only
 * notices much later. Decoding stops at the first problem (`errors: "first"`), so the message is
 * about one field and cheap to make even for huge bodies.
 *
 * Messages never quote the value that failed: a wrong `secret` or `key` must not come back in an
 * error body or land in a log.
 */
import { Effect, Either, ParseResult, Schema } from "effect"
import type { ParseOptions } from "effect/SchemaAST"
import { ApiError } from "./Errors.ts"

const options: ParseOptions = { errors: "first", onExcessProperty: "error" }

/** A field path as callers write it: `custom_tools[0].name`. */
export const formatPath = (path: ReadonlyArray<PropertyKey>): string => {
  let out = ""
  for (const key of path) {
    if (typeof key === "number") out += `[${key}]`
    else out += out === "" ? String(key) : `.${String(key)}`
  }
  return out
}

// The default messages are "Expected <type>, actual <value>"; say what the field must be in plain
// words and never quote the value (it may be a secret).
const cleanMessage = (message: string): string => {
  if (message === "is missing") return "is required"
  if (!message.startsWith("Expected ")) return message
  const at = message.lastIndexOf(", actual ")
  const expected = message.slice("Expected ".length, at >= 0 ? at : undefined)
  if (expected.startsWith("string")) return "must be a string"
  if (expected.startsWith("number") || expected === "Int") return "must be a number"
  if (expected.startsWith("boolean")) return "must be true or false"
  if (expected.startsWith("ReadonlyArray") || expected.startsWith("readonly [")) return "must be an array"
  if (expected.startsWith("Struct") || expected.startsWith("{") || expected.startsWith("Record"))
    return "must be an object"
  return `must be ${expected}`
}

/** The `invalid_request` error for a parse failure: the first issue, prefixed by its field path. */
export const toApiError = (error: ParseResult.ParseError): ApiError => {
  const issues = ParseResult.ArrayFormatter.formatErrorSync(error)
  const first = issues[0]
  if (!first) return ApiError.invalidRequest("the request is not valid")
  const path = formatPath(first.path)
  const message = first._tag === "Unexpected" ? "unknown field" : cleanMessage(first.message)
  return ApiError.invalidRequest(path === "" ? `body: ${message}` : `${path}: ${message}`)
}

/** Decodes an already parsed JSON body with `schema`; failure is `invalid_request` naming the field. */
export const decodeBody =
  <A, I>(schema: Schema.Schema<A, I, never>) =>
  (input: unknown): Effect.Effect<A, ApiError> =>
    Schema.decodeUnknown(schema, options)(input).pipe(Effect.mapError(toApiError))

/** The synchronous form of {@link decodeBody}, for code outside Effect. */
export const decodeBodyEither =
  <A, I>(schema: Schema.Schema<A, I, never>) =>
  (input: unknown): Either.Either<A, ApiError> =>
    Either.mapLeft(Schema.decodeUnknownEither(schema, options)(input), toApiError)

/**
 * How deep arrays and objects may nest in a request body. Nothing in the API nests nearly this
 * deep (a tool's parameter schema is the deepest, a handful of levels); deeper bodies are refused
 * before they are parsed, since decoding and formatting errors recurse once per level.
 */
export const jsonDepthMax = 128

/** Whether arrays and objects in the JSON text nest deeper than `max` (strings are skipped). */
export const nestsDeeperThan = (text: string, max: number): boolean => {
  let depth = 0
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (inString) {
      if (c === 92)
        i++ // backslash: skip the escaped character
      else if (c === 34) inString = false
    } else if (c === 34) inString = true
    else if (c === 123 || c === 91) {
      if (++depth > max) return true
    } else if (c === 125 || c === 93) depth--
  }
  return false
}

/** Parses JSON text and decodes it with `schema`; text that is not JSON, or nests too deep, is `invalid_request`. */
export const decodeJsonBody =
  <A, I>(schema: Schema.Schema<A, I, never>) =>
  (text: string): Effect.Effect<A, ApiError> =>
    nestsDeeperThan(text, jsonDepthMax)
      ? Effect.fail(
          ApiError.invalidRequest(`body: arrays and objects nest more than ${jsonDepthMax} levels deep`),
        )
      : Effect.try({
          try: () => JSON.parse(text) as unknown,
          catch: () => ApiError.invalidRequest("body: not valid JSON"),
        }).pipe(Effect.flatMap(decodeBody(schema)))

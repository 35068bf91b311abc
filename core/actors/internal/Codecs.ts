/**
 * The synchronous codecs of an actor type, built once per type: message bodies to and from JSON,
 * and the checks of a handler's state and reply. Actor schemas are synchronous, and the `Either`
 * forms cost a fraction of the `Effect` ones on the per-message path (no fiber steps, no
 * per-call parser lookup).
 */
import { Either, Schema, SchemaAST } from "effect"
import type { ParseError } from "effect/ParseResult"
import type { AnyActor } from "../../../schema/actors/Actor.ts"

export interface Codecs {
  /** A mailbox body (the message's JSON with its `_tag`) to the message. */
  readonly decodeMessage: (json: string) => Either.Either<{ readonly _tag: string }, ParseError>
  /** A message to its mailbox body. */
  readonly encodeMessage: (message: unknown) => Either.Either<string, ParseError>
  /** Checks that a handler's state encodes (it is stored as its encoding). */
  readonly encodeState: (state: unknown) => Either.Either<unknown, ParseError>
  /** A handler's reply to an ask, encoded. */
  readonly encodeReply: (reply: unknown) => Either.Either<unknown, ParseError>
  /** An encoded reply, as the asker gets it back. */
  readonly decodeReply: (encoded: unknown) => Either.Either<unknown, ParseError>
}

const built = new WeakMap<AnyActor, Codecs>()

// A struct of plain fields (no index signature, no check over the whole): what `Schema.Struct`
// makes, with or without `optionalWith` defaults. Its encoding is its fields' encodings side by side.
type Plain = Schema.Schema<unknown, unknown, never>

const isPlainStruct = (schema: Plain): schema is Plain & { fields: Schema.Struct.Fields } => {
  if (typeof (schema as { fields?: unknown }).fields !== "object") return false
  const plain = (ast: SchemaAST.AST) => SchemaAST.isTypeLiteral(ast) && ast.indexSignatures.length === 0
  const ast = schema.ast
  return (
    plain(ast) ||
    (SchemaAST.isTransformation(ast) &&
      SchemaAST.isTypeLiteralTransformation(ast.transformation) &&
      plain(ast.from) &&
      plain(ast.to))
  )
}

interface Kept {
  /** The field's value as JSON when it was encoded: an object changed in place is not reused. */
  readonly json: string
  /** The one-field struct's encoding (the field, or nothing for an absent optional one). */
  readonly encoded: Readonly<Record<string, unknown>>
}

/**
 * A state's encoding, field by field: a field holding the very object it held when last encoded
 * (a handler returns `{ ...state, next_sequence }`, and the run it carries is the same object) is
 * not encoded again, which is most of the cost of a large state on every message. The object must
 * also still read the same (its JSON), so one changed in place is encoded anew. A state that does
 * not encode takes the whole schema's path, so its error is the same as before.
 */
const fieldwise = (schema: Plain & { fields: Schema.Struct.Fields }) => {
  const whole = Schema.encodeUnknownEither(schema)
  const fields = Object.entries(schema.fields).map(([name, field]) => ({
    name,
    encode: Schema.encodeUnknownEither(Schema.Struct({ [name]: field }) as unknown as Plain),
    kept: new WeakMap<object, Kept>(),
  }))
  return (state: unknown): Either.Either<unknown, ParseError> => {
    if (typeof state !== "object" || state === null) return whole(state)
    const value = state as Record<string, unknown>
    const out: Record<string, unknown> = {}
    for (const f of fields) {
      const v = value[f.name]
      const reusable = typeof v === "object" && v !== null
      const json = reusable ? JSON.stringify(v) : ""
      let encoded = reusable ? f.kept.get(v) : undefined
      if (encoded === undefined || encoded.json !== json) {
        const one = f.encode(f.name in value ? { [f.name]: v } : {})
        if (Either.isLeft(one)) return whole(state)
        encoded = { json, encoded: one.right as Record<string, unknown> }
        if (reusable) f.kept.set(v, encoded)
      }
      if (f.name in encoded.encoded) out[f.name] = encoded.encoded[f.name]
    }
    return Either.right(out)
  }
}

/** The codecs of `actor`. */
export const codecsOf = (actor: AnyActor): Codecs => {
  let codecs = built.get(actor)
  if (codecs === undefined) {
    codecs = {
      decodeMessage: Schema.decodeUnknownEither(Schema.parseJson(actor.message)),
      encodeMessage: Schema.encodeUnknownEither(Schema.parseJson(actor.message)),
      encodeState: isPlainStruct(actor.state)
        ? fieldwise(actor.state)
        : Schema.encodeUnknownEither(actor.state),
      encodeReply: Schema.encodeUnknownEither(actor.reply),
      decodeReply: Schema.decodeUnknownEither(actor.reply),
    }
    built.set(actor, codecs)
  }
  return codecs
}

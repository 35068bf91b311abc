/**
 * The synchronous codecs of an actor type, built once per type: message bodies to and from JSON,
 * and the checks of a handler's state and reply. Actor schemas are synchronous, and the `Either`
 * forms cost a fraction of the `Effect` ones on the per-message path (no fiber steps, no
 * per-call parser lookup).
 */
import { type Either, Schema } from "effect"
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

/** The codecs of `actor`. */
export const codecsOf = (actor: AnyActor): Codecs => {
  let codecs = built.get(actor)
  if (codecs === undefined) {
    codecs = {
      decodeMessage: Schema.decodeUnknownEither(Schema.parseJson(actor.message)),
      encodeMessage: Schema.encodeUnknownEither(Schema.parseJson(actor.message)),
      encodeState: Schema.encodeUnknownEither(actor.state),
      encodeReply: Schema.encodeUnknownEither(actor.reply),
      decodeReply: Schema.decodeUnknownEither(actor.reply),
    }
    built.set(actor, codecs)
  }
  return codecs
}

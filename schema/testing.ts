/** Test helper: the `invalid_request` message a body gets from a schema, or undefined when it decodes. */
import { Either, type Schema } from "effect"
import { decodeBodyEither } from "./Decode.ts"

export const refusal =
  <A, I>(schema: Schema.Schema<A, I, never>) =>
  (body: unknown): string | undefined => {
    const r = decodeBodyEither(schema)(body)
    if (Either.isRight(r)) return undefined
    if (r.left.code !== "invalid_request") throw new Error(`unexpected code ${r.left.code}`)
    return r.left.message
  }

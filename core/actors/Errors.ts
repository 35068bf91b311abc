/** Errors of the actor runtime's client side (`Mailbox.send`, `Mailbox.ask`). */
import { Data } from "effect"

/** A message did not match its actor's schema, so it was not sent. */
export class MessageInvalid extends Data.TaggedError("MessageInvalid")<{
  readonly actor: string
  readonly message: string
}> {}

/** No answer to an `ask` within its timeout (the actor may still handle the message later). */
export class AskTimeout extends Data.TaggedError("AskTimeout")<{
  readonly actor: string
  readonly id: string
  readonly timeoutMs: number
}> {}

/** The actor's handler failed terminally on an asked message; `tag` is the handler error's tag. */
export class AskFailed extends Data.TaggedError("AskFailed")<{
  readonly actor: string
  readonly id: string
  readonly tag: string
  readonly message: string
}> {}

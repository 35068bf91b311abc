/**
 * Actors used by the runtime's tests and benchmark. `Recorder` logs what it receives, forwards,
 * sets timers, answers questions and fails on demand; `Sink` only logs. A process-wide registry
 * notices a handler running twice at once for one actor.
 */
import { Effect, Schema } from "effect"
import * as Actor from "../../../schema/actors/Actor.ts"

/** Actor ids whose handler is running right now, and how often one was entered twice. */
export const running = new Set<string>()
export const overlaps = { count: 0 }
/** Retryable failures still to produce, per `Flaky` key. */
export const flaky = new Map<string, number>()

class Boom extends Schema.TaggedError<Boom>()("Boom", { message: Schema.String }) {}

const RecorderMessage = Schema.Union(
  Schema.TaggedStruct("Add", { sender: Schema.String, n: Schema.Number }),
  Schema.TaggedStruct("Forward", { to: Schema.String, n: Schema.Number }),
  Schema.TaggedStruct("SetTimer", { name: Schema.String, at: Schema.Number, n: Schema.Number }),
  Schema.TaggedStruct("CancelTimer", { name: Schema.String }),
  /** Cancels every timer named, then sets `set` if given: all in one handling, one outbox. */
  Schema.TaggedStruct("CancelTimers", {
    names: Schema.Array(Schema.String),
    set: Schema.optional(Schema.Struct({ name: Schema.String, at: Schema.Number, n: Schema.Number })),
  }),
  Schema.TaggedStruct("Fired", { name: Schema.String, n: Schema.Number, at: Schema.Number }),
  Schema.TaggedStruct("Question", { x: Schema.Number }),
  Schema.TaggedStruct("Fail", { key: Schema.String }),
  Schema.TaggedStruct("Flaky", { key: Schema.String }),
  Schema.TaggedStruct("Defect", {}),
)

const RecorderState = Schema.Struct({
  log: Schema.Array(Schema.String),
  fired: Schema.Array(
    Schema.Struct({ name: Schema.String, n: Schema.Number, at: Schema.Number, handledAt: Schema.Number }),
  ),
})

/** A sink for forwarded messages. */
export const Sink = Actor.make({
  name: "sink",
  state: Schema.Struct({ log: Schema.Array(Schema.String) }),
  initial: { log: [] },
  message: Schema.Union(Schema.TaggedStruct("Add", { sender: Schema.String, n: Schema.Number })),
  handler: (state, message) =>
    Effect.succeed({ state: { log: [...state.log, `${message.sender}:${message.n}`] } }),
})

/** The test actor. */
export const Recorder = Actor.make({
  name: "recorder",
  state: RecorderState,
  initial: { log: [], fired: [] },
  message: RecorderMessage,
  reply: Schema.Number,
  handler: (state, message, ctx) =>
    Effect.gen(function* () {
      if (running.has(ctx.id)) overlaps.count++
      running.add(ctx.id)
      yield* Effect.yieldNow()
      running.delete(ctx.id)
      switch (message._tag) {
        case "Add":
          return { state: { ...state, log: [...state.log, `${message.sender}:${message.n}`] } }
        case "Forward":
          return {
            state: { ...state, log: [...state.log, `fwd:${message.n}`] },
            send: [Actor.to(Sink, message.to, { _tag: "Add", sender: ctx.id, n: message.n })],
          }
        case "SetTimer":
          ctx.schedule(message.name, message.at, {
            _tag: "Fired",
            name: message.name,
            n: message.n,
            at: message.at,
          })
          return { state }
        case "CancelTimer":
          ctx.cancel(message.name)
          return { state }
        case "CancelTimers":
          for (const name of message.names) ctx.cancel(name)
          if (message.set !== undefined)
            ctx.schedule(message.set.name, message.set.at, { _tag: "Fired", ...message.set })
          return { state }
        case "Fired":
          return {
            state: {
              ...state,
              fired: [
                ...state.fired,
                { name: message.name, n: message.n, at: message.at, handledAt: ctx.now },
              ],
            },
          }
        case "Question":
          return { state: { ...state, log: [...state.log, `q:${message.x}`] }, reply: message.x * 2 }
        case "Fail":
          return yield* new Boom({ message: `terminal ${message.key}` })
        case "Flaky": {
          const left = flaky.get(message.key) ?? 0
          if (left > 0) {
            flaky.set(message.key, left - 1)
            return yield* new Actor.Retryable({ message: `flaky ${message.key}` })
          }
          return { state: { ...state, log: [...state.log, `flaky:${message.key}`] } }
        }
        case "Defect":
          throw new Error("a bug in the handler")
      }
    }),
})

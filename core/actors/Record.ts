/**
 * What the runtime stores per actor in KV `actors` under `<type>.<id>`: the handler's state plus the
 * bookkeeping that makes delivery exactly-once in effect — the last applied stream sequence, the
 * outbox of that message (re-published with the same message ids if it is redelivered), the
 * pending timers, and the last terminal failure.
 */
import { Schema } from "effect"
import type { AnyActor } from "../../schema/actors/Actor.ts"

/** An effect recorded with the state, carried out after the write. */
export const OutboxEntry = Schema.Union(
  /** A message to a mailbox, deduplicated by `msgId`. */
  Schema.TaggedStruct("Send", { subject: Schema.String, msgId: Schema.String, body: Schema.String }),
  /** A timer: a message schedule on `subject` firing `body` into `target` at `at` (epoch ms). */
  Schema.TaggedStruct("Schedule", {
    subject: Schema.String,
    target: Schema.String,
    at: Schema.Number,
    timer: Schema.String,
    msgId: Schema.String,
    body: Schema.String,
  }),
  /** A cancelled timer: its schedule subject is purged. */
  Schema.TaggedStruct("Cancel", { subject: Schema.String }),
  /** The answer to an ask, over core NATS. */
  Schema.TaggedStruct("Reply", { inbox: Schema.String, body: Schema.String }),
)
export type OutboxEntry = typeof OutboxEntry.Type

/** The last terminal handler failure. */
export const Failure = Schema.Struct({
  seq: Schema.Number,
  tag: Schema.String,
  message: Schema.String,
  at: Schema.Number,
})
export type Failure = typeof Failure.Type

/** The stored record of one actor. */
export interface ActorRecord<S> {
  readonly state: S
  /** Stream sequence of the last message applied; a delivery at or below it is a redelivery. */
  readonly seq: number
  readonly outbox: ReadonlyArray<OutboxEntry>
  /** Pending timers: name → the id of the schedule that is current (older firings are ignored). */
  readonly timers: { readonly [name: string]: string }
  readonly failure?: Failure | undefined
  /** Terminal failures so far. */
  readonly failures: number
}

/** The record with `state` as its field. */
const recordOf = (state: Schema.Schema.Any): Schema.Schema<ActorRecord<unknown>, unknown> =>
  Schema.Struct({
    state,
    seq: Schema.Number,
    outbox: Schema.Array(OutboxEntry),
    timers: Schema.Record({ key: Schema.String, value: Schema.String }),
    failure: Schema.optional(Failure),
    failures: Schema.Number,
  }) as unknown as Schema.Schema<ActorRecord<unknown>, unknown>

/** The record schema of an actor type. */
export const recordSchema = <A extends AnyActor>(
  actor: A,
): Schema.Schema<ActorRecord<A["initial"]>, unknown> => {
  // One schema per actor type: effect compiles a decoder per schema, so a fresh one per read
  // (State.read on a request path) would compile it again every time.
  let schema = recordSchemas.get(actor)
  if (schema === undefined) {
    schema = recordOf(actor.state)
    recordSchemas.set(actor, schema)
  }
  return schema as Schema.Schema<ActorRecord<A["initial"]>, unknown>
}
const recordSchemas = new WeakMap<AnyActor, Schema.Schema<ActorRecord<unknown>, unknown>>()

/**
 * The record as it is written when its state is already in its encoded form (the handle step
 * encodes each new state once, to check it; the write takes that encoding instead of encoding the
 * state a second time). Read records with `recordSchema`.
 */
export const encodedStateRecordSchema: Schema.Schema<ActorRecord<unknown>, unknown> = recordOf(Schema.Unknown)

/** The record of an actor that has never handled a message. */
export const initialRecord = <S>(state: S): ActorRecord<S> => ({
  state,
  seq: 0,
  outbox: [],
  timers: {},
  failures: 0,
})

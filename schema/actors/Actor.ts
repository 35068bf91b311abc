/**
 * Actor definitions: a type name, a state schema with its initial value, a message schema (a tagged
 * union), an optional reply schema for `ask`, and a handler `(state, message, context) → Effect<{
 * state, send, reply }>`. Handlers are pure decisions: slow side effects (VMs, SSH, vendors) run
 * elsewhere and report back as messages.
 *
 * Whether a handler failure is retried is part of its type (as Restate's `TerminalError` and
 * Temporal's `nonRetryable`): an error with `retryable: true` is retried with backoff, any other
 * failure (and any defect) is terminal: recorded in the actor's stored record, message acknowledged.
 */

import type { Effect } from "effect"
import { Data, Schema } from "effect"

/** What a handler can see and do besides returning its result. */
export interface ActorContext<M> {
  readonly type: string
  readonly id: string
  /** The current time (epoch ms) read from `Clock` when handling began, so `TestClock` drives it. */
  readonly now: number
  /**
   * When the message entered the mailbox (epoch ms, the NATS server's clock; the same on every
   * redelivery): for a timer, when it fired, however late a worker handles it.
   */
  readonly sentAt: number
  /** Stream sequence of the message being handled (unique, stable across redeliveries). */
  readonly seq: number
  /**
   * Whether another message for this actor is waiting right behind this one, to be applied in the
   * same group (one state write). A handler may leave costly work that depends only on its state
   * to the last message of a group (the scheduler places once per group); since a group can end
   * early (a retry, a full outbox, a timer that no longer counts), work so left must also be done
   * by a timer.
   */
  readonly more: boolean
  /**
   * Arranges for `message` to arrive in this actor's own mailbox at `at` (epoch ms or Date); a later
   * schedule with the same `name` replaces this one. Takes effect only if the handler succeeds.
   */
  readonly schedule: (name: string, at: number | Date, message: M) => void
  /** Cancels the timer `name` (a no-op if none is pending). Takes effect only if the handler succeeds. */
  readonly cancel: (name: string) => void
}

/** A message for another (or the same) actor, published after the handler's state is stored. */
export interface Outgoing {
  readonly actor: AnyActor
  readonly id: string
  readonly message: unknown
}

/** What a handler returns. */
export interface HandlerResult<S, R> {
  readonly state: S
  readonly send?: ReadonlyArray<Outgoing> | undefined
  /** The answer to an `ask` (ignored when the message was a plain `send`). */
  readonly reply?: R | undefined
}

/** An actor type. */
export interface Actor<
  S,
  SI,
  M extends { readonly _tag: string },
  MI,
  R = unknown,
  RI = unknown,
  E = unknown,
> {
  /** The type name: a subject token (no `.`, `*`, `>` or spaces). */
  readonly name: string
  readonly state: Schema.Schema<S, SI>
  readonly initial: S
  readonly message: Schema.Schema<M, MI>
  readonly reply: Schema.Schema<R, RI>
  readonly handler: (state: S, message: M, context: ActorContext<M>) => Effect.Effect<HandlerResult<S, R>, E>
}

// biome-ignore lint/suspicious/noExplicitAny: a heterogeneous list of actor types.
export type AnyActor = Actor<any, any, any, any, any, any, any>

/** The message type of an actor. */
export type MessageOf<A> =
  A extends Actor<infer _S, infer _SI, infer M, infer _MI, infer _R, infer _RI, infer _E> ? M : never
/** The state type of an actor. */
export type StateOf<A> =
  A extends Actor<infer S, infer _SI, infer _M, infer _MI, infer _R, infer _RI, infer _E> ? S : never
/** The reply type of an actor. */
export type ReplyOf<A> =
  A extends Actor<infer _S, infer _SI, infer _M, infer _MI, infer R, infer _RI, infer _E> ? R : never

/** Defines an actor type; `reply` defaults to `Schema.Unknown`. */
export const make = <
  S,
  SI,
  M extends { readonly _tag: string },
  MI,
  E,
  R = unknown,
  RI = unknown,
>(definition: {
  readonly name: string
  readonly state: Schema.Schema<S, SI>
  readonly initial: S
  readonly message: Schema.Schema<M, MI>
  readonly reply?: Schema.Schema<R, RI>
  readonly handler: (state: S, message: M, context: ActorContext<M>) => Effect.Effect<HandlerResult<S, R>, E>
}): Actor<S, SI, M, MI, R, RI, E> => {
  if (!/^[A-Za-z0-9_-]+$/.test(definition.name))
    throw new Error(`invalid actor type name: ${definition.name}`)
  return { ...definition, reply: definition.reply ?? (Schema.Unknown as unknown as Schema.Schema<R, RI>) }
}

/** A message to actor `id` of type `actor`, for a handler's `send`. */
export const to = <A extends AnyActor>(actor: A, id: string, message: MessageOf<A>): Outgoing => ({
  actor,
  id,
  message,
})

/** A handler failure worth retrying (a transient condition); retried with backoff, the partition keeps order. */
export class Retryable extends Data.TaggedError("Retryable")<{
  readonly message: string
  readonly cause?: unknown
}> {
  readonly retryable = true
}

/** Whether a handler failure is retried: it carries `retryable: true` (see `Retryable`). */
export const isRetryable = (error: unknown): boolean =>
  typeof error === "object" && error !== null && (error as { retryable?: unknown }).retryable === true

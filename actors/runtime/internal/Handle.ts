/**
 * Handling one delivered mailbox message, the heart of the runtime:
 *
 * 1. a delivery at or below the stored `seq` is a redelivery: its recorded outbox is published
 *    again (same message ids, so nothing is stored twice) and it is acked;
 * 2. otherwise the handler runs; its new state, the last applied `seq` and its outbox are written in
 *    one compare-and-set on the revision read — a stale owner's write fails and it stops;
 * 3. the outbox is published, then the message is acked.
 *
 * A crash anywhere leaves either nothing written (the message is redelivered and handled) or the
 * record written (the redelivery re-publishes its outbox): each effect happens once.
 */
import { Cause, Clock, Data, Effect, Exit, Option, Schema } from "effect"
import type { Delivery } from "../../../core/Consumer.ts"
import type { Kv } from "../../../core/Kv.ts"
import type { Nats, NatsError } from "../../../core/Nats.ts"
import type { StorageNames } from "../../../schema/Subjects.ts"
import { kvKeys } from "../../../schema/Subjects.ts"
import { type ActorContext, type AnyActor, isRetryable } from "../Actor.ts"
import { encodeMessage, REPLY_HEADER } from "../Mailbox.ts"
import { publishAll, TIMER_HEADER, TIMER_ID_HEADER } from "../Outbox.ts"
import { partitionOf } from "../Partition.ts"
import { type ActorRecord, initialRecord, type OutboxEntry } from "../Record.ts"
import type { ActorSettingsShape } from "../Settings.ts"

/** Where a test may make a worker die (see `WorkerFaults`). */
export type CrashPoint = "afterStateWrite" | "afterPublish" | "afterAck"

/** The partition's lease ran out before this worker could renew it: stop consuming. */
export class LeaseExpired extends Data.TaggedError("LeaseExpired")<{ readonly partition: string }> {}

/** Another owner wrote the actor's state: this worker is stale for the partition and stops. */
export class StaleOwner extends Data.TaggedError("StaleOwner")<{ readonly key: string }> {}

interface Cached {
  readonly record: ActorRecord<unknown>
  readonly revision: number
}

/** Everything the handling of one partition's messages needs. */
export interface PartitionRuntime {
  readonly actor: AnyActor
  readonly partition: number
  readonly label: string
  readonly kv: Kv<ActorRecord<unknown>>
  readonly names: StorageNames
  readonly settings: ActorSettingsShape
  /** Records read or written while owning the partition (we are the only writer). */
  readonly cache: Map<string, Cached>
  /** Epoch ms until which our lease is known valid. */
  readonly leaseDeadline: () => number
  /** Called at each crash point; returns `Effect.never` after marking the worker dead when it matches. */
  readonly fault: (
    point: CrashPoint,
    info: { readonly id: string; readonly tag: string; readonly seq: number },
  ) => Effect.Effect<void>
}

const CACHE_LIMIT = 10_000

// Built once per actor type: a schema's parser is cached by its AST, but `parseJson` makes a new one.
const decoders = new WeakMap<AnyActor, (input: unknown) => Effect.Effect<unknown, unknown>>()
const decoderOf = (actor: AnyActor) => {
  let decode = decoders.get(actor)
  if (decode === undefined) {
    decode = Schema.decodeUnknown(Schema.parseJson(actor.message))
    decoders.set(actor, decode)
  }
  return decode
}
const decoder = new TextDecoder()

const describe = (error: unknown): { tag: string; message: string } => {
  if (typeof error === "object" && error !== null) {
    const tag = (error as { _tag?: unknown })._tag
    const message = (error as { message?: unknown }).message
    return {
      tag: typeof tag === "string" ? tag : error instanceof Error ? error.name : "Error",
      message: typeof message === "string" ? message : String(error),
    }
  }
  return { tag: "Error", message: String(error) }
}

type Outcome =
  | { readonly _tag: "Applied"; readonly record: ActorRecord<unknown>; readonly messageTag: string }
  | { readonly _tag: "Retry"; readonly error: unknown; readonly messageTag: string }

/**
 * Handles one delivery, retrying a retryable handler failure or infrastructure trouble in place with
 * exponential backoff (the message stays unacknowledged and this actor's later messages wait behind
 * it, which keeps its order; other actors of the partition go on). Fails only when the partition
 * must stop (lease gone, stale owner).
 */
export const handle = (
  rt: PartitionRuntime,
  d: Delivery,
): Effect.Effect<void, LeaseExpired | StaleOwner, Nats> =>
  Effect.gen(function* () {
    for (let attempt = 0; ; attempt++) {
      const retry = yield* handleOnce(rt, d, attempt)
      if (retry === undefined) return
      // Keep the server from redelivering the message to someone else while we wait.
      d.working()
      yield* Effect.sleep(retry)
    }
  })

const backoff = (rt: PartitionRuntime, attempt: number) =>
  Math.min(rt.settings.retryMaxMs, rt.settings.retryBaseMs * 2 ** Math.min(20, attempt))

/** One attempt; returns the delay before the next one when it should be retried. */
const handleOnce = (
  rt: PartitionRuntime,
  d: Delivery,
  attempt: number,
): Effect.Effect<number | undefined, LeaseExpired | StaleOwner, Nats> =>
  Effect.gen(function* () {
    const started = yield* Clock.currentTimeMillis
    if (started >= rt.leaseDeadline()) return yield* new LeaseExpired({ partition: rt.label })
    const { actor, names } = rt
    const stream = names.streams.MAILBOX.name
    const id = d.subject.slice(d.subject.lastIndexOf(".") + 1)
    const key = kvKeys.actor(actor.name, id)

    const cached =
      rt.cache.get(key) ??
      Option.match(yield* rt.kv.get(key), {
        onNone: () => ({ record: initialRecord(actor.initial), revision: 0 }),
        onSome: (e) => ({ record: e.value, revision: e.revision }),
      })
    const { record, revision } = cached

    const log = (outcome: string, messageTag: string) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Effect.logInfo("handled").pipe(
          Effect.annotateLogs({
            actor: actor.name,
            id,
            tag: messageTag,
            seq: d.seq,
            outcome,
            ms: now - started,
          }),
        ),
      )

    // 1. Redelivery of an applied message (a crash after the state write): finish its effects.
    if (d.seq <= record.seq) {
      if (d.seq === record.seq) yield* publishAll(stream, record.outbox)
      d.ack()
      yield* log("redelivered", "-")
      return undefined
    }

    // A timer that was replaced or cancelled after it had already fired into the mailbox.
    const timer = d.header(TIMER_HEADER)
    if (timer !== undefined && record.timers[timer] !== d.header(TIMER_ID_HEADER)) {
      d.ack()
      yield* log("stale-timer", timer)
      return undefined
    }

    // 2. Decode and run the handler, turning its result into the next record.
    const replyTo = d.header(REPLY_HEADER)
    const partition = partitionOf(id, rt.settings.partitions)
    const baseId = `${key}@${d.seq}`
    const timerOps = new Map<string, { readonly at: number; readonly message: unknown } | null>()
    const context: ActorContext<unknown> = {
      type: actor.name,
      id,
      now: started,
      seq: d.seq,
      schedule: (name, at, message) => {
        timerOps.set(name, { at: typeof at === "number" ? at : at.getTime(), message })
      },
      cancel: (name) => {
        timerOps.set(name, null)
      },
    }

    const failed = (error: unknown, messageTag: string): Outcome => {
      const { tag, message } = describe(error)
      const outbox: Array<OutboxEntry> = replyTo
        ? [{ _tag: "Reply", inbox: replyTo, body: JSON.stringify({ _tag: "Failed", tag, message }) }]
        : []
      return {
        _tag: "Applied",
        messageTag,
        record: {
          ...record,
          seq: d.seq,
          outbox,
          failure: { seq: d.seq, tag, message, at: started },
          failures: record.failures + 1,
        },
      }
    }

    const run = Effect.gen(function* () {
      const decoded = yield* Effect.exit(decoderOf(actor)(decoder.decode(d.data)))
      if (Exit.isFailure(decoded)) return failed(Cause.squash(decoded.cause), "invalid")
      const message = decoded.value as { readonly _tag: string }
      const exit = yield* Effect.exit(Effect.suspend(() => actor.handler(record.state, message, context)))
      if (Exit.isFailure(exit)) {
        if (Cause.isInterruptedOnly(exit.cause)) return yield* Effect.interrupt
        const error = Option.getOrElse(Cause.failureOption(exit.cause), () => Cause.squash(exit.cause))
        return isRetryable(error)
          ? ({ _tag: "Retry", error, messageTag: message._tag } satisfies Outcome)
          : failed(error, message._tag)
      }
      const result = exit.value
      const outbox: Array<OutboxEntry> = []
      const sends = result.send ?? []
      for (let i = 0; i < sends.length; i++) {
        const o = sends[i]!
        outbox.push({
          _tag: "Send",
          subject: names.subjects.mailbox(o.actor.name, partitionOf(o.id, rt.settings.partitions), o.id),
          msgId: `${baseId}.${i}`,
          body: yield* encodeMessage(o.actor, o.message),
        })
      }
      const timers: Record<string, string> = { ...record.timers }
      if (timer !== undefined) delete timers[timer]
      for (const [name, op] of timerOps) {
        const subject = names.subjects.timer(actor.name, partition, id, name)
        if (op === null) {
          delete timers[name]
          outbox.push({ _tag: "Cancel", subject })
        } else {
          const msgId = `${baseId}.t.${name}`
          timers[name] = msgId
          outbox.push({
            _tag: "Schedule",
            subject,
            target: names.subjects.mailbox(actor.name, partition, id),
            at: op.at,
            timer: name,
            msgId,
            body: yield* encodeMessage(actor, op.message),
          })
        }
      }
      if (replyTo) {
        const value = yield* Schema.encodeUnknown(actor.reply)(result.reply ?? null)
        outbox.push({ _tag: "Reply", inbox: replyTo, body: JSON.stringify({ _tag: "Ok", value }) })
      }
      // The state must encode before it is stored; a handler returning an invalid one fails terminally.
      yield* Schema.encodeUnknown(actor.state)(result.state)
      return {
        _tag: "Applied",
        messageTag: message._tag,
        record: { ...record, state: result.state, seq: d.seq, outbox, timers },
      } satisfies Outcome
    })
    const outcome: Outcome = yield* run.pipe(
      Effect.catchAll((error) => Effect.succeed(failed(error, "invalid"))),
      Effect.catchAllDefect((defect) => Effect.succeed(failed(defect, "defect"))),
    )

    if (outcome._tag === "Retry") {
      const delay = backoff(rt, attempt)
      yield* log("retry", outcome.messageTag).pipe(
        Effect.annotateLogs({ error: describe(outcome.error), retryInMs: delay }),
      )
      return delay
    }

    // 3. Store state + outbox with the revision read; a conflict means another owner took over.
    if ((yield* Clock.currentTimeMillis) >= rt.leaseDeadline())
      return yield* new LeaseExpired({ partition: rt.label })
    const written = yield* rt.kv.update(key, outcome.record, revision).pipe(
      Effect.catchTag("StateConflict", () => {
        rt.cache.delete(key)
        return Effect.fail(new StaleOwner({ key }))
      }),
    )
    if (rt.cache.size >= CACHE_LIMIT) rt.cache.clear()
    rt.cache.set(key, { record: outcome.record, revision: written })
    const info = { id, tag: outcome.messageTag, seq: d.seq }
    yield* rt.fault("afterStateWrite", info)
    yield* publishAll(stream, outcome.record.outbox)
    yield* rt.fault("afterPublish", info)
    d.ack()
    yield* rt.fault("afterAck", info)
    yield* log(outcome.record.failure?.seq === d.seq ? "failed" : "applied", outcome.messageTag)
    return undefined
  }).pipe(
    // Infrastructure trouble (NATS unreachable, a stored record that no longer decodes): retry later.
    Effect.catchTags({
      NatsError: (e: NatsError) => retryLater(rt, d, attempt, e),
      KvValueInvalid: (e) => retryLater(rt, d, attempt, e),
    }),
  )

const retryLater = (rt: PartitionRuntime, d: Delivery, attempt: number, error: unknown) =>
  Effect.gen(function* () {
    // The write may or may not have happened: read the record again next time.
    rt.cache.delete(kvKeys.actor(rt.actor.name, d.subject.slice(d.subject.lastIndexOf(".") + 1)))
    const delay = backoff(rt, attempt)
    yield* Effect.logWarning("delivery failed; retrying").pipe(
      Effect.annotateLogs({ actor: rt.actor.name, seq: d.seq, error: describe(error), retryInMs: delay }),
    )
    return delay
  })

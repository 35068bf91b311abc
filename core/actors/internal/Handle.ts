/**
 * Handling an actor's delivered mailbox messages, the heart of the runtime. The messages of one
 * actor that are waiting when it is free are handled as one group, in stream order:
 *
 * 1. deliveries at or below the stored `seq` are redeliveries: the recorded outbox is published
 *    again when the last applied one comes back (same message ids, so nothing is stored twice), and
 *    they are acked;
 * 2. otherwise the handler runs on each message in turn, on the state the previous one left; the
 *    group's final state, its last applied `seq` and the outboxes of all its messages are written in
 *    one compare-and-set on the revision read — a stale owner's write fails and it stops;
 * 3. the outbox is published, then every message of the group is acked.
 *
 * A crash anywhere leaves either nothing written (the messages are redelivered and handled) or the
 * record written (every message of the group is redelivered, the last one re-publishes the group's
 * outbox): each effect happens once. One write per group instead of per message is what lets a busy
 * actor keep up (group commit); a lone message is a group of one.
 */
import { Cause, Clock, Data, Effect, Either, Exit, Option } from "effect"
import { type ActorContext, type AnyActor, isRetryable } from "../../../schema/actors/Actor.ts"
import type { StorageNames } from "../../../schema/Subjects.ts"
import { kvKeys } from "../../../schema/Subjects.ts"
import type { Delivery } from "../../Consumer.ts"
import type { Kv } from "../../Kv.ts"
import type { Nats, NatsError } from "../../Nats.ts"
import { encodeMessage, REPLY_HEADER } from "../Mailbox.ts"
import { publishAll, TIMER_HEADER, TIMER_ID_HEADER } from "../Outbox.ts"
import { partitionOf } from "../Partition.ts"
import { type ActorRecord, initialRecord, type OutboxEntry } from "../Record.ts"
import type { ActorSettingsShape } from "../Settings.ts"
import { codecsOf } from "./Codecs.ts"

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
  /** The same bucket, for records whose state is already encoded (`encodedStateRecordSchema`). */
  readonly encodedKv: Kv<ActorRecord<unknown>>
  readonly names: StorageNames
  readonly settings: ActorSettingsShape
  /** Records read or written while owning the partition (we are the only writer). */
  readonly cache: Map<string, Cached>
  /** Epoch ms until which our lease is known valid. */
  readonly leaseDeadline: () => number
  /**
   * Test-only (`WorkerFaults`): called at each crash point for each message of the group; returns
   * `Effect.never` after marking the worker dead when it matches.
   */
  readonly fault?: (
    point: CrashPoint,
    info: { readonly id: string; readonly tag: string; readonly seq: number; readonly group: number },
  ) => Effect.Effect<void>
}

const CACHE_LIMIT = 10_000

const textDecoder = new TextDecoder()

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

/** How one message of a group turned out. */
type Step =
  | {
      readonly _tag: "Applied"
      /** The record after this message (its state, timers and failure; `seq`/`outbox` are the group's). */
      readonly record: ActorRecord<unknown>
      /** The encoding of `record.state` when this message set a new one (outcome `applied`) and was checked alone. */
      readonly encodedState?: unknown
      readonly outbox: ReadonlyArray<OutboxEntry>
      readonly messageTag: string
      readonly outcome: "applied" | "failed" | "stale-timer"
    }
  | { readonly _tag: "Retry"; readonly error: unknown; readonly messageTag: string }

/** A group's outbox stops growing past this many body bytes; the rest of the messages form the next group. */
const GROUP_OUTBOX_BYTES = 256 * 1024

/**
 * Handles the deliveries of one actor (in stream order), retrying a retryable handler failure or
 * infrastructure trouble in place with exponential backoff (the message stays unacknowledged and the
 * messages after it wait, which keeps the actor's order; other actors of the partition go on).
 * Fails only when the partition must stop (lease gone, stale owner).
 */
export const handle = (
  rt: PartitionRuntime,
  deliveries: ReadonlyArray<Delivery>,
): Effect.Effect<void, LeaseExpired | StaleOwner, Nats> =>
  Effect.gen(function* () {
    let from = 0
    let attempt = 0
    while (from < deliveries.length) {
      const result = yield* handleGroup(rt, deliveries, from, attempt)
      from = result.next
      attempt = result.handled === 0 ? attempt + 1 : 0
      if (result.retryInMs === undefined || result.retryInMs === 0) continue
      // Keep the server from redelivering the waiting messages to someone else meanwhile.
      for (let i = from; i < deliveries.length; i++) deliveries[i]!.working()
      yield* Effect.sleep(result.retryInMs)
    }
  })

const backoff = (rt: PartitionRuntime, attempt: number) =>
  Math.min(rt.settings.retryMaxMs, rt.settings.retryBaseMs * 2 ** Math.min(20, attempt))

const idOf = (d: Delivery) => d.subject.slice(d.subject.lastIndexOf(".") + 1)

interface GroupResult {
  /** Index of the first delivery not yet done. */
  readonly next: number
  /** Deliveries done by this call. */
  readonly handled: number
  /** Set when the delivery at `next` must be tried again after this delay. */
  readonly retryInMs?: number
}

/**
 * One group starting at `deliveries[from]`: the redeliveries at its head, or the longest run of new
 * messages that can be applied together (up to a retryable failure or a full outbox), stored in one
 * write, published, acked.
 *
 * A state must encode before it is stored. The group's last state is encoded once, for the write
 * (encoding is the cost of a large state, and an actor such as the scheduler takes many messages at
 * a time); should it not encode, the group is applied again with each message's state checked
 * (`strict`), so the message that made it invalid fails alone and the others apply as they would
 * have. Handlers only read and return, so applying them again changes nothing outside. (A message
 * whose state does not encode, followed in its group by messages that make it encode again, is not
 * failed: what is stored still always encodes, which is what the check is for.)
 */
const handleGroup = (
  rt: PartitionRuntime,
  deliveries: ReadonlyArray<Delivery>,
  from: number,
  attempt: number,
  strict = false,
): Effect.Effect<GroupResult, LeaseExpired | StaleOwner, Nats> =>
  Effect.gen(function* () {
    const started = yield* Clock.currentTimeMillis
    if (started >= rt.leaseDeadline()) return yield* new LeaseExpired({ partition: rt.label })
    const { actor, names } = rt
    const stream = names.streams.MAILBOX.name
    const id = idOf(deliveries[from]!)
    const key = kvKeys.actor(actor.name, id)

    const cached =
      rt.cache.get(key) ??
      Option.match(yield* rt.kv.get(key), {
        onNone: () => ({ record: initialRecord(actor.initial), revision: 0 }),
        onSome: (e) => ({ record: e.value, revision: e.revision }),
      })
    const { record, revision } = cached

    const log = (d: Delivery, outcome: string, messageTag: string, ended: number, more?: object) =>
      Effect.logInfo("handled", {
        actor: actor.name,
        id,
        tag: messageTag,
        seq: d.seq,
        outcome,
        ms: ended - started,
        ...more,
      })

    // 1. Redeliveries of applied messages (a crash after the state write): finish their effects.
    if (deliveries[from]!.seq <= record.seq) {
      let next = from
      while (next < deliveries.length && deliveries[next]!.seq <= record.seq) {
        const d = deliveries[next++]!
        if (d.seq === record.seq) yield* publishAll(stream, record.outbox)
        d.ack()
        yield* log(d, "redelivered", "-", yield* Clock.currentTimeMillis)
      }
      return { next, handled: next - from }
    }

    // 2. Each new message on the state the previous one left.
    const partition = partitionOf(id, rt.settings.partitions)
    const steps: Array<{ readonly d: Delivery; readonly step: Step & { _tag: "Applied" } }> = []
    const outbox: Array<OutboxEntry> = []
    let outboxBytes = 0
    let current = record
    // The encoding of `current.state`, once a message of the group has set (and so encoded) it.
    let encodedState: { readonly value: unknown } | undefined
    let retry: { readonly error: unknown; readonly messageTag: string } | undefined
    let next = from
    while (next < deliveries.length && outboxBytes < GROUP_OUTBOX_BYTES) {
      const d = deliveries[next]!
      // A redelivery behind new messages cannot happen (one actor's messages come in stream order);
      // should it, it waits for the next group, which sees this group's write.
      if (d.seq <= record.seq) break
      const step = yield* applyOne(
        rt,
        id,
        partition,
        current,
        d,
        started,
        strict,
        next + 1 < deliveries.length,
      )
      if (step._tag === "Retry") {
        retry = step
        break
      }
      steps.push({ d, step })
      current = step.record
      if ("encodedState" in step) encodedState = { value: step.encodedState }
      for (const entry of step.outbox) {
        outbox.push(entry)
        outboxBytes += "body" in entry ? entry.body.length : 0
      }
      next++
    }
    if (!strict && steps.some((s) => s.step.outcome === "applied")) {
      const encoded = codecsOf(actor).encodeState(current.state)
      if (Either.isLeft(encoded)) return yield* handleGroup(rt, deliveries, from, attempt, true)
      encodedState = { value: encoded.right }
    }
    if (steps.length > 0) {
      foldCancels(outbox, current.timers, names.subjects.timers(actor.name, partition, id))
      // 3. Store state + outbox with the revision read; a conflict means another owner took over.
      const last = steps[steps.length - 1]!.d
      const changed = steps.some((s) => s.step.outcome !== "stale-timer")
      if (changed) {
        if ((yield* Clock.currentTimeMillis) >= rt.leaseDeadline())
          return yield* new LeaseExpired({ partition: rt.label })
        const stored: ActorRecord<unknown> = { ...current, seq: last.seq, outbox }
        const written = yield* (
          encodedState === undefined
            ? rt.kv.update(key, stored, revision)
            : rt.encodedKv.update(key, { ...stored, state: encodedState.value }, revision)
        ).pipe(
          Effect.catchTag("StateConflict", () => {
            rt.cache.delete(key)
            return Effect.fail(new StaleOwner({ key }))
          }),
        )
        if (rt.cache.size >= CACHE_LIMIT) rt.cache.clear()
        rt.cache.set(key, { record: stored, revision: written })
      }
      yield* crashPoint(rt, "afterStateWrite", id, steps)
      yield* publishAll(stream, outbox)
      yield* crashPoint(rt, "afterPublish", id, steps)
      for (const { d } of steps) d.ack()
      yield* crashPoint(rt, "afterAck", id, steps)
      const ended = yield* Clock.currentTimeMillis
      for (const { d, step } of steps) yield* log(d, step.outcome, step.messageTag, ended)
    }

    if (retry === undefined) return { next, handled: next - from }
    // The applied messages before the failing one are stored; it is tried again on its own.
    const delay = steps.length > 0 ? 0 : backoff(rt, attempt)
    if (steps.length === 0) {
      yield* log(deliveries[next]!, "retry", retry.messageTag, yield* Clock.currentTimeMillis, {
        error: describe(retry.error),
        retryInMs: delay,
      })
    }
    return { next, handled: next - from, retryInMs: delay }
  }).pipe(
    // Infrastructure trouble (NATS unreachable, a stored record that no longer decodes): retry later.
    Effect.catchTags({
      NatsError: (e: NatsError) => retryLater(rt, deliveries, from, attempt, e),
      KvValueInvalid: (e) => retryLater(rt, deliveries, from, attempt, e),
    }),
  )

/**
 * A group that cancels two or more timers, schedules none and leaves the actor none (a run's end
 * cancels three) purges them in one request, every timer of the actor at once (`allTimers`), in
 * place of the first cancel: one purge (and one JetStream advisory) instead of one per timer. Only
 * with no schedule in the outbox, which the purge could otherwise overtake and remove (its subject
 * is not theirs, so `publishAll` would not keep them in order).
 */
const foldCancels = (
  outbox: Array<OutboxEntry>,
  timersLeft: Readonly<Record<string, string>>,
  allTimers: string,
): void => {
  let cancels = 0
  for (const e of outbox) {
    if (e._tag === "Schedule") return
    if (e._tag === "Cancel") cancels++
  }
  if (cancels < 2 || Object.keys(timersLeft).length > 0) return
  const first = outbox.findIndex((e) => e._tag === "Cancel")
  const kept = outbox.filter((e, i) => e._tag !== "Cancel" || i === first)
  kept[first] = { _tag: "Cancel", subject: allTimers }
  outbox.splice(0, outbox.length, ...kept)
}

const crashPoint = (
  rt: PartitionRuntime,
  point: CrashPoint,
  id: string,
  steps: ReadonlyArray<{ readonly d: Delivery; readonly step: { readonly messageTag: string } }>,
) =>
  rt.fault === undefined
    ? Effect.void
    : Effect.forEach(
        steps,
        ({ d, step }) => rt.fault!(point, { id, tag: step.messageTag, seq: d.seq, group: steps.length }),
        { discard: true },
      )

/** Runs the handler for one new message on `record`, turning its result into the next record. */
const applyOne = (
  rt: PartitionRuntime,
  id: string,
  partition: number,
  record: ActorRecord<unknown>,
  d: Delivery,
  now: number,
  /** Whether to encode the new state here (else the group encodes its last state once). */
  check: boolean,
  /** Whether another delivery follows this one in the batch (`ActorContext.more`). */
  more: boolean,
): Effect.Effect<Step> => {
  const { actor, names } = rt
  const key = kvKeys.actor(actor.name, id)
  const codecs = codecsOf(actor)

  // A timer that was replaced or cancelled after it had already fired into the mailbox.
  const timer = d.header(TIMER_HEADER)
  if (timer !== undefined && record.timers[timer] !== d.header(TIMER_ID_HEADER)) {
    return Effect.succeed({ _tag: "Applied", record, outbox: [], messageTag: timer, outcome: "stale-timer" })
  }

  const replyTo = d.header(REPLY_HEADER)
  const baseId = `${key}@${d.seq}`
  const timerOps = new Map<string, { readonly at: number; readonly message: unknown } | null>()
  const context: ActorContext<unknown> = {
    type: actor.name,
    id,
    now,
    sentAt: d.storedAt,
    more,
    seq: d.seq,
    schedule: (name, at, message) => {
      timerOps.set(name, { at: typeof at === "number" ? at : at.getTime(), message })
    },
    cancel: (name) => {
      timerOps.set(name, null)
    },
  }

  const failed = (error: unknown, messageTag: string): Step => {
    const { tag, message } = describe(error)
    return {
      _tag: "Applied",
      messageTag,
      outcome: "failed",
      outbox: replyTo
        ? [{ _tag: "Reply", inbox: replyTo, body: JSON.stringify({ _tag: "Failed", tag, message }) }]
        : [],
      record: { ...record, failure: { seq: d.seq, tag, message, at: now }, failures: record.failures + 1 },
    }
  }

  return Effect.gen(function* () {
    const decoded = codecs.decodeMessage(textDecoder.decode(d.data))
    if (Either.isLeft(decoded)) return failed(decoded.left, "invalid")
    const message = decoded.right
    const exit = yield* Effect.exit(Effect.suspend(() => actor.handler(record.state, message, context)))
    if (Exit.isFailure(exit)) {
      if (Cause.isInterruptedOnly(exit.cause)) return yield* Effect.interrupt
      const error = Option.getOrElse(Cause.failureOption(exit.cause), () => Cause.squash(exit.cause))
      return isRetryable(error)
        ? ({ _tag: "Retry", error, messageTag: message._tag } satisfies Step)
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
        // A timer not scheduled has nothing stored to purge: its last schedule fired, or the
        // cancel that took it off the record purged it (published before that message's ack).
        if (!(name in timers)) continue
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
      const value = yield* codecs.encodeReply(result.reply ?? null)
      outbox.push({ _tag: "Reply", inbox: replyTo, body: JSON.stringify({ _tag: "Ok", value }) })
    }
    const applied = {
      _tag: "Applied",
      messageTag: message._tag,
      outcome: "applied",
      outbox,
      record: { ...record, state: result.state, timers },
    } satisfies Step
    if (!check) return applied
    // The state must encode before it is stored; a handler returning an invalid one fails
    // terminally. The write stores this encoding.
    return { ...applied, encodedState: yield* codecs.encodeState(result.state) } satisfies Step
  }).pipe(
    Effect.catchAll((error) => Effect.succeed(failed(error, "invalid"))),
    Effect.catchAllDefect((defect) => Effect.succeed(failed(defect, "defect"))),
  )
}

const retryLater = (
  rt: PartitionRuntime,
  deliveries: ReadonlyArray<Delivery>,
  from: number,
  attempt: number,
  error: unknown,
) =>
  Effect.gen(function* () {
    // The write may or may not have happened: read the record again next time.
    rt.cache.delete(kvKeys.actor(rt.actor.name, idOf(deliveries[from]!)))
    const delay = backoff(rt, attempt)
    yield* Effect.logWarning("delivery failed; retrying").pipe(
      Effect.annotateLogs({
        actor: rt.actor.name,
        seq: deliveries[from]!.seq,
        error: describe(error),
        retryInMs: delay,
      }),
    )
    return { next: from, handled: 0, retryInMs: delay } satisfies GroupResult
  })

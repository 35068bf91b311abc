/**
 * Request-reply on one connection through a single wildcard inbox subscription (`<inbox>.*`), made
 * once when the connection opens. Used for the requests on hot paths: JetStream publishes (every
 * actor message, every state write) and asks.
 *
 * Why not the client's `request`: nats.js gives each request its own promise, `Promise.race`, timer
 * and, on every success, a stack-traced `RequestError("cancelled")` it then throws away; that was a
 * third of the cost of a JetStream publish. Here a request is an entry in a map resumed straight
 * from the subscription callback; deadlines are checked by one sweep timer; and because the inbox
 * subscription already exists on the server, an ask needs no flush before it is sent.
 */
import { createInbox, type Msg, type MsgHdrs, type NatsConnection } from "@nats-io/transport-node"
import { Data, Effect } from "effect"
import { NatsError } from "./Nats.ts"

export interface Requests {
  /**
   * Publishes `data` to `subject` with a reply address of its own and succeeds with the first
   * reply; fails with `NatsError` after `timeoutMs`, when nobody listens on `subject` (the server's
   * 503), or when the connection closes. Interrupting it forgets the request.
   */
  readonly request: (
    operation: string,
    subject: string,
    data: Uint8Array | string,
    headers: MsgHdrs | undefined,
    timeoutMs: number,
  ) => Effect.Effect<Msg, NatsError>
  /**
   * As `request`, in two steps: running the outer effect publishes at once, and the inner one waits
   * for the reply (it may have come already). Several requests sent before any is awaited leave in
   * one socket write, with no fiber each. A reply never awaited is forgotten at its deadline.
   */
  readonly send: (
    operation: string,
    subject: string,
    data: Uint8Array | string,
    headers: MsgHdrs | undefined,
    timeoutMs: number,
  ) => Effect.Effect<Effect.Effect<Msg, NatsError>, NatsError>
  /**
   * A fresh reply address under the shared inbox, for answers that come from elsewhere (an actor
   * answering a question that travelled through its mailbox), listening from the moment it is made.
   * `reply` waits for the first message sent to it (kept if it came before anyone waited), failing
   * with `ReplyTimeout` once `timeoutMs` have passed since the address was made (checked by the
   * sweep, so up to 100 ms late). An answered or timed-out address is forgotten by itself;
   * `release` forgets one given up on.
   */
  readonly inbox: (operation: string, timeoutMs: number) => Inbox
  /**
   * False while the server seems frozen: a request timed out within the last 30 s and nothing has
   * answered since (a stopped server keeps the connection open, so no disconnect tells it).
   */
  readonly responsive: () => boolean
  /** When a request or an ask last went unanswered, or a JetStream request found no responder (epoch ms; 0: never). */
  readonly lastTimeout: () => number
  /** Fails every waiting request and stops the sweep (the connection is closing). */
  readonly close: () => void
}

/** A reply address of `Requests.inbox`. */
export interface Inbox {
  readonly subject: string
  readonly reply: Effect.Effect<Msg, NatsError | ReplyTimeout>
  readonly release: () => void
}

/** No reply reached an inbox in time. */
export class ReplyTimeout extends Data.TaggedError("ReplyTimeout")<{ readonly timeoutMs: number }> {}

interface Pending {
  readonly operation: string
  /** Epoch ms after which the sweep fails it with `timedOut`. */
  readonly deadline: number
  readonly timedOut: () => NatsError | ReplyTimeout
  /** A JetStream request (a stream publish, an API call): nobody answering it is the store's trouble. */
  readonly store?: boolean
  readonly resume: (effect: Effect.Effect<Msg, NatsError | ReplyTimeout>) => void
}

/** How long one unanswered request counts as evidence of a frozen server. */
const UNRESPONSIVE_MS = 30_000

/** How often waiting requests are checked against their deadlines. */
const SWEEP_MS = 100

/** How JetStream's answers say it cannot serve now (its API errors start `"error":{"code":…`). */
const UNAVAILABLE = Buffer.from('"error":{"code":503')
/** Error answers are small: longer answers (values read) are not scanned. */
const UNAVAILABLE_SCAN_BYTES = 1024

/** Opens the shared inbox subscription on `connection`. */
export const make = (connection: NatsConnection): Requests => {
  const prefix = `${createInbox()}.`
  const pending = new Map<string, Pending>()
  let next = 0
  let closed = false
  const unavailableAnswer = (data: Uint8Array) =>
    data.length < UNAVAILABLE_SCAN_BYTES &&
    Buffer.from(data.buffer, data.byteOffset, data.byteLength).includes(UNAVAILABLE)
  // Evidence for `responsive`: the last answer of any kind, the last request that timed out.
  let lastAnswer = 0
  let lastTimeout = 0

  connection.subscribe(`${prefix}*`, {
    callback: (_error, msg) => {
      lastAnswer = Date.now()
      const token = msg.subject.slice(prefix.length)
      const waiting = pending.get(token)
      if (waiting === undefined) return
      pending.delete(token)
      const headers = msg.headers
      if (headers?.hasError && headers.code === 503 && msg.data.length === 0) {
        // JetStream without a responder: in a cluster, a stream whose leader just went and whose
        // new one is not elected yet. Not settled, as after a timeout (a core request nobody
        // listens to, as a terminal route nobody joined, is an answer, not trouble).
        if (waiting.store === true) lastTimeout = Date.now()
        waiting.resume(Effect.fail(new NatsError({ operation: waiting.operation, message: "no responders" })))
      } else {
        // JetStream's own "not now" (a frozen or electing cluster answers API requests and
        // publishes `{"error":{"code":503,…}}`, "JetStream system temporarily unavailable"): an
        // answer, but trouble of the store all the same.
        if (waiting.store === true && unavailableAnswer(msg.data)) lastTimeout = Date.now()
        waiting.resume(Effect.succeed(msg))
      }
    },
  })

  const sweep = setInterval(() => {
    if (pending.size === 0) return
    const now = Date.now()
    for (const [token, waiting] of pending) {
      if (waiting.deadline > now) continue
      pending.delete(token)
      // A request the server never answered, or an ask no actor answered in time (a worker
      // restarting, a store just back): either way the service is not settled.
      lastTimeout = now
      waiting.resume(Effect.fail(waiting.timedOut()))
    }
  }, SWEEP_MS)
  sweep.unref()

  // Stream publishes carry headers (message id, expectations); API calls go to `$JS.`.
  const isStore = (subject: string, headers: MsgHdrs | undefined) =>
    headers !== undefined || subject.startsWith("$JS.")
  // Publishes with `token`'s reply address; the failure, if the client refused it.
  const publishAsking = (
    operation: string,
    subject: string,
    data: Uint8Array | string,
    headers: MsgHdrs | undefined,
    token: string,
  ): NatsError | undefined => {
    try {
      connection.publish(subject, data, { reply: prefix + token, ...(headers ? { headers } : {}) })
      return undefined
    } catch (cause) {
      pending.delete(token)
      const message = cause instanceof Error ? cause.message : String(cause)
      return new NatsError({ operation, message, cause })
    }
  }

  const request: Requests["request"] = (operation, subject, data, headers, timeoutMs) =>
    Effect.async<Msg, NatsError>((resume) => {
      if (closed) return resume(Effect.fail(new NatsError({ operation, message: "connection closed" })))
      const token = (next++).toString(36)
      pending.set(token, {
        operation,
        deadline: Date.now() + timeoutMs,
        timedOut: () => new NatsError({ operation, message: "timed out" }),
        store: isStore(subject, headers),
        // Only `NatsError`s reach it: its own `timedOut`, "no responders", "connection closed".
        resume: resume as Pending["resume"],
      })
      const refused = publishAsking(operation, subject, data, headers, token)
      if (refused !== undefined) return resume(Effect.fail(refused))
      return Effect.sync(() => {
        pending.delete(token)
      })
    })

  // A reply address whose answer may come before anyone waits for it: kept until then.
  const awaitable = <E>(
    operation: string,
    timeoutMs: number,
    timedOut: () => E,
    store: boolean,
  ): {
    readonly token: string
    readonly subject: string
    readonly reply: Effect.Effect<Msg, NatsError | E>
    readonly release: () => void
  } => {
    const token = (next++).toString(36)
    let arrived: Effect.Effect<Msg, NatsError | E> | undefined
    let waiter: ((effect: Effect.Effect<Msg, NatsError | E>) => void) | undefined
    pending.set(token, {
      operation,
      deadline: Date.now() + timeoutMs,
      timedOut: timedOut as Pending["timedOut"],
      ...(store ? { store } : {}),
      resume: (effect) => {
        const answer = effect as Effect.Effect<Msg, NatsError | E>
        if (waiter !== undefined) waiter(answer)
        else arrived = answer
      },
    })
    const reply = Effect.async<Msg, NatsError | E>((resume) => {
      if (arrived !== undefined) return resume(arrived)
      if (closed) return resume(Effect.fail(new NatsError({ operation, message: "connection closed" })))
      waiter = resume
      return Effect.sync(() => {
        waiter = undefined
      })
    })
    return { token, subject: prefix + token, reply, release: () => pending.delete(token) }
  }

  const send: Requests["send"] = (operation, subject, data, headers, timeoutMs) =>
    Effect.suspend(() => {
      if (closed) return Effect.fail(new NatsError({ operation, message: "connection closed" }))
      const address = awaitable(
        operation,
        timeoutMs,
        () => new NatsError({ operation, message: "timed out" }),
        isStore(subject, headers),
      )
      const refused = publishAsking(operation, subject, data, headers, address.token)
      return refused === undefined ? Effect.succeed(address.reply) : Effect.fail(refused)
    })

  const inbox: Requests["inbox"] = (operation, timeoutMs) =>
    awaitable(operation, timeoutMs, () => new ReplyTimeout({ timeoutMs }), false)

  const close = () => {
    closed = true
    clearInterval(sweep)
    for (const [token, waiting] of pending) {
      pending.delete(token)
      waiting.resume(
        Effect.fail(new NatsError({ operation: waiting.operation, message: "connection closed" })),
      )
    }
  }

  const responsive = () => !(lastTimeout > lastAnswer && Date.now() - lastTimeout < UNRESPONSIVE_MS)

  return { request, send, inbox, responsive, lastTimeout: () => lastTimeout, close }
}

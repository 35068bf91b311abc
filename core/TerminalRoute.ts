/**
 * A terminal route over core NATS (see `Terminal.ts` for the subjects and notes): the host end,
 * held by the host agent that runs the shell, and the caller end, held by whichever relay the
 * caller's WebSocket reached. Nothing is stored: a route lives while its host end listens.
 */
import type { Msg, Subscription } from "@nats-io/transport-node"
import { Deferred, Effect, Queue, type Scope } from "effect"
import { attemptSync, Nats, type NatsError } from "./Nats.ts"
import { Storage } from "./Storage.ts"

/** The caller's frames the host end holds before the shell takes them (32 KiB each at most). */
const INPUT_FRAMES_MAX = 256

/** The host end of a route. */
export interface HostEnd {
  /** Completes when a relay asks to join for a caller (the first one only is let in). */
  readonly joined: Deferred.Deferred<void>
  /** The caller's frames, in order (at most `INPUT_FRAMES_MAX` waiting; more overflows). */
  readonly incoming: Queue.Dequeue<Uint8Array>
  /**
   * The relay's notes (kind 0), apart from the frames so they are never held up behind input the
   * shell is slow to take: credit for output must come while input waits.
   */
  readonly notes: Queue.Dequeue<Uint8Array>
  /**
   * How many messages (frames and notes) the relay has sent since the caller joined: the session
   * compares it beat by beat to tell a relay that is gone.
   */
  readonly heard: () => number
  /** Completes when the caller sent faster than the shell took it, past the bound. */
  readonly overflowed: Deferred.Deferred<void>
  /** Refuses every later join (the session is over or gave up waiting). */
  readonly shut: () => void
  /** Sends a frame or a note towards the caller. */
  readonly send: (message: Uint8Array) => Effect.Effect<void, NatsError>
}

// A callback given an error (a subscription refused) has no message; throwing there would stop
// the connection's reader for every subscription of the process.
const subscribe = (subject: string, callback: (msg: Msg) => void) =>
  Effect.flatMap(Nats, ({ connection }) =>
    Effect.acquireRelease(
      attemptSync(`subscribe ${subject}`, () =>
        connection.subscribe(subject, {
          callback: (e, m) => {
            if (e === null) callback(m)
          },
        }),
      ),
      (sub: Subscription) => Effect.sync(() => sub.unsubscribe()),
    ),
  )

/** Listens on `route` as its host end for the life of the scope. */
export const hostEnd = (route: string): Effect.Effect<HostEnd, NatsError, Nats | Storage | Scope.Scope> =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const { connection } = yield* Nats
    const joined = yield* Deferred.make<void>()
    const overflowed = yield* Deferred.make<void>()
    const incoming = yield* Effect.acquireRelease(
      Queue.dropping<Uint8Array>(INPUT_FRAMES_MAX),
      Queue.shutdown,
    )
    const notes = yield* Effect.acquireRelease(Queue.unbounded<Uint8Array>(), Queue.shutdown)
    let taken = false
    let over = false
    let heard = 0
    yield* subscribe(names.subjects.terminal(route, "in"), (m) => {
      if (!taken) return
      heard++
      if (m.data[0] === 0) return void notes.unsafeOffer(m.data)
      if (!incoming.unsafeOffer(m.data)) Deferred.unsafeDone(overflowed, Effect.void)
    })
    yield* subscribe(names.subjects.terminal(route, "join"), (m) => {
      // One caller per route: the first relay to ask gets it, any later one (or any after the
      // session gave up) is told no.
      const answer = taken || over ? "taken" : "ok"
      if (answer === "ok") {
        taken = true
        Deferred.unsafeDone(joined, Effect.void)
      }
      m.respond(answer)
    })
    // The subscriptions are on the server before anyone is told the route.
    yield* Effect.tryPromise({ try: () => connection.flush(), catch: () => undefined }).pipe(Effect.ignore)
    const out = names.subjects.terminal(route, "out")
    return {
      joined,
      incoming,
      notes,
      heard: () => heard,
      overflowed,
      shut: () => {
        over = true
      },
      send: (message) => attemptSync("terminal send", () => connection.publish(out, message)),
    } satisfies HostEnd
  })

/** Why a caller could not join a route. */
export type JoinRefusal = "unknown" | "taken" | "unavailable"

/** The caller end of a route, as a relay holds it. */
export interface CallerEnd {
  /** Sends one of the caller's frames, or a note, to the host end. */
  readonly send: (message: Uint8Array) => void
  /** Stops listening. */
  readonly close: () => void
}

/**
 * Joins `route` for a caller: listens for what the host end sends (`onMessage`, in order), then
 * asks the host end to let the caller in. A route nobody listens on is `unknown`; one whose caller
 * already came is `taken`.
 */
export const callerEnd = (
  route: string,
  onMessage: (message: Uint8Array) => void,
): Effect.Effect<CallerEnd, JoinRefusal, Nats | Storage> =>
  Effect.gen(function* () {
    const { names } = yield* Storage
    const { connection, requests, reachable } = yield* Nats
    if (!reachable()) return yield* Effect.fail("unavailable" as const)
    const sub = connection.subscribe(names.subjects.terminal(route, "out"), {
      callback: (e, m) => {
        if (e === null) onMessage(m.data)
      },
    })
    const answer = yield* requests
      .request("terminal join", names.subjects.terminal(route, "join"), "", undefined, 5_000)
      .pipe(
        Effect.mapError((e) =>
          e.message.includes("no responders") ? ("unknown" as const) : ("unavailable" as const),
        ),
        Effect.tapError(() => Effect.sync(() => sub.unsubscribe())),
      )
    if (new TextDecoder().decode(answer.data) !== "ok") {
      sub.unsubscribe()
      return yield* Effect.fail("taken" as const)
    }
    const into = names.subjects.terminal(route, "in")
    return {
      send: (message) => {
        if (!connection.isClosed()) connection.publish(into, message)
      },
      close: () => sub.unsubscribe(),
    } satisfies CallerEnd
  })

/**
 * A terminal route over core NATS (see `Terminal.ts` for the subjects and notes): the host end,
 * held by the host agent that runs the shell, and the caller end, held by whichever relay the
 * caller's WebSocket reached. Nothing is stored: a route lives while its host end listens.
 */
import type { Msg, Subscription } from "@nats-io/transport-node"
import { Deferred, Effect, Queue, type Scope } from "effect"
import { attemptSync, Nats, type NatsError } from "./Nats.ts"
import { Storage } from "./Storage.ts"

/** The host end of a route. */
export interface HostEnd {
  /** Completes when a relay asks to join for a caller (the first one only is let in). */
  readonly joined: Deferred.Deferred<void>
  /** What the caller's relay sent: the caller's frames and the relay's notes, in order. */
  readonly incoming: Queue.Dequeue<Uint8Array>
  /** Sends a frame or a note towards the caller. */
  readonly send: (message: Uint8Array) => Effect.Effect<void, NatsError>
}

const subscribe = (subject: string, callback: (msg: Msg) => void) =>
  Effect.flatMap(Nats, ({ connection }) =>
    Effect.acquireRelease(
      attemptSync(`subscribe ${subject}`, () =>
        connection.subscribe(subject, { callback: (_e, m) => callback(m) }),
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
    const incoming = yield* Effect.acquireRelease(Queue.unbounded<Uint8Array>(), Queue.shutdown)
    let taken = false
    yield* subscribe(names.subjects.terminal(route, "in"), (m) => {
      if (taken) incoming.unsafeOffer(m.data)
    })
    yield* subscribe(names.subjects.terminal(route, "join"), (m) => {
      // One caller per route: the first relay to ask gets it, any later one is told no.
      const answer = taken ? "taken" : "ok"
      if (!taken) {
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
      callback: (_e, m) => onMessage(m.data),
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

/**
 * A `terminal` command's session, host side (spec "Terminal session protocol"): a fresh ECDH
 * P-256 pair (its private half never leaves this process), a route of 128 random bits, the
 * machine's login shell on a PTY (`guest/Terminal.ts`), and the host end of the route
 * (`core/TerminalRoute.ts`) through which a relay passes the caller's frames.
 *
 * `open` answers the command's result at once; the session goes on in its own fiber in the
 * machine's scope, so the run's end closes it. It ends when the shell exits (an exit status frame,
 * then a `close 1000`), when the caller's relay says the caller went away, when a frame breaks the
 * protocol (`close 1008`/`1009` with the reason), when the relay said nothing for three heartbeats
 * (it sends `alive` every `heartbeatMs`, as this end does; `close 1001`), or when no caller joined
 * within the join wait.
 * Output waits for the relay's credit (`windowFrames` ahead), so a slow caller slows the shell's
 * output rather than filling memory. The run log gets a line when a terminal opens and closes
 * (command id, when, exit status or reason), never what was typed or shown.
 */
import { randomBytes } from "node:crypto"
import { Cause, Deferred, Effect, ExecutionStrategy, Exit, Fiber, Option, Queue, Scope, Stream } from "effect"
import type { Nats, NatsError } from "../../core/Nats.ts"
import type { Storage } from "../../core/Storage.ts"
import * as Protocol from "../../core/Terminal.ts"
import * as Route from "../../core/TerminalRoute.ts"
import * as TerminalSettings from "../../core/TerminalSettings.ts"
import type { GuestSession, GuestUnavailable, InvalidArguments } from "../guest/GuestSession.ts"
import * as Terminal from "../guest/Terminal.ts"

/** What `open` needs from the run's machine. */
export interface SessionContext {
  readonly guest: GuestSession
  /** The run's variables (the command's own `env` goes over them). */
  readonly env: Readonly<Record<string, string>>
  readonly settings: TerminalSettings.TerminalSettingsShape
  /** Adds a line to the run's log. */
  readonly log: (kind: string, fields: Readonly<Record<string, unknown>>) => Effect.Effect<void>
  /** The scope the session lives in (the machine's): closing it ends the session. */
  readonly scope: Scope.Scope
}

/** What a `terminal` command asks. */
export interface SessionArgs {
  readonly command: string
  readonly rows: number
  readonly cols: number
  /** The caller's public key: an uncompressed P-256 point, base64url. */
  readonly public_key: string
  readonly env?: Readonly<Record<string, string>> | undefined
}

/** The command's result: where to meet the host, and the host's public key. */
export interface SessionResult {
  readonly relay_url: string
  readonly route: string
  readonly public_key: string
}

/** Opens the session and answers where the caller meets it. */
export const open = (
  context: SessionContext,
  args: SessionArgs,
): Effect.Effect<
  SessionResult,
  GuestUnavailable | InvalidArguments | TerminalSettings.TerminalRefused | NatsError,
  Nats | Storage
> =>
  Effect.gen(function* () {
    const callerKey = Buffer.from(args.public_key, "base64url")
    const own = Protocol.newKeyPair()
    const keys = yield* Effect.try({
      try: () => Protocol.sessionKeys(own.ecdh, callerKey, callerKey, own.publicKey),
      catch: () =>
        new TerminalSettings.TerminalRefused({ field: "public_key", detail: "is not a point of P-256" }),
    })
    const route = randomBytes(16).toString("base64url")
    const session = yield* Scope.fork(context.scope, ExecutionStrategy.sequential)
    const opened = yield* Effect.all([
      Terminal.open(context.guest, {
        rows: args.rows,
        cols: args.cols,
        env: { ...context.env, ...args.env },
      }),
      Route.hostEnd(route),
    ]).pipe(
      Scope.extend(session),
      Effect.onError(() => Scope.close(session, Exit.void)),
    )
    const [shell, end] = opened
    yield* context.log("terminal", { command: args.command, state: "opened" })
    const closed = (fields: Readonly<Record<string, unknown>>) =>
      context.log("terminal", { command: args.command, state: "closed", ...fields })
    yield* run(shell, end, keys, context.settings, closed).pipe(
      Effect.ensuring(Scope.close(session, Exit.void)),
      Effect.forkIn(context.scope),
    )
    return {
      relay_url: TerminalSettings.relayUrlOf(context.settings),
      route,
      public_key: own.publicKey.toString("base64url"),
    }
  })

/** How a session ended: the code and reason the caller's WebSocket closes with. */
interface Ending {
  readonly code: number
  readonly reason: string
  readonly exitStatus?: number
}

const run = (
  shell: Terminal.Terminal,
  end: Route.HostEnd,
  keys: { readonly callerToHost: Buffer; readonly hostToCaller: Buffer },
  settings: TerminalSettings.TerminalSettingsShape,
  closed: (fields: Readonly<Record<string, unknown>>) => Effect.Effect<void>,
) =>
  Effect.gen(function* () {
    const joined = yield* Deferred.await(end.joined).pipe(Effect.timeout(settings.joinWaitMs), Effect.option)
    if (Option.isNone(joined)) {
      // No later join is let in; one that came just now still counts.
      end.shut()
      if (!(yield* Deferred.isDone(end.joined))) return yield* closed({ reason: "no caller joined in time" })
    }

    let outSequence = 0n
    let inSequence = 0n
    const credit = yield* Queue.unbounded<void>()
    // At least two of the relay's credit batches (16 frames each), so credit always comes back.
    yield* Queue.offerAll(
      credit,
      Array.from({ length: Math.max(32, settings.windowFrames) }, () => undefined),
    )
    const send = (kind: number, data: Uint8Array) =>
      Effect.suspend(() => end.send(Protocol.seal(keys.hostToCaller, kind, outSequence++, data)))
    const ending = yield* Deferred.make<Ending>()
    const finish = (e: Ending) => Deferred.succeed(ending, e).pipe(Effect.asVoid)

    // The relay's notes, apart from the frames: credit for output, or the end of the session.
    const notes = Effect.gen(function* () {
      for (;;) {
        const note = Protocol.decodeNote(yield* Queue.take(end.notes))
        if (note?._tag === "credit")
          yield* Queue.offerAll(
            credit,
            Array.from({ length: note.frames }, () => undefined),
          )
        else if (note?._tag === "close") return yield* finish({ code: note.code, reason: note.reason })
      }
    })
    // Input faster than the shell takes it, past the bound: the session ends rather than grow.
    const overflow = Effect.zipRight(
      Deferred.await(end.overflowed),
      finish({ code: Protocol.CloseCode.protocol, reason: "input came faster than the shell took it" }),
    )

    // The caller's frames, in order.
    const inbound = Effect.gen(function* () {
      for (;;) {
        const message = yield* Queue.take(end.incoming)
        const head = Protocol.peek(message)
        if ("problem" in head) return yield* finish({ code: head.code, reason: head.problem })
        if (!Protocol.callerKinds.has(head.kind))
          return yield* finish({
            code: Protocol.CloseCode.protocol,
            reason: `frame of unknown kind ${head.kind}`,
          })
        const frame = Protocol.open(keys.callerToHost, message, inSequence)
        if ("problem" in frame)
          return yield* finish({ code: Protocol.CloseCode.protocol, reason: frame.problem })
        inSequence++
        if (frame.kind === Protocol.Kind.input) yield* shell.write(frame.data)
        else {
          if (frame.data.length !== 4)
            return yield* finish({
              code: Protocol.CloseCode.protocol,
              reason: "resize frame of the wrong size",
            })
          const resized = yield* shell
            .resize(frame.data.readUInt16BE(0), frame.data.readUInt16BE(2))
            .pipe(Effect.either)
          if (resized._tag === "Left")
            return yield* finish({
              code: Protocol.CloseCode.protocol,
              reason: `resize: ${resized.left.detail}`,
            })
        }
      }
    })

    // The shell's output in frames of at most 32 KiB, each waiting for credit; then its exit status.
    const outbound = Effect.gen(function* () {
      yield* shell.output.pipe(
        Stream.runForEach((chunk) =>
          Effect.gen(function* () {
            for (let at = 0; at < chunk.byteLength; at += Protocol.FRAME_DATA_MAX_BYTES) {
              yield* Queue.take(credit)
              yield* send(Protocol.Kind.output, chunk.subarray(at, at + Protocol.FRAME_DATA_MAX_BYTES))
            }
          }),
        ),
        Effect.ignore,
      )
      const status = yield* Deferred.await(shell.exit)
      yield* send(Protocol.Kind.exit, Protocol.exitData(status)).pipe(Effect.ignore)
      yield* finish({ code: Protocol.CloseCode.normal, reason: "the shell exited", exitStatus: status })
    })

    // Every heartbeat: `alive` to the relay, and a look at whether the relay said anything since
    // the last one. A relay killed outright never says `close`; without this the shell would live
    // until the run ends.
    const heartbeat = Effect.gen(function* () {
      let seen = end.heard()
      let silent = 0
      for (;;) {
        yield* Effect.sleep(settings.heartbeatMs)
        yield* end.send(Protocol.encodeNote({ _tag: "alive" })).pipe(Effect.ignore)
        const now = end.heard()
        silent = now === seen ? silent + 1 : 0
        seen = now
        if (silent >= Protocol.SILENT_HEARTBEATS_MAX)
          return yield* finish({ code: Protocol.CloseCode.goingAway, reason: "the caller's relay is gone" })
      }
    })

    const fibers = [
      yield* Effect.fork(heartbeat),
      yield* Effect.fork(inbound.pipe(Effect.ignore)),
      yield* Effect.fork(notes.pipe(Effect.ignore)),
      yield* Effect.fork(overflow),
      yield* Effect.fork(outbound),
    ]
    const result = yield* Deferred.await(ending).pipe(
      Effect.onInterrupt(() =>
        Effect.ignore(
          end.send(
            Protocol.encodeNote({ _tag: "close", code: Protocol.CloseCode.normal, reason: "the run ended" }),
          ),
        ),
      ),
    )
    // The caller's relay closes the WebSocket with the same code and reason; then the shell goes
    // (its channel closed ends the output stream), and with it what still reads or writes (not
    // waited for: a read of the channel may only end with the machine).
    yield* end
      .send(Protocol.encodeNote({ _tag: "close", code: result.code, reason: result.reason }))
      .pipe(Effect.ignore)
    yield* shell.close
    yield* Effect.forEach(fibers, Fiber.interruptFork, { discard: true })
    yield* closed(
      result.exitStatus === undefined ? { reason: result.reason } : { exit_status: result.exitStatus },
    )
  }).pipe(
    Effect.catchAllCause((cause) =>
      Cause.isInterruptedOnly(cause)
        ? Effect.failCause(cause)
        : Effect.zipRight(
            Effect.logWarning("terminal session failed", Cause.pretty(cause)),
            closed({ reason: "failed" }),
          ),
    ),
    // Interrupted: the run's machine is ending (it closes its sessions before its last log line).
    Effect.onInterrupt(() => closed({ reason: "the run ended" })),
  )

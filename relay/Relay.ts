/**
 * The terminal relay: a uWebSockets.js WebSocket server at `/terminal` that joins a caller's
 * WebSocket to a route's host end over core NATS (`core/TerminalRoute.ts`). It holds no key and
 * no state beyond its open sockets, so any number of relays can run and any one serves any route.
 *
 *   upgrade   `?route=<route>&side=caller`: a route not made by a host end is 404, a route whose
 *             caller already came 409, another side 400; the host end is asked before the socket
 *             opens, so a refused caller gets the HTTP status.
 *   caller →  each binary message is a frame: over 32 KiB closes 1009, a kind the caller does not
 *             send or a sequence out of order closes 1008 (the host end checks what the relay
 *             cannot: that the frame opens). Passed on to the host end as it came.
 *   → caller  the host end's frames, sent on as they came; its `close` note closes the socket
 *             with the note's code and reason.
 *   credit    the relay tells the host end each time it has passed on 16 more frames while the
 *             socket is not backed up (and the rest when it drains), so the host end never gets
 *             more than its window ahead of the caller.
 *   close     a socket that closes tells the host end (`close 1001`), which ends the shell.
 *   alive     one timer for all the relay's sockets: every `heartbeatMs` each open socket's host
 *             end gets `alive`, and a socket whose host end sent nothing (frame or note) for three
 *             beats closes 1011 "the host end is gone" (a host agent killed outright says no
 *             `close`; uWS answers the caller's pings itself, so the caller would wait forever).
 *             The host end's own `alive` notes stop here.
 */

import uWS from "uWebSockets.js"
import { type Context, Effect, Layer, Runtime, Schedule, type Scope } from "effect"
import type { Nats } from "../core/Nats.ts"
import type { Storage } from "../core/Storage.ts"
import * as Protocol from "../core/Terminal.ts"
import * as Route from "../core/TerminalRoute.ts"
import { TerminalSettings } from "../core/TerminalSettings.ts"

const ROUTE = /^[A-Za-z0-9_-]{22}$/
const CREDIT_BATCH = 16
// A socket with more than this waiting to be sent stops granting credit until it drains.
const BACKED_UP_BYTES = 1024 * 1024

interface Socket {
  route: string
  /** The route's caller end, once the host end let the caller in. */
  end?: Route.CallerEnd
  /** The socket, once open; what the host end sent before that waits in `early`. */
  ws?: uWS.WebSocket<UserData>
  early: Array<Uint8Array>
  nextSequence: bigint
  /** Frames passed on to the caller since the host end last got credit for them. */
  owed: number
  /** Heartbeats since the host end last sent anything. */
  silent: number
  closed: boolean
}

// uWS copies a socket's user data into its own object: the state goes by reference inside it, so
// the upgrade's callbacks and the socket's handlers share one.
interface UserData {
  readonly state: Socket
}

/** Where the relay listens: `host:port` (port 0 picks a free one). */
const parseAddr = (addr: string) => {
  const m = /^(\[[^\]]+\]|[^:]+):(\d+)$/.exec(addr)
  if (!m) throw new Error(`HANGAR_RELAY_ADDR ${addr}: expected host:port`)
  return { host: (m[1] as string).replace(/^\[|\]$/g, ""), port: Number(m[2]) }
}

/** Starts the relay for the life of the scope; answers the port it listens on. */
export const make: Effect.Effect<
  number,
  Error,
  Nats | Storage | Scope.Scope | Context.Tag.Identifier<typeof TerminalSettings.Tag>
> = Effect.gen(function* () {
  const settings = yield* TerminalSettings.Tag
  const { host, port } = parseAddr(settings.relayAddr)
  const runtime = yield* Effect.runtime<Nats | Storage>()
  const runPromise = Runtime.runPromiseExit(runtime)
  const open = new Set<uWS.WebSocket<UserData>>()

  const closeSocket = (ws: uWS.WebSocket<UserData>, code: number, reason: string) => {
    const data = ws.getUserData().state
    if (data.closed) return
    data.closed = true
    try {
      ws.end(code, reason.slice(0, 120))
    } catch {
      // Already gone (uWS invalidates a socket once it has closed).
    }
  }
  const grant = (ws: uWS.WebSocket<UserData>, force: boolean) => {
    const data = ws.getUserData().state
    if (data.owed === 0 || (!force && data.owed < CREDIT_BATCH)) return
    if (ws.getBufferedAmount() > BACKED_UP_BYTES) return
    data.end?.send(Protocol.encodeNote({ _tag: "credit", frames: data.owed }))
    data.owed = 0
  }

  const app = uWS.App().ws<UserData>("/terminal", {
    // Twice a frame's limit, so a frame just over it is read and refused with 1009 and a reason
    // (uWS drops a connection past this without a close frame).
    maxPayloadLength: 2 * Protocol.FRAME_MAX_BYTES,
    maxBackpressure: 64 * 1024 * 1024,
    idleTimeout: 120,
    sendPingsAutomatically: true,
    upgrade: (res, req, context) => {
      const query = new URLSearchParams(req.getQuery() ?? "")
      const key = req.getHeader("sec-websocket-key")
      const protocol = req.getHeader("sec-websocket-protocol")
      const extensions = req.getHeader("sec-websocket-extensions")
      const route = query.get("route") ?? ""
      const refuse = (status: string, text: string): void => {
        res.cork(() => res.writeStatus(status).writeHeader("content-type", "text/plain").end(text))
      }
      if (query.get("side") !== "caller") return refuse("400 Bad Request", "side: must be caller")
      if (!ROUTE.test(route)) return refuse("404 Not Found", "route: no such route")
      let aborted = false
      res.onAborted(() => {
        aborted = true
      })
      const data: Socket = { route, early: [], nextSequence: 0n, owed: 0, silent: 0, closed: false }
      // What the host end sends, towards the caller; anything before the socket opens waits.
      const onMessage = (message: Uint8Array) => {
        data.silent = 0
        if (data.ws === undefined) return void data.early.push(message)
        deliver(data.ws, message)
      }
      void runPromise(Route.callerEnd(route, onMessage)).then((exit) => {
        if (exit._tag === "Failure") {
          if (aborted) return
          const why = exit.cause._tag === "Fail" ? exit.cause.error : "unavailable"
          return why === "taken"
            ? refuse("409 Conflict", "route: its caller has already joined")
            : why === "unknown"
              ? refuse("404 Not Found", "route: no such route")
              : refuse("503 Service Unavailable", "the relay cannot reach the host end")
        }
        data.end = exit.value
        if (aborted) {
          // The caller left before its socket opened: the host end hears it went away.
          exit.value.send(
            Protocol.encodeNote({
              _tag: "close",
              code: Protocol.CloseCode.goingAway,
              reason: "the caller left",
            }),
          )
          return exit.value.close()
        }
        res.cork(() => res.upgrade({ state: data }, key, protocol, extensions, context))
      })
    },
    open: (ws) => {
      open.add(ws)
      const data = ws.getUserData().state
      data.ws = ws
      for (const m of data.early.splice(0)) deliver(ws, m)
    },
    message: (ws, message, isBinary) => {
      const data = ws.getUserData().state
      if (data.closed) return
      const frame = new Uint8Array(message.slice(0))
      const head = Protocol.peek(frame)
      if (!isBinary) return refuseFrame(ws, Protocol.CloseCode.protocol, "frames are binary messages")
      if ("problem" in head) return refuseFrame(ws, head.code, head.problem)
      if (!Protocol.callerKinds.has(head.kind))
        return refuseFrame(ws, Protocol.CloseCode.protocol, `frame of unknown kind ${head.kind}`)
      if (head.sequence !== data.nextSequence)
        return refuseFrame(ws, Protocol.CloseCode.protocol, `frame ${head.sequence} out of sequence`)
      data.nextSequence++
      data.end?.send(frame)
    },
    drain: (ws) => grant(ws, true),
    close: (ws, code) => {
      open.delete(ws)
      const data = ws.getUserData().state
      const wasClosed = data.closed
      data.closed = true
      // The host end hears the caller went away (unless the host end closed it).
      if (!wasClosed)
        data.end?.send(
          Protocol.encodeNote({
            _tag: "close",
            code:
              code === Protocol.CloseCode.tooBig ? Protocol.CloseCode.tooBig : Protocol.CloseCode.goingAway,
            reason: code === Protocol.CloseCode.tooBig ? "frame over 32 KiB" : "the caller closed",
          }),
        )
      data.end?.close()
    },
  })

  const refuseFrame = (ws: uWS.WebSocket<UserData>, code: number, reason: string) => {
    ws.getUserData().state.end?.send(Protocol.encodeNote({ _tag: "close", code, reason }))
    closeSocket(ws, code, reason)
  }
  const deliver = (ws: uWS.WebSocket<UserData>, message: Uint8Array) => {
    const data = ws.getUserData().state
    if (data.closed) return
    const note = Protocol.decodeNote(message)
    if (note?._tag === "close") return closeSocket(ws, note.code, note.reason)
    if (note !== undefined) return
    // uWS sends a typed array's whole underlying buffer; a NATS message's data is a view into
    // the connection's read buffer, so it goes as a copy of its own bytes.
    ws.cork(() => ws.send(message.slice(), true))
    data.owed++
    grant(ws, false)
  }

  // One beat for every socket: 100 idle sessions cost one timer, not 100.
  const alive = Protocol.encodeNote({ _tag: "alive" })
  const beat = () => {
    for (const ws of open) {
      const data = ws.getUserData().state
      if (data.closed) continue
      // `silent` goes back to 0 on each message: past the limit, three whole beats were silent.
      if (++data.silent > Protocol.SILENT_HEARTBEATS_MAX)
        refuseFrame(ws, Protocol.CloseCode.internalError, "the host end is gone")
      else data.end?.send(alive)
    }
  }

  const listenSocket = yield* Effect.acquireRelease(
    Effect.async<uWS.us_listen_socket, Error>((resume) => {
      app.listen(host, port, (socket) =>
        resume(
          socket ? Effect.succeed(socket) : Effect.fail(new Error(`cannot listen on ${settings.relayAddr}`)),
        ),
      )
    }),
    (socket) =>
      Effect.sync(() => {
        for (const ws of [...open]) refuseFrame(ws, Protocol.CloseCode.goingAway, "the relay is stopping")
        uWS.us_listen_socket_close(socket)
        ;(app as unknown as { close: () => void }).close()
      }),
  )
  const bound = uWS.us_socket_local_port(listenSocket as unknown as uWS.us_socket)
  // Forked after the listen socket, so the scope stops it first; a beat that throws (the
  // connection closing under it) is logged, and the next one still comes.
  yield* Effect.sync(beat).pipe(
    Effect.catchAllDefect((defect) => Effect.logWarning("relay heartbeat failed", defect)),
    Effect.schedule(Schedule.spaced(settings.heartbeatMs)),
    Effect.forkScoped,
  )
  yield* Effect.logInfo("relay listening").pipe(Effect.annotateLogs({ role: "relay", port: bound }))
  return bound
})

/** The relay role as a layer. */
export const layer: Layer.Layer<never, Error, Nats | Storage> = Layer.scopedDiscard(make).pipe(
  Layer.provide(TerminalSettings.layerFromEnv),
)

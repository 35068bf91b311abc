/**
 * The NATS connection of a process, as a scoped service: connected when the layer is built,
 * drained (pending messages flushed, subscriptions finished) when its scope closes.
 *
 * At start, servers that refuse the process's credentials end it with an error that says so (and
 * names the settings, never their values). No server answering at all fails at once too, unless
 * `waitForServers` is set (the roles of `hangar serve`): then the process says so every 15 s and
 * tries every second until one answers, as a role started before its cluster must.
 *
 * Only the `core/` wrappers (`Kv`, `ObjectStore`, `Stream`, `Storage`) use the raw clients this
 * service exposes; everything else talks to those wrappers.
 */
import type { JetStreamClient, JetStreamManager } from "@nats-io/jetstream"
import { JetStreamApiError, jetstream, jetstreamManager } from "@nats-io/jetstream"
import type { NatsConnection } from "@nats-io/transport-node"
import {
  AuthorizationError,
  connect,
  credsAuthenticator,
  NoRespondersError,
  TimeoutError,
  tokenAuthenticator,
  UserAuthenticationExpiredError,
} from "@nats-io/transport-node"
import { Clock, Config, Context, Data, Duration, Effect, Layer, Option, Redacted, Schedule } from "effect"
import { defineSettings, env } from "./Config.ts"
import { make as makeRequests, type Requests } from "./Requests.ts"

/** Connection settings (`HANGAR_NATS_URL`, `HANGAR_NATS_NAME`, `HANGAR_NATS_CREDENTIALS`, `HANGAR_NATS_TOKEN`). */
export interface NatsSettingsShape {
  /** Server URLs, comma-separated for a cluster. */
  readonly servers: string
  /** Connection name shown by the server (monitoring, logs). */
  readonly name: string
  /** Contents of a `.creds` file (user JWT and nkey seed), when the server requires it. */
  readonly credentials: Redacted.Redacted<string> | undefined
  /** A plain auth token, when the server requires one. */
  readonly token: Redacted.Redacted<string> | undefined
  /** Wait at start until a server answers (a role), instead of failing at once (a command). */
  readonly waitForServers: boolean
}

const optionalRedacted = (name: string) =>
  Config.redacted(`HANGAR_${name}`).pipe(Config.option, Config.map(Option.getOrUndefined))

/** Settings of the NATS connection. */
export const NatsSettings = defineSettings(
  "hangar/NatsSettings",
  {
    servers: "nats://127.0.0.1:4222",
    name: "hangar",
    credentials: undefined,
    token: undefined,
    waitForServers: false,
  } as NatsSettingsShape,
  (d) => ({
    servers: env.string("NATS_URL", d.servers),
    name: env.string("NATS_NAME", d.name),
    credentials: optionalRedacted("NATS_CREDENTIALS"),
    token: optionalRedacted("NATS_TOKEN"),
    waitForServers: Config.succeed(d.waitForServers),
  }),
)

/** A NATS operation failed (server unreachable, timeout, API error); `operation` names what was tried. */
export class NatsError extends Data.TaggedError("NatsError")<{
  readonly operation: string
  readonly message: string
  readonly cause?: unknown
}> {}

/**
 * Whether `error` is NATS not taking a call: a `NatsError`, or an error of a store port caused by
 * one (`KeyStoreFailed` carries the key store's). What retry-until-taken loops retry.
 */
export const isNatsError = (error: unknown, depth = 0): boolean => {
  if (typeof error !== "object" || error === null) return false
  const e = error as { readonly _tag?: unknown; readonly cause?: unknown }
  return e._tag === "NatsError" || (depth < 3 && isNatsError(e.cause, depth + 1))
}

/**
 * When an operation of this process last timed out, found no responder or was told "not now" by
 * JetStream (a 503): evidence that the store is in trouble, for `settled`. One clock per process
 * (a process has one connection; tests with several share it, which only widens their window).
 */
let lastStoreTrouble = 0
const isStoreTrouble = (cause: unknown, depth = 0): boolean =>
  cause instanceof TimeoutError ||
  cause instanceof NoRespondersError ||
  (cause instanceof JetStreamApiError && cause.status === 503) ||
  // The client wraps some errors (a request's cause): a few levels, so a cycle cannot loop.
  (depth < 3 && cause instanceof Error && cause.cause !== undefined && isStoreTrouble(cause.cause, depth + 1))

const natsError = (operation: string) => (cause: unknown) => {
  if (isStoreTrouble(cause)) lastStoreTrouble = Date.now()
  return new NatsError({ operation, message: cause instanceof Error ? cause.message : String(cause), cause })
}

/** Runs one client promise, mapping a rejection to `NatsError`. For the `core/` wrappers. */
export const attempt = <A>(operation: string, f: () => Promise<A>): Effect.Effect<A, NatsError> =>
  Effect.tryPromise({ try: f, catch: natsError(operation) })

/**
 * Runs one synchronous client call (a core publish), mapping a throw to `NatsError`. No async
 * boundary: publishes made in one go leave in one socket write.
 */
export const attemptSync = <A>(operation: string, f: () => A): Effect.Effect<A, NatsError> =>
  Effect.try({ try: f, catch: natsError(operation) })

/** The raw clients; only `core/` wrappers use them. */
export interface NatsClients {
  readonly connection: NatsConnection
  readonly js: JetStreamClient
  readonly jsm: JetStreamManager
  /** Request-reply through the connection's shared inbox (JetStream publishes, asks). */
  readonly requests: Requests
  /**
   * Whether the connection is up: false from a disconnect until the client has reconnected (it
   * retries forever), and once closed. What the gateway answers `503` on instead of waiting for
   * each request's own timeout.
   */
  readonly reachable: () => boolean
  /**
   * How many times the connection has gone away or come back: core subscriptions miss what is
   * published while it is away, so what one brought is trusted only while this stays the same.
   */
  readonly changes: () => number
  /**
   * Calls `listener` each time the connection has come back after it went away (its core
   * subscriptions are made again then, and missed what was published meanwhile); answers a
   * function that stops calling it.
   */
  readonly onReconnect: (listener: () => void) => () => void
  /**
   * Whether the store has been well for a while: reachable and answering, with no disconnect and no
   * unanswered request in the last 10 s. A request that failed otherwise failed for its own reasons;
   * one that failed in such a window most likely failed for the store's.
   */
  readonly settled: () => boolean
}

/** The process's NATS connection. */
export class Nats extends Context.Tag("hangar/Nats")<Nats, NatsClients>() {}

// Draining waits on a real server, so its timeout runs on the real clock even under TestClock.
const liveClock = Clock.make()

/** How long after a disconnect or an unanswered request the store counts as unsettled. */
const SETTLE_MS = 10_000

/** How often the client pings its server. */
export const PING_INTERVAL_MS = 10_000

/** The server list as it may be shown: any `user:password@` in a URL left out. */
export const shownServers = (servers: string): string => servers.replace(/\/\/[^/@]*@/g, "//")

/** How often a role waiting for its servers says so. */
const WAIT_NOTICE_MS = 15_000

/**
 * The first connection: refused credentials fail at once with the reason; unreachable servers
 * fail at once, or with `waitForServers` are tried every second, said every 15 s.
 */
const firstConnect = <A>(settings: NatsSettingsShape, open: () => Promise<A>) => {
  const servers = shownServers(settings.servers)
  const refused = (e: NatsError) =>
    e.cause instanceof AuthorizationError || e.cause instanceof UserAuthenticationExpiredError
  let noticed = 0
  const once = attempt("connect", open).pipe(
    Effect.mapError((e) =>
      refused(e)
        ? new NatsError({
            operation: "connect",
            message: `the NATS servers ${servers} refused this process's credentials (${e.message}); check HANGAR_NATS_CREDENTIALS and HANGAR_NATS_TOKEN`,
            cause: e.cause,
          })
        : new NatsError({
            operation: "connect",
            message: `no NATS server answers at ${servers} (${e.message})`,
            cause: e.cause,
          }),
    ),
  )
  if (!settings.waitForServers) return once
  return once.pipe(
    Effect.tapError((e) =>
      refused(e) || Date.now() - noticed < WAIT_NOTICE_MS
        ? Effect.void
        : Effect.zipRight(
            Effect.sync(() => {
              noticed = Date.now()
            }),
            Effect.logWarning(`${e.message}; waiting for one, trying every second`),
          ),
    ),
    Effect.retry({ while: (e) => !refused(e), schedule: Schedule.spaced("1 second") }),
    Effect.withClock(liveClock),
  )
}

/** Connects (retrying reconnects forever once connected) and drains on scope close. */
export const make = Effect.gen(function* () {
  const settings = yield* NatsSettings.Tag
  const authenticator = [
    settings.credentials &&
      credsAuthenticator(new TextEncoder().encode(Redacted.value(settings.credentials))),
    settings.token && tokenAuthenticator(Redacted.value(settings.token)),
  ].filter((a) => a !== undefined)
  const connection = yield* Effect.acquireRelease(
    firstConnect(settings, () =>
      connect({
        servers: settings.servers.split(",").map((s) => s.trim()),
        name: settings.name,
        maxReconnectAttempts: -1,
        // A server that stops answering (frozen, cut off) counts as gone after two unanswered pings,
        // 20–30 s, not the client's default 4–6 minutes (`reachable`, the gateway's 503).
        pingInterval: PING_INTERVAL_MS,
        maxPingOut: 2,
        // nats.js otherwise builds an Error with a stack trace for every request, only to give a
        // failure a nicer trace: about a tenth of an actor worker's CPU, plus the garbage. Our
        // failures are `NatsError`s named by operation (`attempt`), which is what logs show.
        noAsyncTraces: true,
        ...(authenticator.length > 0 ? { authenticator } : {}),
      }),
    ),
    (nc) =>
      attempt("drain", () => nc.drain()).pipe(
        Effect.timeout(Duration.seconds(10)),
        Effect.withClock(liveClock),
        Effect.catchAll(() => attempt("close", () => nc.close())),
        Effect.ignore,
      ),
  )
  // Followed from the start: a disconnect (the socket closed, or two pings unanswered) until the
  // client has reconnected.
  let up = true
  let lastTrouble = 0
  let changes = 0
  const reconnected = new Set<() => void>()
  void (async () => {
    for await (const s of connection.status()) {
      if (s.type === "disconnect" || s.type === "close") {
        up = false
        lastTrouble = Date.now()
        changes++
      } else if (s.type === "reconnect") {
        up = true
        lastTrouble = Date.now()
        changes++
        // One listener's throw neither stops the others nor this loop.
        for (const listener of [...reconnected])
          try {
            listener()
          } catch {}
      }
    }
  })().catch(() => undefined)
  void connection.closed().then(() => {
    up = false
    changes++
  })
  // No account-info round trip either when a store is opened (nats.js asks for it at every
  // `Objm.open`, and the server sums every stream's usage to answer): the streams were made or
  // checked by `Storage.layer`.
  const js = jetstream(connection, { checkAPI: false })
  // No account-info round trip here: a cluster without a quorum does not answer it, and the role
  // should wait for one (`Storage.layer` says so and retries), not fail at connect.
  const jsm = yield* attempt("jetstreamManager", () => jetstreamManager(connection, { checkAPI: false }))
  // Released before the drain above: waiting requests fail at once instead of at their deadline.
  const requests = yield* Effect.acquireRelease(
    Effect.sync(() => makeRequests(connection)),
    (r) => Effect.sync(() => r.close()),
  )
  const settled = () =>
    up &&
    requests.responsive() &&
    Date.now() - Math.max(lastTrouble, requests.lastTimeout(), lastStoreTrouble) > SETTLE_MS
  return {
    connection,
    js,
    jsm,
    requests,
    reachable: () => up,
    changes: () => changes,
    onReconnect: (listener) => {
      reconnected.add(listener)
      return () => reconnected.delete(listener)
    },
    settled,
  } satisfies NatsClients
})

/** The connection as a layer, configured by `NatsSettings`. */
export const layer: Layer.Layer<Nats, NatsError, typeof NatsSettings.Tag.Identifier> = Layer.scoped(
  Nats,
  make,
)

/** The connection to `servers` (tests, embedded mode), other settings at their defaults. */
export const layerUrl = (servers: string, name = "hangar"): Layer.Layer<Nats, NatsError> =>
  layer.pipe(Layer.provide(NatsSettings.layer({ servers, name })))

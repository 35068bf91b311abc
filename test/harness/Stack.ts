/**
 * The whole service in the test process, for end-to-end tests through HTTP: one real nats-server,
 * storage under a unique prefix, and the four roles exactly as `npm start` composes them
 * (`deploy/Local.ts` `roles`: gateway with every route, actor worker, host agent; relay left out),
 * each built from its own `layer` in its own scope with its own NATS connection, so a test can
 * stop and restart the gateway alone or kill the actor worker and start another.
 *
 * Decisions:
 *
 * - Settings reach the roles the way they reach a deployed process: as `HANGAR_*` variables. The
 *   roles read them with effect's `Config`, so the stack builds each role under its own
 *   `ConfigProvider` (these variables first, then the real environment) instead of touching
 *   `process.env`; several stacks can live in one process. Every file the roles would keep in the
 *   data folder (issuer, master and link keys) goes to the stack's temporary folder.
 * - The gateway listens on a port picked once, so a restarted gateway answers on the same URL
 *   (and the links it signed stay valid).
 * - "Killing" the actor worker closes its NATS connection at once (no drain, no lease release,
 *   nothing acknowledged), then closes its scope; its partitions move when the leases expire, as
 *   they would after `kill -9`. The stack uses short actor leases for that reason.
 * - The host agent gets a unique host id and a small budget (2 vCPUs by default: room for two size
 *   `s` runs), and the slim test base (`ensureTestBase`).
 * - Test helpers (accounts with credit, owner tokens, admin keys, functions, uploads, runs,
 *   commands) go through the same paths as the operator commands and the HTTP API; nothing is
 *   written around them.
 */

import { type ChildProcess, spawn } from "node:child_process"
import { createHash, randomBytes } from "node:crypto"
import { appendFileSync } from "node:fs"
import { mkdir, mkdtemp, rm } from "node:fs/promises"
import http from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { gzipSync } from "node:zlib"
import {
  ConfigProvider,
  Context,
  Duration,
  Effect,
  Exit,
  Layer,
  Logger,
  LogLevel,
  Option,
  Scope,
} from "effect"
import * as Actors from "../../actors/main.ts"
import * as Accounts from "../../core/Accounts.ts"
import * as AccountClient from "../../core/actors/AccountClient.ts"
import * as Connected from "../../core/Connected.ts"
import * as Kv from "../../core/Kv.ts"
import * as Log from "../../core/Log.ts"
import * as Nats from "../../core/Nats.ts"
import { type Storage, Storage as StorageTag } from "../../core/Storage.ts"
import { root } from "../../deploy/tools.mjs"
import { personToken } from "../../gateway/auth/testing.ts"
import * as Gateway from "../../gateway/main.ts"
import { type Base, ensureTestBase } from "../../host-agent/bases/Bases.ts"
import { ownedIn } from "../../host-agent/machines/MachineDriver.ts"
import * as NamespaceDriver from "../../host-agent/machines/namespace/NamespaceDriver.ts"
import { leftovers } from "../../host-agent/machines/namespace/testing.ts"
import * as HostAgent from "../../host-agent/main.ts"
import { derivedId } from "../../host-agent/registry/HostSettings.ts"
import * as Relay from "../../relay/main.ts"
import type { BaseInfo } from "../../schema/Base.ts"
import { HostRecord } from "../../schema/Host.ts"
import { type AddressPool, claimAddressPool } from "./AddressPools.ts"
import { startNatsServer } from "./NatsServer.ts"
import { uniquePrefix } from "./names.ts"
import { freePort } from "./Ports.ts"

// biome-ignore lint/suspicious/noExplicitAny: response bodies are inspected loosely
export type Json = any

/** Short settings for the parts of issue 7; each becomes its `HANGAR_*` variable (see `settingNames`). */
export interface StackOptions {
  /** vCPUs the host agent may give machines (`HANGAR_HOST_VCPUS`); default 2 (two size `s` runs). */
  readonly hostVcpus?: number
  /** Memory the host agent may give machines (`HANGAR_HOST_MEMORY_MIB`); default 8192. */
  readonly hostMemoryMib?: number
  /** Start no host agent (runs stay queued). */
  readonly noHost?: boolean
  /** The length of a billed minute (and of `timeout_minutes` minutes). */
  readonly minuteMs?: number
  /** How long a run may stay queued before it fails `infrastructure`. */
  readonly queueTimeoutMs?: number
  /** The scheduler's tick. */
  readonly tickMs?: number
  /** How often a running run's log part is written. */
  readonly logFlushMs?: number
  /** Webhook attempt delays (first is normally 0). */
  readonly webhookDelaysMs?: ReadonlyArray<number>
  /** Allow webhook deliveries to private/loopback addresses (never set in production). */
  readonly webhookAllowPrivate?: boolean
  /** A PEM file of extra CAs the webhook sender trusts (a self-signed test receiver). */
  readonly webhookCaFile?: string
  /** Any other `HANGAR_*` variable, by name without the prefix. */
  readonly settings?: Readonly<Record<string, string | number | boolean>>
  /**
   * Every role in its own process through the real entry point (`hangar serve <role>`), as they are
   * deployed; their log lines still reach `lines`. Stopping a role is SIGTERM, killing it SIGKILL.
   */
  readonly processes?: boolean
  /** Runs the terminal relay too (`HANGAR_RELAY_ADDR` on a free port; `Stack.relayUrl`). */
  readonly relay?: boolean
  /**
   * The in-process roles share one connection, as `npm start` runs them (`deploy/Local.ts`);
   * otherwise each has its own, so a killed role's connection can be cut alone (`killActors`
   * refuses on a shared one). Not with `processes`.
   */
  readonly sharedConnection?: boolean
  /** nats-server fsyncs every write (as deployed) so a SIGKILLed server loses nothing it acknowledged. */
  readonly natsSyncAlways?: boolean
  /**
   * Use these NATS servers (comma-separated: a cluster of `test/harness/NatsCluster.ts`) instead of
   * starting one; the caller stops them. `killNats`, `restartNats` and `natsPid` are then the
   * cluster's business and refuse.
   */
  readonly natsUrl?: string
  /**
   * Warm machines the host agent keeps per base (`HANGAR_WARM_MACHINES`); default 0, so a test
   * makes the machines it asks for and no more. Those it makes are checked for leftovers at `close`.
   */
  readonly warmMachines?: number
}

/** One more instance of a role started by `Stack.startExtra` (its own process). */
export interface ExtraRole {
  readonly role: Role
  readonly pid: number
  /** SIGTERM (SIGKILL after 30 s). */
  readonly stop: () => Promise<void>
  /** SIGKILL, as a crash would. */
  readonly kill: () => Promise<void>
}

/**
 * The variable of each named option. The parts of issue 7 declare these settings
 * (`defineSettings` in their own files); when one is renamed there, only this table changes.
 */
export const settingNames = {
  minuteMs: "RUN_MINUTE_MS",
  queueTimeoutMs: "RUN_QUEUE_TIMEOUT_MS",
  tickMs: "SCHEDULER_TICK_MS",
  logFlushMs: "RUN_LOG_FLUSH_MS",
  webhookDelaysMs: "WEBHOOK_ATTEMPT_DELAYS_MS",
  webhookAllowPrivate: "WEBHOOK_ALLOW_PRIVATE",
  webhookCaFile: "WEBHOOK_CA_FILE",
} as const

/** A role the stack runs. */
export type Role = "gateway" | "actors" | "host" | "relay"

/** One log line of the stack, with the role that wrote it. */
export interface StackLine {
  readonly role: Role | "client"
  readonly line: string
}

/** Headers for calling the API as someone. */
export type Headers = Record<string, string>

/** An account made for a test: its owner (a person token) and an admin key. */
export interface TestAccount {
  readonly id: string
  readonly ownerEmail: string
  /** The owner's headers (token + `service-account`). */
  readonly owner: Headers
  /** An admin key of the account. */
  readonly admin: Headers
}

/** The running stack. */
export interface Stack {
  /** The gateway's base URL (the same across gateway restarts). */
  readonly url: string
  /** Where callers reach the stack's relay (`ws://…/terminal`; it runs only with `relay`). */
  readonly relayUrl: string
  readonly natsUrl: string
  /** The nats-server's process id (to stop and continue it, as a frozen server would be). */
  readonly natsPid: number
  /** Ends nats-server outright (SIGKILL); the roles keep trying to reconnect. */
  readonly killNats: () => Promise<void>
  /** Starts nats-server again on its store, port and key; the roles reconnect to it. */
  readonly restartNats: () => Promise<void>
  /** The nats-server's store (every stream, KV bucket and object store, encrypted at rest). */
  readonly natsStoreDir: string
  readonly prefix: string
  readonly dir: string
  readonly hostId: string
  readonly base: Base
  /** The `HANGAR_*` variables every role was built with. */
  readonly env: Readonly<Record<string, string>>
  /** Whether each role runs in its own process (`StackOptions.processes`). */
  readonly processes: boolean
  /** Every log line of every role so far. */
  readonly lines: Array<StackLine>
  /** Runs an effect with the stack's client services: NATS, storage, the account store, a mailbox. */
  readonly run: <A, E>(fx: Effect.Effect<A, E, StackClient>) => Promise<A>
  readonly stopGateway: () => Promise<void>
  /** Stops the gateway the way `kill -9` would. */
  readonly killGateway: () => Promise<void>
  readonly startGateway: () => Promise<void>
  /** Stops the worker the way `kill -9` would (no drain, leases left to expire). */
  readonly killActors: () => Promise<void>
  /** Stops the worker gracefully. */
  readonly stopActors: () => Promise<void>
  readonly startActors: () => Promise<void>
  readonly stopHost: () => Promise<void>
  /** Stops the host agent the way `kill -9` would: its machines are left behind. */
  readonly killHost: () => Promise<void>
  readonly startHost: () => Promise<void>
  /** Which roles are running now. */
  readonly running: () => ReadonlyArray<Role>
  /**
   * Starts one more instance of `role` as its own process (`processes` only), with these
   * `HANGAR_*` variables (by name without the prefix) over the stack's: a second gateway
   * (`HTTP_ADDR`), a second worker, another host (`HOST_ID`). Stopped at `close`.
   */
  readonly startExtra: (role: Role, settings?: Readonly<Record<string, string>>) => Promise<ExtraRole>
  /** Runs the stack started (their machines are checked for leftovers at `close`). */
  readonly runs: Set<string>
  /**
   * Stops every role and the server and removes the temporary folder; answers what the stack's
   * machines left behind on the host (should be empty).
   */
  readonly close: () => Promise<ReadonlyArray<string>>
}

/** What `stack.run` provides. */
export type StackClient =
  | Nats.Nats
  | Storage
  | Accounts.Accounts
  | Layer.Layer.Success<typeof AccountClient.mailboxLayer>

/** A role built in this process. */
interface InProcess {
  readonly _tag: "InProcess"
  readonly scope: Scope.CloseableScope
  readonly context: Context.Context<never>
}

/** A running role: built in this process, or a child process (`processes`). */
type Piece = InProcess | { readonly _tag: "Child"; readonly child: ChildProcess }

/** What `hangar serve` calls each role, and the line it logs once it is up. */
const served: Record<Role, { readonly name: string; readonly ready: string }> = {
  actors: { name: "actors", ready: "actor worker ready" },
  host: { name: "host-agent", ready: "host actor consuming" },
  gateway: { name: "gateway", ready: "gateway listening" },
  relay: { name: "relay", ready: "relay listening" },
}

/** Ends a child role: `signal`, then SIGKILL if it has not exited within 30 s. */
const endChild = (child: ChildProcess, signal: NodeJS.Signals) =>
  new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve()
    const force = setTimeout(() => child.kill("SIGKILL"), 30_000)
    child.once("exit", () => {
      clearTimeout(force)
      resolve()
    })
    child.kill(signal)
  })

/**
 * Closes a role's scope, giving up after 90 s and saying on stderr which one did not close
 * (`what`); the test then reports what it left behind. On a loaded machine a host agent removing
 * its machines took over 30 s, and a close cut short there reported a half-removed machine folder
 * as a leak.
 */
const closeScope = (scope: Scope.CloseableScope, what = "a scope") =>
  Effect.runPromise(
    Scope.close(scope, Exit.void).pipe(
      Effect.timeout(Duration.seconds(90)),
      Effect.tapError(() =>
        Effect.sync(() => console.error(`stack: ${what} did not close within 90 s; going on without it`)),
      ),
      Effect.ignore,
    ),
  )

/** NATS the stack did not start (`StackOptions.natsUrl`): the stack neither kills nor stops it. */
const outsideNats = (url: string) => {
  const refuse = () =>
    Promise.reject(new Error("the stack runs on outside NATS servers: use their own handles"))
  return {
    url,
    storeDir: "",
    get pid(): number {
      throw new Error("the stack runs on outside NATS servers: use their own handles")
    },
    kill: refuse,
    restart: refuse,
    stop: () => Promise.resolve(),
  }
}

/** The stack's last warnings and errors, one per line with its role: a failing assertion's message. */
export const problems = (stack: Stack, count = 40): string =>
  stack.lines
    .filter((l) => /"level":"(warn|warning|error|fatal)"/i.test(l.line))
    .map((l) => `${l.role} ${l.line}`)
    .slice(-count)
    .join("\n")

/** Closes `stack` (if it started) and expects that its machines left nothing behind: an `afterAll`. */
export const closeStack = async (stack: Stack | undefined): Promise<void> => {
  if (stack === undefined) return
  const left = await stack.close()
  // With the stack's last warnings and errors: a machine is left when its end hung or failed.
  if (left.length > 0) throw new Error(`machines left behind: ${left.join(", ")}\n${problems(stack)}`)
}

/** Starts the whole stack (nats-server first, then actors, host agent and gateway). */
export const startStack = async (options: StackOptions = {}): Promise<Stack> => {
  const base = await ensureTestBase()
  const nats =
    options.natsUrl === undefined
      ? await startNatsServer({ syncAlways: options.natsSyncAlways ?? false })
      : outsideNats(options.natsUrl)
  const dir = await mkdtemp(join(tmpdir(), "hangar-stack-"))
  const prefix = uniquePrefix()
  const port = await freePort()
  const relayPort = await freePort()
  const hostId = derivedId(randomBytes(16).toString("hex"), dir)
  const env: Record<string, string> = {
    NATS_URL: nats.url,
    STORAGE_PREFIX: prefix,
    HTTP_ADDR: `127.0.0.1:${port}`,
    PUBLIC_URL: `http://127.0.0.1:${port}`,
    // The web console is this gateway (CLI login approval links, console sign-in links).
    CONSOLE_URL: `http://127.0.0.1:${port}`,
    RELAY_ADDR: `127.0.0.1:${relayPort}`,
    RATE_LIMIT_PER_SECOND: "1000000",
    RATE_LIMIT_BURST: "1000000",
    OIDC_KEY_FILE: join(dir, "issuer.key"),
    MASTER_KEY_FILE: join(dir, "master.key"),
    UPLOAD_LINK_KEY_FILE: join(dir, "upload-link.key"),
    // Quick lease expiry so a killed worker's partitions move within seconds.
    ACTOR_LEASE_MS: "1500",
    ACTOR_RENEW_MS: "300",
    ACTOR_RETRY_BASE_MS: "50",
    ACTOR_RETRY_MAX_MS: "500",
    ACTOR_ACK_WAIT_MS: "5000",
    HOST_ID: hostId,
    HOST_VCPUS: String(options.hostVcpus ?? 2),
    HOST_MEMORY_MIB: String(options.hostMemoryMib ?? 8192),
    HOST_HEARTBEAT_MS: "1000",
    // The host offers the slim test base it is given (`base`), also outside vitest (the benches).
    BASES: "debian-bookworm-slim",
    // Machines reach no real network (a deployed host agent's default is the default route).
    MACHINE_UPLINKS: "none",
    MACHINE_MASQUERADE: "false",
    // Many 16 GiB machines on a small CI disk (see testDriverSettings).
    MACHINE_DISK_OVERCOMMIT: "16",
    WARM_MACHINES: String(options.warmMachines ?? 0),
  }
  for (const [name, variable] of Object.entries(settingNames)) {
    const value = options[name as keyof typeof settingNames]
    if (value !== undefined) env[variable] = Array.isArray(value) ? value.join(",") : String(value)
  }
  for (const [name, value] of Object.entries(options.settings ?? {})) env[name] = String(value)

  const provider = ConfigProvider.fromMap(
    new Map(Object.entries(env).map(([k, v]) => [`HANGAR_${k}`, v])),
  ).pipe(ConfigProvider.orElse(() => ConfigProvider.fromEnv()))
  const lines: Array<StackLine> = []
  // `HANGAR_TEST_STACK_LOG=<file>`: every line also goes to that file as it is written (debugging).
  const logFile = process.env.HANGAR_TEST_STACK_LOG || undefined
  const loggerOf = (role: StackLine["role"]) =>
    Layer.merge(
      Logger.replace(
        Logger.defaultLogger,
        Log.jsonLogger((line) => {
          lines.push({ role, line })
          if (logFile !== undefined) appendFileSync(logFile, `${role} ${line}\n`)
        }),
      ),
      Logger.minimumLogLevel(LogLevel.Info),
    )

  // `processes`: the role runs as `hangar serve <role>` with the stack's variables; it is up once it
  // logs its ready line (each of its lines goes to `lines` too).
  const spawnRole = (role: Role, extraEnv: Readonly<Record<string, string>> = {}): Promise<Piece> =>
    new Promise((resolve, reject) => {
      const child = spawn(
        process.execPath,
        ["--import", "tsx", join(root, "cli", "main.ts"), "serve", served[role].name],
        {
          cwd: root,
          env: {
            ...process.env,
            ...Object.fromEntries(
              Object.entries({ ...env, ...extraEnv }).map(([k, v]) => [`HANGAR_${k}`, v]),
            ),
          },
          stdio: ["ignore", "ignore", "pipe"],
        },
      )
      let up = false
      let partial = ""
      child.stderr?.setEncoding("utf8").on("data", (chunk: string) => {
        const text = partial + chunk
        const complete = text.split("\n")
        partial = complete.pop() ?? ""
        for (const line of complete) {
          if (line === "") continue
          lines.push({ role, line })
          if (logFile !== undefined) appendFileSync(logFile, `${role} ${line}\n`)
          if (!up && line.includes(`"msg":"${served[role].ready}"`)) {
            up = true
            resolve({ _tag: "Child", child })
          }
        }
      })
      child.once("exit", (code, signal) => {
        if (!up) reject(new Error(`${role} exited before it was up (${code ?? signal})`))
      })
    })

  const build = async <A>(
    role: StackLine["role"],
    layer: Layer.Layer<A, unknown, never>,
  ): Promise<InProcess> => {
    const scope = Effect.runSync(Scope.make())
    const exit = await Effect.runPromiseExit(
      Layer.buildWithScope(layer, scope).pipe(
        Effect.withConfigProvider(provider),
        Effect.provide(loggerOf(role)),
      ),
    )
    if (Exit.isFailure(exit)) {
      await closeScope(scope, `the ${role} role that did not start`)
      throw new Error(`${role} did not start: ${String(exit.cause)}`)
    }
    return { _tag: "InProcess" as const, scope, context: exit.value as Context.Context<never> }
  }
  if (options.sharedConnection === true && options.processes === true)
    throw new Error("sharedConnection is for roles in this process")
  const shared =
    options.sharedConnection === true
      ? await build("client", Connected.layerUrl(nats.url) as Layer.Layer<unknown, unknown, never>)
      : undefined
  const onNats = <A, E>(layer: Layer.Layer<A, E, Nats.Nats | Storage>) =>
    (shared === undefined
      ? layer.pipe(Layer.provideMerge(Connected.layerUrl(nats.url)))
      : layer.pipe(
          Layer.provideMerge(Layer.succeedContext(shared.context as Context.Context<Nats.Nats | Storage>)),
        )) as Layer.Layer<unknown, unknown, never>

  const roleLayers: Record<Role, Layer.Layer<unknown, unknown, never>> = {
    actors: onNats(Actors.layer),
    host: onNats(HostAgent.layer),
    gateway: onNats(Gateway.layer),
    relay: onNats(Relay.layer),
  }
  const pieces = new Map<Role, Piece>()
  const start = async (role: Role) => {
    if (pieces.has(role)) return
    pieces.set(role, options.processes ? await spawnRole(role) : await build(role, roleLayers[role]))
  }
  const stop = async (role: Role) => {
    const piece = pieces.get(role)
    if (piece === undefined) return
    pieces.delete(role)
    if (piece._tag === "Child") return endChild(piece.child, "SIGTERM")
    await closeScope(piece.scope, `the ${role} role`)
  }
  const kill = async (role: Role) => {
    const piece = pieces.get(role)
    if (piece === undefined) return
    if (piece._tag === "InProcess" && shared !== undefined)
      throw new Error("a role on the shared connection cannot be killed alone")
    pieces.delete(role)
    if (piece._tag === "Child") return endChild(piece.child, "SIGKILL")
    const { connection } = Context.get(piece.context as Context.Context<Nats.Nats>, Nats.Nats)
    await connection.close().catch(() => {})
    await closeScope(piece.scope, `the killed ${role} role`)
  }

  const clientLayer = Layer.mergeAll(Accounts.layer, AccountClient.mailboxLayer).pipe(
    Layer.provideMerge(Connected.layerUrl(nats.url)),
  ) as Layer.Layer<StackClient, unknown, never>
  const client = await build("client", clientLayer)
  const runs = new Set<string>()

  const extras = new Set<ChildProcess>()
  // Each extra host agent's own machines folder, run folder and address pool, as another host
  // would have, by host id (one restarted with its id finds what its earlier life left).
  const places = new Map<string, { machinesDir: string; runDir: string; pool: AddressPool }>()
  const placeOf = async (hostId: string) => {
    const known = places.get(hostId)
    if (known !== undefined) return known
    // Searchable by all, as the default folder is: a machine's root reaches its mounts through it.
    const machinesDir = join("/var/lib/hangar/test-hosts", `${prefix}-${places.size + 1}`)
    await mkdir(machinesDir, { recursive: true, mode: 0o755 })
    const place = {
      machinesDir,
      runDir: `/run/hangar-test-hosts/${prefix}-${places.size + 1}`,
      pool: await claimAddressPool(),
    }
    places.set(hostId, place)
    return place
  }
  const startExtra = async (role: Role, settings: Readonly<Record<string, string>> = {}) => {
    if (options.processes !== true) throw new Error("startExtra needs processes: true")
    const place =
      role === "host" ? await placeOf(settings.HOST_ID ?? randomBytes(8).toString("hex")) : undefined
    const piece = await spawnRole(
      role,
      place === undefined
        ? settings
        : {
            MACHINES_DIR: place.machinesDir,
            RUN_DIR: place.runDir,
            MACHINE_ADDRESS_POOL: place.pool.address,
            ...settings,
          },
    )
    if (piece._tag !== "Child") throw new Error("unreachable")
    const child = piece.child
    extras.add(child)
    const end = (signal: NodeJS.Signals) => async () => {
      await endChild(child, signal)
      extras.delete(child)
    }
    return { role, pid: child.pid ?? -1, stop: end("SIGTERM"), kill: end("SIGKILL") }
  }

  const closeAll = async () => {
    await Promise.all([...extras].map((c) => endChild(c, "SIGTERM")))
    for (const role of ["gateway", "relay", "host", "actors"] as const) await stop(role)
    await closeScope(client.scope, "the test client")
    if (shared !== undefined) await closeScope(shared.scope, "the shared connection")
    await nats.stop()
    await rm(dir, { recursive: true, force: true })
  }

  try {
    await start("actors")
    if (!options.noHost) await start("host")
    if (options.relay === true) await start("relay")
    await start("gateway")
  } catch (e) {
    await closeAll()
    throw e
  }

  return {
    url: `http://127.0.0.1:${port}`,
    relayUrl: `ws://127.0.0.1:${relayPort}/terminal`,
    natsUrl: nats.url,
    get natsPid() {
      return nats.pid
    },
    killNats: nats.kill,
    restartNats: nats.restart,
    natsStoreDir: nats.storeDir,
    prefix,
    dir,
    hostId,
    base,
    env,
    processes: options.processes === true,
    lines,
    run: (fx) =>
      Effect.runPromise(
        fx.pipe(
          Effect.provide(client.context as Context.Context<StackClient>),
          Effect.withConfigProvider(provider),
          Effect.provide(loggerOf("client")),
        ) as Effect.Effect<never>,
      ),
    stopGateway: () => stop("gateway"),
    killGateway: () => kill("gateway"),
    startGateway: () => start("gateway"),
    killActors: () => kill("actors"),
    stopActors: () => stop("actors"),
    startActors: () => start("actors"),
    stopHost: () => stop("host"),
    killHost: () => kill("host"),
    startHost: () => start("host"),
    running: () => [...pieces.keys()],
    startExtra,
    runs,
    close: async () => {
      await closeAll()
      // What the host agent left is reported, then removed anyway so a failing test leaks nothing.
      const found: Array<string> = []
      const driver = NamespaceDriver.make(NamespaceDriver.NamespaceDriverSettings.defaults)
      // Every run's machine, and every warm machine a host agent made (it logs each by id), on
      // every host agent's folders.
      const warm = new Set(
        lines.flatMap((l) => [...l.line.matchAll(/"machine":"(warm_[0-9a-f]+)"/g)].map((m) => m[1]!)),
      )
      const hosts = [
        { id: hostId, settings: NamespaceDriver.NamespaceDriverSettings.defaults, driver },
        ...[...places.entries()].map(([id, p]) => {
          const settings = {
            ...NamespaceDriver.NamespaceDriverSettings.defaults,
            machinesDir: p.machinesDir,
            runDir: p.runDir,
            addressPool: p.pool.address,
          }
          return { id, settings, driver: NamespaceDriver.make(settings) }
        }),
      ]
      // And whatever else a host agent of the stack still owns (a machine it was making, say).
      const owned = await Promise.all(
        hosts.map((h) => Effect.runPromise(ownedIn(h.settings.machinesDir, h.id))),
      )
      for (const id of new Set([...[...runs].map(machineIdOf), ...warm, ...owned.flat()]))
        for (const host of hosts) {
          const left = await leftovers(id, host.settings)
          if (left.length === 0) continue
          found.push(...left)
          await Effect.runPromise(Effect.ignore(host.driver.destroy(id)))
        }
      for (const p of places.values()) {
        await rm(p.machinesDir, { recursive: true, force: true })
        await rm(p.runDir, { recursive: true, force: true })
        await p.pool.release()
      }
      return found
    },
  }
}

/** The machine id the host agent gives a run's machine: the run id (`host-agent/runs/RunMachine.ts`). */
export const machineIdOf = (run: string): string => run

/**
 * What `run`'s machine left on this host, once nothing is left or after 30 s: the machine is
 * removed just after its run ends (its log's last part first).
 */
export const leftoversOnceGone = async (run: string): Promise<ReadonlyArray<string>> => {
  const deadline = Date.now() + 30_000
  for (;;) {
    const left = await leftovers(machineIdOf(run))
    if (left.length === 0 || Date.now() > deadline) return left
    await new Promise((r) => setTimeout(r, 200))
  }
}

// ---------------------------------------------------------------------------------------------
// HTTP helpers

/** One API answer: status, parsed body (undefined when empty or not JSON), raw text and headers. */
export interface Answer {
  readonly status: number
  readonly body: Json
  readonly text: string
  readonly headers: http.IncomingHttpHeaders
}

/** A raw HTTP answer. */
export interface RawAnswer {
  readonly status: number
  readonly headers: http.IncomingHttpHeaders
  readonly data: Buffer
}

/**
 * One HTTP request on a connection of its own (no keep-alive): a stopped gateway leaves no pooled
 * connection behind for the next request to land on, and a test sees a restart as a client would.
 */
export const request = (
  url: string,
  options: { readonly method?: string; readonly headers?: Headers; readonly body?: Uint8Array | string } = {},
): Promise<RawAnswer> =>
  new Promise((resolve, reject) => {
    const req = http.request(
      url,
      { method: options.method ?? "GET", headers: options.headers, agent: false },
      (res) => {
        const chunks: Array<Buffer> = []
        res.on("data", (c: Buffer) => chunks.push(c))
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, data: Buffer.concat(chunks) }),
        )
        res.on("error", reject)
      },
    )
    req.on("error", reject)
    req.end(options.body)
  })

/** Calls the stack's API. */
export const call = async (
  stack: Pick<Stack, "url">,
  method: string,
  path: string,
  headers: Headers,
  body?: unknown,
): Promise<Answer> => {
  const res = await request(`${stack.url}${path}`, {
    method,
    headers: { ...headers, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  const text = res.data.toString("utf8")
  let parsed: Json
  try {
    parsed = text === "" ? undefined : JSON.parse(text)
  } catch {
    parsed = undefined
  }
  return { status: res.status, body: parsed, text, headers: res.headers }
}

/** Throws with the answer when the status is not the expected one. */
export const expectStatus = (answer: Answer, status: number, what: string): Json => {
  if (answer.status !== status)
    throw new Error(`${what}: expected ${status}, got ${answer.status} ${answer.text}`)
  return answer.body
}

/** Throws unless the answer is the spec's refusal `status` / `code`, its message naming `field` when given. */
export const expectRefused = (answer: Answer, status: number, code: string, field?: string): void => {
  if (answer.status !== status || answer.body?.code !== code)
    throw new Error(`expected ${status} ${code}, got ${answer.status} ${answer.text}`)
  if (field !== undefined && !String(answer.body.error).startsWith(`${field}: `))
    throw new Error(`expected the message to name ${field}: ${answer.body.error}`)
}

/** A run key of `account` for `functions` (`*` = all), as its headers. */
export const runKey = async (
  stack: Stack,
  account: TestAccount,
  functions: ReadonlyArray<string>,
): Promise<Headers> => {
  const made = expectStatus(
    await call(stack, "POST", "/v1/keys", account.owner, { name: "ci", scope: "run", functions }),
    201,
    "POST /v1/keys",
  )
  return { authorization: `Bearer ${made.token}` }
}

const usdNanos = (usd: number) => Math.round(usd * 1e9)

/**
 * For a stack without a host agent (`noHost`): a host record listing the test base, live for an
 * hour, so `POST /v1/functions` accepts the base. It offers no vCPUs, so no run is ever placed.
 */
export const advertiseBase = (stack: Stack, id: string) =>
  stack.run(
    Effect.gen(function* () {
      const { names } = yield* StorageTag
      const kv = yield* Kv.make(names.kv.hosts.name, HostRecord)
      const at = new Date(Date.now() + 3_600_000).toISOString()
      yield* kv.put(id, {
        id: id as HostRecord["id"],
        driver: "namespace",
        vcpus: 0,
        memory_mib: 0,
        bases: [
          { name: stack.base.name as BaseInfo["name"], sha256: stack.base.sha256, bytes: stack.base.bytes },
        ],
        started_at: at,
        heartbeat_at: at,
        machines: [],
        free_vcpus: 0,
        free_memory_mib: 0,
      })
    }),
  )

/**
 * A new account as `hangar admin create-account` makes it, credited `creditUsd` dollars as
 * `hangar admin credit` does (through the account actor), with its owner's token and an admin key
 * made through `POST /v1/keys`. `memoryMib` raises the account's memory limit (many queued runs).
 */
export const createAccount = async (
  stack: Stack,
  options: { readonly name?: string; readonly creditUsd?: number; readonly memoryMib?: number } = {},
): Promise<TestAccount> => {
  const ownerEmail = `owner-${randomBytes(4).toString("hex")}@example.com`
  const { account } = await stack.run(
    Effect.flatMap(Accounts.Accounts, (a) => a.createAccount(options.name ?? "acme", ownerEmail)),
  )
  if (options.memoryMib !== undefined) await setLimits(stack, account.id, options.memoryMib)
  if ((options.creditUsd ?? 100) !== 0) await credit(stack, account.id, options.creditUsd ?? 100)
  const token = await personToken(stack.env.OIDC_KEY_FILE!, ownerEmail)
  const owner = { authorization: `Bearer ${token}`, "service-account": account.id }
  const key = expectStatus(
    await call(stack, "POST", "/v1/keys", owner, { name: "admin", scope: "admin" }),
    201,
    "POST /v1/keys",
  )
  return { id: account.id, ownerEmail, owner, admin: { authorization: `Bearer ${key.token}` } }
}

/**
 * `createAccount`, made again (another account) when a try fails, up to `attempts` tries: on a
 * cluster just started, or just after a fault, the account actors' partitions may still be moving
 * and the credit's ask can time out.
 */
export const createAccountPatiently = async (
  stack: Stack,
  options: Parameters<typeof createAccount>[1] = {},
  attempts = 3,
): Promise<TestAccount> => {
  for (let attempt = 1; ; attempt++) {
    try {
      return await createAccount(stack, options)
    } catch (e) {
      if (attempt >= attempts) throw e
    }
  }
}

/** Credits (or debits, when negative) the account through its actor, as `hangar admin credit`. */
export const credit = (stack: Stack, account: string, usd: number) =>
  stack.run(AccountClient.adjust(account, "adjustment", usdNanos(usd), { timeout: "20 seconds" }))

/** The account's balance as its actor stored it. */
export const balance = (stack: Stack, account: string) => stack.run(AccountClient.balance(account))

/** Suspends or reactivates the account, as `hangar admin suspend` / `reactivate` do. */
export const setAccountState = (stack: Stack, account: string, state: "active" | "suspended") =>
  stack.run(Effect.flatMap(Accounts.Accounts, (a) => a.setState(account, state)))

/** Sets the account's memory limit (a fixture: no route changes limits). */
export const setLimits = (stack: Stack, account: string, memoryMib: number) =>
  stack.run(
    Effect.gen(function* () {
      const { views } = yield* Accounts.Accounts
      const entry = yield* views.accounts.get(account)
      if (Option.isNone(entry)) return yield* Effect.dieMessage(`no account ${account}`)
      const record = entry.value.value
      yield* views.accounts.put(account, { ...record, limits: { ...record.limits, memory_mib: memoryMib } })
    }),
  )

/** Publishes a provider named `name` with `model` and the vendor `key`; answers its `<id>@latest` reference. */
export const publishProvider = async (
  stack: Stack,
  account: TestAccount,
  name: string,
  model: Record<string, unknown>,
  key: string,
): Promise<string> =>
  `${expectStatus(await call(stack, "POST", "/v1/providers", account.admin, { name, model, key }), 201, `POST /v1/providers ${name}`).id}@latest`

/** Publishes a function with `provider: "none"` on the test base, size `s` (overridable). */
export const publish = async (
  stack: Stack,
  account: TestAccount,
  definition: Record<string, unknown> = {},
): Promise<Json> =>
  expectStatus(
    await call(stack, "POST", "/v1/functions", account.admin, {
      name: "fn",
      system_prompt: "Do the task.",
      provider: "none",
      base: stack.base.name,
      size: "s",
      output_manifest: [{ path: "result.txt" }],
      ...definition,
    }),
    201,
    "POST /v1/functions",
  )

/**
 * Run `run`'s log as one `GET /v1/runs/{id}/log` answers it, as JSON lines (an ended run's log is
 * answered whole: the route waits for the part its machine writes as it goes).
 */
export const runLog = async (stack: Stack, account: TestAccount, run: string): Promise<Array<Json>> => {
  const log = await call(stack, "GET", `/v1/runs/${run}/log`, account.owner)
  if (log.status !== 200) throw new Error(`GET /v1/runs/${run}/log: ${log.status} ${log.text}`)
  return (await Promise.all(log.body.parts.map((u: string) => request(u))))
    .flatMap((p) => p.data.toString("utf8").split("\n"))
    .filter((l) => l !== "")
    .map((l) => JSON.parse(l) as Json)
}

/** Uploads `data` (POST /v1/files, then the signed PUT); answers the upload id. */
export const upload = async (stack: Stack, account: TestAccount, data: Uint8Array): Promise<string> => {
  const made = expectStatus(
    await call(stack, "POST", "/v1/files", account.admin, {
      bytes: data.byteLength,
      sha256: createHash("sha256").update(data).digest("hex"),
    }),
    201,
    "POST /v1/files",
  )
  const res = await request(made.url, {
    method: made.method ?? "PUT",
    headers: made.headers ?? { "content-type": "application/octet-stream" },
    body: data,
  })
  if (res.status < 200 || res.status > 299)
    throw new Error(`PUT upload: ${res.status} ${res.data.toString()}`)
  return made.id as string
}

/** Starts a run (POST /v1/functions/{id}/runs); answers the raw answer (refusals are tested too). */
export const startRunAnswer = async (
  stack: Stack,
  account: TestAccount,
  fn: string,
  body: Record<string, unknown> = {},
  headers: Headers = account.admin,
): Promise<Answer> => {
  const answer = await call(stack, "POST", `/v1/functions/${fn}/runs`, headers, { prompt: "go", ...body })
  if (answer.status === 201 && typeof answer.body?.id === "string") stack.runs.add(answer.body.id)
  return answer
}

/** Starts a run and answers it (201 expected). */
export const startRun = async (
  stack: Stack,
  account: TestAccount,
  fn: string,
  body: Record<string, unknown> = {},
): Promise<Json> => expectStatus(await startRunAnswer(stack, account, fn, body), 201, "POST runs")

/** GET /v1/runs/{id}. */
export const getRun = async (stack: Stack, account: TestAccount, run: string): Promise<Json> =>
  expectStatus(await call(stack, "GET", `/v1/runs/${run}`, account.admin), 200, `GET /v1/runs/${run}`)

const pause = (ms: number) => new Promise((r) => setTimeout(r, ms))

/**
 * Reads the run until `until` holds (default: ended), at most `timeoutMs`; GET errors while a
 * gateway restarts are retried. Throws with the last answer when it never holds.
 */
export const waitRun = async (
  stack: Stack,
  account: TestAccount,
  run: string,
  options: { readonly until?: (run: Json) => boolean; readonly timeoutMs?: number } = {},
): Promise<Json> => {
  const until = options.until ?? ((r: Json) => r.state === "succeeded" || r.state === "failed")
  const deadline = Date.now() + (options.timeoutMs ?? 120_000)
  let last: string = "no answer"
  while (Date.now() < deadline) {
    const answer = await call(stack, "GET", `/v1/runs/${run}`, account.admin).catch((e: unknown) => ({
      status: 0,
      body: undefined,
      text: String(e),
    }))
    if (answer.status === 200 && until(answer.body)) return answer.body
    last = `${answer.status} ${answer.text}`
    await pause(200)
  }
  throw new Error(
    `run ${run} did not reach the awaited state within ${options.timeoutMs ?? 120_000} ms: ${last}`,
  )
}

/** Sends a command (POST /v1/runs/{id}/commands); answers the raw answer. */
export const sendCommandAnswer = (
  stack: Stack,
  account: TestAccount,
  run: string,
  kind: string,
  args: Record<string, unknown>,
  headers: Headers = account.admin,
): Promise<Answer> => call(stack, "POST", `/v1/runs/${run}/commands`, headers, { kind, arguments: args })

/** Waits for a command to end (GET …/commands/{cid}?wait=25, repeated up to `timeoutMs`). */
export const waitCommand = async (
  stack: Stack,
  account: TestAccount,
  run: string,
  command: string,
  timeoutMs = 120_000,
): Promise<Json> => {
  const deadline = Date.now() + timeoutMs
  let last = "no answer"
  while (Date.now() < deadline) {
    const answer = await call(
      stack,
      "GET",
      `/v1/runs/${run}/commands/${command}?wait=25`,
      account.admin,
    ).catch((e: unknown) => ({ status: 0, body: undefined, text: String(e) }))
    if (answer.status === 200 && ["succeeded", "failed", "cancelled"].includes(answer.body.state))
      return answer.body
    last = `${answer.status} ${answer.text}`
    if (answer.status !== 200) await pause(200)
  }
  throw new Error(`command ${command} of ${run} did not end within ${timeoutMs} ms: ${last}`)
}

/** Waits until a command is `running` on its machine (GET …/commands/{cid}, polled). */
export const waitCommandRunning = async (
  stack: Stack,
  account: TestAccount,
  run: string,
  command: string,
  timeoutMs = 30_000,
): Promise<void> => {
  const deadline = Date.now() + timeoutMs
  let last = "no answer"
  while (Date.now() < deadline) {
    const seen = await call(stack, "GET", `/v1/runs/${run}/commands/${command}`, account.admin)
    if (seen.body?.state === "running") return
    last = seen.text
    await pause(20)
  }
  throw new Error(`command ${command} of ${run} never ran within ${timeoutMs} ms: ${last}`)
}

/** Sends a command and waits for its end; answers the ended record. */
export const command = async (
  stack: Stack,
  account: TestAccount,
  run: string,
  kind: string,
  args: Record<string, unknown>,
  timeoutMs?: number,
): Promise<Json> => {
  const sent = expectStatus(
    await sendCommandAnswer(stack, account, run, kind, args),
    201,
    `POST commands ${kind}`,
  )
  return waitCommand(stack, account, run, sent.id, timeoutMs)
}

// ---------------------------------------------------------------------------------------------
// Archives

/** One entry of a test archive: a file, a folder, or a symbolic link. */
export type TarEntry =
  | { readonly path: string; readonly content: string | Uint8Array; readonly mode?: number }
  | { readonly path: string; readonly dir: true }
  | { readonly path: string; readonly symlink: string }

const octal = (value: number, width: number) => `${value.toString(8).padStart(width - 1, "0")}\0`

const header = (name: string, size: number, type: string, mode: number, link = "") => {
  const h = Buffer.alloc(512)
  h.write(name, 0, 100, "utf8")
  h.write(octal(mode, 8), 100, 8, "ascii")
  h.write(octal(0, 8), 108, 8, "ascii")
  h.write(octal(0, 8), 116, 8, "ascii")
  h.write(octal(size, 12), 124, 12, "ascii")
  h.write(octal(Math.floor(Date.now() / 1000), 12), 136, 12, "ascii")
  h.write("        ", 148, 8, "ascii")
  h.write(type, 156, 1, "ascii")
  h.write(link, 157, 100, "utf8")
  h.write("ustar\0", 257, 6, "ascii")
  h.write("00", 263, 2, "ascii")
  let sum = 0
  for (const b of h) sum += b
  h.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, 8, "ascii")
  return h
}

/** A plain ustar archive of `entries` (names under 100 bytes), uncompressed. */
export const tar = (entries: ReadonlyArray<TarEntry>): Buffer => {
  const parts: Array<Buffer> = []
  for (const e of entries) {
    if ("dir" in e) parts.push(header(e.path.endsWith("/") ? e.path : `${e.path}/`, 0, "5", 0o755))
    else if ("symlink" in e) parts.push(header(e.path, 0, "2", 0o777, e.symlink))
    else {
      const data = typeof e.content === "string" ? Buffer.from(e.content, "utf8") : Buffer.from(e.content)
      parts.push(header(e.path, data.byteLength, "0", e.mode ?? 0o644), data)
      parts.push(Buffer.alloc((512 - (data.byteLength % 512)) % 512))
    }
  }
  parts.push(Buffer.alloc(1024))
  return Buffer.concat(parts)
}

/** A `.tar.gz` of `entries`. */
export const tarGz = (entries: ReadonlyArray<TarEntry>): Buffer => gzipSync(tar(entries))

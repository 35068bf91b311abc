/**
 * A nats-server child process as a scoped resource. The launcher (`.data/`) and the test harness
 * (temp dirs, port -1) both build on it.
 *
 * Start writes a config file (JetStream on, the given store dir, `ports_file_dir` so the real port
 * is known when the port is -1), spawns the binary, and waits until the ports file names the client
 * URL and a TCP connection to it succeeds. Release sends SIGTERM, escalates to SIGKILL after a
 * timeout and waits for the exit, so no server outlives its scope, nor the process that started it
 * (its exit hook, or the watchdog when it was killed outright). The tail of stderr (the server's
 * log) is kept for error messages.
 *
 * With a `storeKey`, JetStream encrypts everything it writes (streams, KV, object stores, their
 * indexes) with AES-GCM (`cipher: aes`); the key reaches the server through its environment, never
 * through the config file. A store written without encryption is encrypted by the server when it
 * starts with a key.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { createHash } from "node:crypto"
import { rmSync } from "node:fs"
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises"
import { connect, type Socket } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { Scope } from "effect"
import { Clock, Data, Duration, Effect, Option, Redacted, Schedule } from "effect"
import { natsServerPath } from "./tools.mjs"

// Servers this process started and has not stopped yet, with their config folders. A process
// that exits without closing their scopes (`process.exit` in a script, a test worker ended at its
// timeout) kills them and removes the folders on its way out, so nothing outlives it.
const running = new Map<ChildProcess, string>()
process.once("exit", () => {
  for (const [child, runDir] of running) {
    child.kill("SIGKILL")
    rmSync(runDir, { recursive: true, force: true })
  }
})

// A process that dies without running its exit hook (SIGKILL, an unhandled signal) leaves that to
// its watchdog (`nats-watchdog.mjs`): one per process, started with the first server, in its own
// process group (a terminal's Ctrl-C reaches the server directly, not the watchdog), and told of
// each server started and stopped. It acts when its stdin ends, which is when this process is gone.
let watchdog: ChildProcess | undefined
const tellWatchdog = (fields: ReadonlyArray<string | number>) => {
  if (watchdog === undefined) {
    watchdog = spawn(process.execPath, [join(import.meta.dirname, "nats-watchdog.mjs")], {
      stdio: ["pipe", "ignore", "ignore"],
      detached: true,
    })
    // Neither the watchdog nor the pipe to it keeps this process alive.
    watchdog.unref()
    ;(watchdog.stdin as Socket | null)?.unref()
    // A watchdog that could not start or has died only loses the crash clean-up.
    watchdog.on("error", () => undefined)
    watchdog.stdin?.on("error", () => undefined)
  }
  watchdog.stdin?.write(`${fields.join("\t")}\n`)
}

/** How to start one nats-server. */
export interface NatsProcessOptions {
  /** JetStream store directory (created if missing; kept on release). */
  readonly storeDir: string
  /** Listen host; default `127.0.0.1`. */
  readonly host?: string
  /** Client port; `-1` (the default) lets the server pick a free one. */
  readonly port?: number
  /**
   * fsync every write before acknowledging it (`sync_interval: always`); default true, as DESIGN.md
   * requires for a single node. Tests may turn it off to save fsyncs.
   */
  readonly syncAlways?: boolean
  /** The binary; default the one chosen by the bootstrap (`natsServerPath()`). */
  readonly binary?: string
  /** Server name shown in its log and INFO. */
  readonly serverName?: string
  /** Extra lines appended verbatim to the generated config. */
  readonly extraConfig?: string
  /** The key JetStream encrypts its store with; none writes the store in clear. */
  readonly storeKey?: Redacted.Redacted<string>
  /** How long to wait for the server to listen; default 20 seconds. */
  readonly startTimeout?: Duration.DurationInput
  /** How long SIGTERM may take before SIGKILL; default 10 seconds. */
  readonly stopTimeout?: Duration.DurationInput
  /**
   * Folders to remove when this process dies without stopping the server (a test's temporary
   * store). The config folder always goes; the store is kept otherwise.
   */
  readonly removeOnCrash?: ReadonlyArray<string>
}

/** A running nats-server. */
export interface NatsProcess {
  readonly url: string
  readonly port: number
  readonly storeDir: string
  readonly pid: number
}

/** The server could not be started (or died while starting); `stderr` is the tail of its log. */
export class NatsProcessError extends Data.TaggedError("NatsProcessError")<{
  readonly message: string
  readonly stderr: string
}> {}

const STDERR_KEEP = 16 * 1024

// Waiting for a real process is real time: a TestClock (as in `it.effect`) must not freeze it.
const liveClock = Clock.make()

/** What nats-server logs for a stream its key does not open. */
const undecryptable = "Error decrypting our stream metafile"

/** The environment variable that hands the server its store key. */
export const storeKeyVariable = "HANGAR_NATS_STORE_KEY_FOR_SERVER"

/**
 * What the server is given for `storeKey`: the server reads a variable's value as config syntax
 * (`$HOME` expands, quotes and escapes are taken away, `1234` or `true` are not strings), so it
 * gets a hash of the key in a form that syntax leaves alone: `k` and 64 hex digits.
 */
export const serverKeyOf = (storeKey: Redacted.Redacted<string>): string =>
  `k${createHash("sha256").update("hangar/nats-store/v1\0").update(Redacted.value(storeKey)).digest("hex")}`

/** The generated config; strings are JSON-quoted, which the NATS config syntax accepts. */
export const renderConfig = (
  o: Required<Pick<NatsProcessOptions, "storeDir" | "host" | "port" | "syncAlways">> & {
    readonly portsFileDir: string
    readonly serverName?: string | undefined
    readonly extraConfig?: string | undefined
    readonly encrypted?: boolean | undefined
  },
): string =>
  [
    `listen: ${JSON.stringify(`${o.host}:${o.port}`)}`,
    `ports_file_dir: ${JSON.stringify(o.portsFileDir)}`,
    o.serverName === undefined ? "" : `server_name: ${JSON.stringify(o.serverName)}`,
    "jetstream {",
    `  store_dir: ${JSON.stringify(o.storeDir)}`,
    // "always" makes every acknowledged write durable across a power cut; the default (2m) does not.
    o.syncAlways ? "  sync_interval: always" : "",
    // The key is a variable the server resolves from its environment (`storeKeyVariable`).
    o.encrypted ? "  cipher: aes" : "",
    o.encrypted ? `  key: $${storeKeyVariable}` : "",
    "}",
    o.extraConfig ?? "",
    "",
  ]
    .filter((line, i, all) => line !== "" || i === all.length - 1)
    .join("\n")

const readPortsFile = (dir: string, pid: number) =>
  Effect.tryPromise(async () => {
    const names = await readdir(dir)
    const name = names.find((n) => n.endsWith(`_${pid}.ports`))
    if (name === undefined) return Option.none<string>()
    const parsed = JSON.parse(await readFile(join(dir, name), "utf8")) as { nats?: ReadonlyArray<string> }
    const url = parsed.nats?.[0]
    return url === undefined ? Option.none<string>() : Option.some(url)
  }).pipe(Effect.orElseSucceed(() => Option.none<string>()))

const tcpReachable = (host: string, port: number) =>
  Effect.async<boolean>((resume) => {
    const socket = connect({ host, port })
    const done = (ok: boolean) => {
      socket.destroy()
      resume(Effect.succeed(ok))
    }
    socket.once("connect", () => done(true))
    socket.once("error", () => done(false))
    return Effect.sync(() => socket.destroy())
  })

const waitExit = (child: ChildProcess) =>
  Effect.async<void>((resume) => {
    if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
    const onExit = () => resume(Effect.void)
    child.once("exit", onExit)
    return Effect.sync(() => child.off("exit", onExit))
  })

const stop = (child: ChildProcess, timeout: Duration.DurationInput) =>
  Effect.gen(function* () {
    if (child.exitCode !== null || child.signalCode !== null) return
    child.kill("SIGTERM")
    const exited = yield* waitExit(child).pipe(Effect.timeoutOption(timeout))
    if (Option.isNone(exited)) {
      yield* Effect.logWarning("nats-server ignored SIGTERM; sending SIGKILL").pipe(
        Effect.annotateLogs({ pid: child.pid }),
      )
      child.kill("SIGKILL")
      yield* waitExit(child)
    }
  }).pipe(Effect.withClock(liveClock))

/**
 * Starts a nats-server for the life of the scope. Fails with `NatsProcessError` if the binary is
 * missing, the server exits early (e.g. the port is taken), or it does not listen in time.
 */
export const start = (
  options: NatsProcessOptions,
): Effect.Effect<NatsProcess, NatsProcessError, Scope.Scope> =>
  Effect.gen(function* () {
    const host = options.host ?? "127.0.0.1"
    const port = options.port ?? -1
    const syncAlways = options.syncAlways ?? true
    let stderr = ""
    const fail = (message: string) => new NatsProcessError({ message, stderr })
    const binary = yield* Effect.try({
      try: () => options.binary ?? natsServerPath(),
      catch: (e) => fail(e instanceof Error ? e.message : String(e)),
    })
    // Config and ports file live in their own temp dir so a stale ports file of an earlier
    // server on the same store dir is never read.
    const runDir = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: async () => {
          await mkdir(options.storeDir, { recursive: true })
          return mkdtemp(join(tmpdir(), "hangar-nats-run-"))
        },
        catch: (e) => fail(`cannot prepare directories: ${String(e)}`),
      }),
      (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true })),
    )
    const configPath = join(runDir, "nats-server.conf")
    const config = renderConfig({
      storeDir: options.storeDir,
      host,
      port,
      syncAlways,
      portsFileDir: runDir,
      serverName: options.serverName,
      extraConfig: options.extraConfig,
      encrypted: options.storeKey !== undefined,
    })
    yield* Effect.tryPromise({
      try: () => writeFile(configPath, config),
      catch: (e) => fail(`cannot write config: ${String(e)}`),
    })

    const child = yield* Effect.acquireRelease(
      Effect.try({
        try: () => {
          // Its own process group: a terminal's Ctrl-C (SIGINT to the whole foreground group)
          // must not stop it before the roles that use it have shut down; it is stopped last,
          // when its scope closes (or by the exit hook and the watchdog when this process dies).
          const spawned = spawn(binary, ["-c", configPath], {
            stdio: ["ignore", "ignore", "pipe"],
            detached: true,
            env:
              options.storeKey === undefined
                ? process.env
                : { ...process.env, [storeKeyVariable]: serverKeyOf(options.storeKey) },
          })
          running.set(spawned, runDir)
          if (spawned.pid !== undefined) {
            const pid = spawned.pid
            tellWatchdog(["+", pid, configPath, runDir, ...(options.removeOnCrash ?? [])])
            spawned.once("exit", () => tellWatchdog(["-", pid]))
          }
          return spawned
        },
        catch: (e) => fail(`cannot spawn ${binary}: ${String(e)}`),
      }),
      (child) =>
        stop(child, options.stopTimeout ?? Duration.seconds(10)).pipe(
          Effect.ensuring(Effect.sync(() => running.delete(child))),
        ),
    )
    child.stderr?.setEncoding("utf8")
    child.stderr?.on("data", (chunk: string) => {
      stderr = (stderr + chunk).slice(-STDERR_KEEP)
    })
    const spawnError = yield* Effect.async<Option.Option<Error>>((resume) => {
      if (child.pid !== undefined) return resume(Effect.succeed(Option.none()))
      child.once("error", (e) => resume(Effect.succeed(Option.some(e))))
      child.once("spawn", () => resume(Effect.succeed(Option.none())))
    })
    if (Option.isSome(spawnError))
      return yield* Effect.fail(fail(`cannot spawn ${binary}: ${spawnError.value.message}`))
    const pid = child.pid!

    const ready = Effect.gen(function* () {
      if (child.exitCode !== null || child.signalCode !== null) {
        return yield* Effect.fail(
          fail(
            `nats-server exited while starting (code ${child.exitCode}, signal ${child.signalCode})${
              stderr.trim() === "" ? "" : `: ${stderr.trim().split("\n").slice(-3).join(" | ")}`
            }`,
          ),
        )
      }
      const url = yield* readPortsFile(runDir, pid)
      if (Option.isNone(url)) return yield* Effect.fail(undefined)
      const parsed = new URL(url.value)
      const realPort = Number(parsed.port)
      const reachable = yield* tcpReachable(host === "0.0.0.0" ? "127.0.0.1" : host, realPort)
      if (!reachable) return yield* Effect.fail(undefined)
      return { url: url.value, port: realPort }
    })
    const listening = yield* ready.pipe(
      Effect.retry({
        schedule: Schedule.spaced(Duration.millis(20)),
        while: (e) => e === undefined,
      }),
      Effect.timeoutFail({
        duration: options.startTimeout ?? Duration.seconds(20),
        onTimeout: () => fail("nats-server did not start listening in time"),
      }),
      Effect.mapError((e) => e ?? fail("nats-server did not start")),
      Effect.withClock(liveClock),
    )
    // A key that does not open the store: the server starts, warns, and serves none of its streams
    // (a first write would then fail, or make an empty stream beside the unreadable one). Refused.
    if (stderr.includes(undecryptable))
      return yield* Effect.fail(
        fail(
          `the store key does not open the store in ${options.storeDir} (was HANGAR_NATS_STORE_KEY or the key file changed?); nothing was started`,
        ),
      )
    yield* Effect.logDebug("nats-server started").pipe(Effect.annotateLogs({ pid, url: listening.url }))
    return { url: listening.url, port: listening.port, storeDir: options.storeDir, pid }
  })

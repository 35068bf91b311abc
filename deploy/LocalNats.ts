/**
 * The nats-server of `npm start` (`hangar serve all`): JetStream with `sync_interval: always`, its
 * store in `<dataDir>/nats`, listening on 127.0.0.1:4222 by default.
 *
 * Before anything touches the data folder it takes the lock `<dataDir>/hangar.lock`, which names
 * the holder's pid, so a second `npm start` fails with `AlreadyRunning` instead of running a second
 * server on the same store. A lock whose process is gone (or whose pid now belongs to another
 * process) is stale and taken over, after stopping the nats-server it recorded if that still runs
 * (a SIGKILLed parent leaves its child running). The lock is removed when the scope closes, after
 * the server has stopped.
 *
 * The store is encrypted at rest (see `NatsProcess`): the key is `HANGAR_NATS_STORE_KEY` when set
 * (a secret manager's), else the file `<dataDir>/nats-store.key`, made once (0600) like the master
 * key. Losing the key loses the store.
 */

import { randomBytes } from "node:crypto"
import { existsSync, readFileSync } from "node:fs"
import { link, mkdir, readFile, rename, unlink, writeFile } from "node:fs/promises"
import { join } from "node:path"
import type { Scope } from "effect"
import { Clock, Context, Data, Duration, Effect, Layer, Option, Redacted, Schedule } from "effect"
import { defineSettings, env } from "../core/Config.ts"
import { readOrCreate } from "../core/SecretFile.ts"
import * as NatsProcess from "./NatsProcess.ts"
import { dataDir } from "./tools.mjs"

/** Settings of the local server (`HANGAR_NATS_PORT`). */
export interface LocalNatsSettingsShape {
  /** Local data folder; the store is `<dataDir>/nats`, the lock `<dataDir>/hangar.lock`. */
  readonly dataDir: string
  /** Listen host. */
  readonly host: string
  /** Client port; -1 lets the server pick a free one (tests). */
  readonly port: number
  /** The store's key (`HANGAR_NATS_STORE_KEY`); empty reads or makes `<dataDir>/nats-store.key`. */
  readonly storeKey: Redacted.Redacted<string>
}

/** Settings of the local nats-server. */
export const LocalNatsSettings = defineSettings(
  "hangar/LocalNatsSettings",
  { dataDir, host: "127.0.0.1", port: 4222, storeKey: Redacted.make("") } as LocalNatsSettingsShape,
  (d) => ({ port: env.integer("NATS_PORT", d.port, -1), storeKey: env.redacted("NATS_STORE_KEY", "") }),
)

/** Another live process holds the data folder's lock; `pid` is that process. */
export class AlreadyRunning extends Data.TaggedError("AlreadyRunning")<{
  readonly pid: number
  readonly lockFile: string
  readonly message: string
}> {}

/** The lock file could not be read, written or removed (permissions, a full disk). */
export class LockError extends Data.TaggedError("LockError")<{
  readonly lockFile: string
  readonly message: string
}> {}

/** The running local server. */
export class LocalNats extends Context.Tag("hangar/LocalNats")<LocalNats, NatsProcess.NatsProcess>() {}

/** The lock file of a data folder. */
export const lockFileOf = (dir: string): string => join(dir, "hangar.lock")

// From /proc/<pid>/stat: the state (field 3; "Z" is a zombie, exited but not yet reaped, as an
// orphan under a container's init may stay) and the start time (field 22, clock ticks since boot),
// which tells a live holder from an unrelated process later given the same pid. Undefined where
// /proc is unavailable.
const procStat = (pid: number): { readonly state: string; readonly startTime: string } | undefined => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    // The command name (field 2) is in parentheses and may hold spaces; fields 3.. follow it.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
    return { state: fields[0] ?? "", startTime: fields[19] ?? "" }
  } catch {
    return undefined
  }
}

const startTimeOf = (pid: number): string | undefined => procStat(pid)?.startTime

/** A process named in the lock: the pid and, where known, its start time. */
interface Proc {
  readonly pid: number
  readonly startTime: string | undefined
}

/** What the lock records: the process holding it and, once started, its nats-server. */
interface LockContent {
  readonly holder: Proc
  readonly server: Proc | undefined
}

/**
 * Lock file content, one value a line: holder pid (first, so `kill $(head -1 …)` works), holder
 * start time, then the server's pid and start time once it runs.
 */
const render = (c: LockContent) =>
  [c.holder.pid, c.holder.startTime ?? "", ...(c.server ? [c.server.pid, c.server.startTime ?? ""] : [])]
    .map((v) => `${v}\n`)
    .join("")

const parseProc = (pidLine: string | undefined, startLine: string | undefined): Proc | undefined => {
  const pid = Number(pidLine)
  if (pidLine === undefined || pidLine === "" || !Number.isSafeInteger(pid) || pid <= 0) return undefined
  return { pid, startTime: startLine === undefined || startLine === "" ? undefined : startLine }
}

const parse = (content: string): LockContent | undefined => {
  const lines = content.split("\n")
  const holder = parseProc(lines[0], lines[1])
  return holder === undefined ? undefined : { holder, server: parseProc(lines[2], lines[3]) }
}

const procOf = (pid: number): Proc => ({ pid, startTime: startTimeOf(pid) })

const isAlive = (p: Proc): boolean => {
  try {
    process.kill(p.pid, 0)
  } catch (e) {
    // EPERM: the process exists but belongs to another user.
    if ((e as NodeJS.ErrnoException).code !== "EPERM") return false
  }
  const now = procStat(p.pid)
  // Without /proc the pid alone decides; with it, a missing entry means it has just exited.
  if (now === undefined) return !existsSync("/proc/self/stat")
  return now.state !== "Z" && (p.startTime === undefined || now.startTime === p.startTime)
}

const errnoOf = (e: unknown) => (e as NodeJS.ErrnoException | undefined)?.code

// Waiting for a real process to exit is real time, even under a TestClock.
const liveClock = Clock.make()

/**
 * Stops the nats-server a crashed holder left behind (a SIGKILLed parent cannot stop its child),
 * so the store is never used by two servers: SIGTERM, then SIGKILL after 10 seconds.
 */
const stopOrphan = (server: Proc) =>
  Effect.gen(function* () {
    if (server.startTime === undefined || !isAlive(server)) return
    yield* Effect.logWarning("stopping the nats-server left by a crashed start").pipe(
      Effect.annotateLogs({ pid: server.pid }),
    )
    const gone = Effect.sync(() => isAlive(server)).pipe(
      Effect.repeat({ schedule: Schedule.spaced(Duration.millis(50)), while: (alive) => alive }),
    )
    for (const [signal, wait] of [
      ["SIGTERM", Duration.seconds(10)],
      ["SIGKILL", Duration.seconds(5)],
    ] as const) {
      yield* Effect.sync(() => {
        try {
          process.kill(server.pid, signal)
        } catch {
          // exited meanwhile
        }
      })
      if (Option.isSome(yield* gone.pipe(Effect.timeoutOption(wait)))) return
    }
  }).pipe(Effect.withClock(liveClock))

/** The held lock of a data folder. */
export interface DataLock {
  /** Records the started nats-server in the lock, so a later start can stop it if we crash. */
  readonly recordServer: (pid: number) => Effect.Effect<void, LockError>
}

/**
 * Takes the data folder's lock for the life of the scope. Fails with `AlreadyRunning` when a live
 * process holds it; takes over a stale one (dead holder, reused pid, unreadable content), first
 * stopping the nats-server the stale holder recorded if it still runs.
 */
export const lock = (dir: string): Effect.Effect<DataLock, AlreadyRunning | LockError, Scope.Scope> => {
  const lockFile = lockFileOf(dir)
  const staging = `${lockFile}.${process.pid}.tmp`
  const holder = procOf(process.pid)
  let ours = render({ holder, server: undefined })
  const fail = (what: string) => (e: unknown) =>
    new LockError({ lockFile, message: `${what}: ${e instanceof Error ? e.message : String(e)}` })
  const attempt = <A>(what: string, f: () => Promise<A>, tolerate?: string) =>
    Effect.tryPromise({ try: f, catch: (e) => e }).pipe(
      Effect.map((a): A | undefined => a),
      Effect.catchAll((e) =>
        tolerate !== undefined && errnoOf(e) === tolerate
          ? Effect.succeed(undefined)
          : Effect.fail(fail(what)(e)),
      ),
    )

  const acquire = Effect.gen(function* () {
    // The content is written to a private file first and hard-linked into place: the lock file
    // appears atomically and never empty, so a racing starter cannot mistake it for a stale one.
    yield* attempt("cannot write the lock", async () => {
      await mkdir(dir, { recursive: true, mode: 0o700 })
      await writeFile(staging, ours)
    })
    for (let round = 0; round < 5; round++) {
      const linked = yield* attempt(
        "cannot create the lock",
        () => link(staging, lockFile).then(() => true),
        "EEXIST",
      )
      if (linked) return
      const content = yield* attempt("cannot read the lock", () => readFile(lockFile, "utf8"), "ENOENT")
      if (content === undefined) continue // released meanwhile: try again
      const stale = parse(content)
      if (stale !== undefined && isAlive(stale.holder)) {
        return yield* new AlreadyRunning({
          pid: stale.holder.pid,
          lockFile,
          message: `Hangar is already running (pid ${stale.holder.pid}) with its data in ${dir}; stop it first (lock: ${lockFile})`,
        })
      }
      yield* Effect.logWarning("taking over a stale lock").pipe(
        Effect.annotateLogs({ lockFile, stalePid: stale?.holder.pid ?? null }),
      )
      if (stale?.server !== undefined) yield* stopOrphan(stale.server)
      // Remove it only if it still holds what we judged stale (a racer may have replaced it).
      yield* attempt(
        "cannot remove the stale lock",
        async () => {
          if ((await readFile(lockFile, "utf8")) === content) await unlink(lockFile)
        },
        "ENOENT",
      )
    }
    return yield* new LockError({ lockFile, message: "the lock kept changing; is another start racing?" })
  }).pipe(Effect.ensuring(Effect.promise(() => unlink(staging).catch(() => undefined))))

  const recordServer = (pid: number) =>
    attempt("cannot update the lock", async () => {
      const next = render({ holder, server: procOf(pid) })
      await writeFile(staging, next)
      await rename(staging, lockFile)
      ours = next
    }).pipe(Effect.asVoid)

  // Released only if still ours: never delete a lock another process has taken over.
  const release = Effect.promise(async () => {
    try {
      if ((await readFile(lockFile, "utf8")) === ours) await unlink(lockFile)
    } catch {
      // already gone
    }
  })

  return Effect.acquireRelease(acquire, () => release).pipe(Effect.as({ recordServer }))
}

/**
 * Locks the data folder, then starts nats-server on its store; released in reverse order (server
 * stopped, then lock removed) when the scope closes.
 */
export const make: Effect.Effect<
  NatsProcess.NatsProcess,
  AlreadyRunning | LockError | NatsProcess.NatsProcessError,
  Scope.Scope | LocalNatsSettings
> = Effect.gen(function* () {
  const settings = yield* LocalNatsSettings.Tag
  const dataLock = yield* lock(settings.dataDir)
  const storeKey = yield* storeKeyOf(settings)
  const server = yield* NatsProcess.start({
    storeKey,
    storeDir: join(settings.dataDir, "nats"),
    host: settings.host,
    port: settings.port,
    syncAlways: true,
    serverName: "hangar-local",
  })
  yield* dataLock.recordServer(server.pid)
  yield* Effect.logInfo("local nats-server started").pipe(
    Effect.annotateLogs({ url: server.url, pid: server.pid, storeDir: server.storeDir }),
  )
  return server
})

/** A store key shorter than this is refused (a typo, an empty file). */
export const storeKeyMinBytes = 32

/**
 * The store's key: `HANGAR_NATS_STORE_KEY`, else `<dataDir>/nats-store.key` (made once, 0600). At
 * least 32 bytes either way; the error never shows the key. The variable is taken out of this
 * process's environment once read, so no child (lxcfs, qemu, a tool) inherits it.
 */
const storeKeyOf = (settings: LocalNatsSettingsShape) =>
  Effect.gen(function* () {
    const refuse = (message: string) => new NatsProcess.NatsProcessError({ message, stderr: "" })
    const fromEnv = Redacted.value(settings.storeKey)
    delete process.env.HANGAR_NATS_STORE_KEY
    if (fromEnv.length > 0) {
      if (Buffer.byteLength(fromEnv) < storeKeyMinBytes)
        return yield* refuse(`HANGAR_NATS_STORE_KEY must be at least ${storeKeyMinBytes} bytes`)
      return settings.storeKey
    }
    const file = join(settings.dataDir, "nats-store.key")
    const bytes = yield* Effect.tryPromise({
      try: () => readOrCreate(file, () => randomBytes(32)),
      catch: (e) => refuse(`cannot read or make the store key ${file}: ${String(e)}`),
    })
    if (bytes.byteLength < storeKeyMinBytes)
      return yield* refuse(
        `the store key ${file} must be at least ${storeKeyMinBytes} bytes (it has ${bytes.byteLength})`,
      )
    return Redacted.make(bytes.toString("hex"))
  })

/** The identifier of the settings Tag, for requirement types. */
export type LocalNatsSettings = Context.Tag.Identifier<typeof LocalNatsSettings.Tag>

/** The local server as a layer. */
export const layer: Layer.Layer<
  LocalNats,
  AlreadyRunning | LockError | NatsProcess.NatsProcessError,
  LocalNatsSettings
> = Layer.scoped(LocalNats, make)

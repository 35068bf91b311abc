import { type ChildProcess, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { existsSync, readFileSync, statSync } from "node:fs"
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { jetstream, jetstreamManager } from "@nats-io/jetstream"
import { connect } from "@nats-io/transport-node"
import { ConfigProvider, Effect, Exit, Redacted, Scope } from "effect"
import { filesHolding } from "../test/harness/files.ts"
import { alive } from "../test/harness/NatsServer.ts"
import * as LocalNats from "./LocalNats.ts"
import * as NatsProcess from "./NatsProcess.ts"
import { dataDir as defaultDataDir } from "./tools.mjs"

/** Stores `text` as the first message of a new stream `name`. */
const publish = (url: string, name: string, text: string) =>
  Effect.promise(async () => {
    const nc = await connect({ servers: url })
    try {
      await (await jetstreamManager(nc)).streams.add({ name, subjects: [`${name.toLowerCase()}.>`] })
      await jetstream(nc).publish(`${name.toLowerCase()}.a`, text)
    } finally {
      await nc.close()
    }
  })

const firstMessage = (url: string, name: string) =>
  Effect.promise(async () => {
    const nc = await connect({ servers: url })
    try {
      const m = await (await jetstreamManager(nc)).streams.getMessage(name, { seq: 1 })
      return m === null ? undefined : new TextDecoder().decode(m.data)
    } finally {
      await nc.close()
    }
  })

const tempDataDir = Effect.acquireRelease(
  Effect.promise(() => mkdtemp(join(tmpdir(), "hangar-localnats-test-"))),
  (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true })),
)

// Port -1: tests never use the fixed default port.
const start = (dataDir: string) =>
  LocalNats.make.pipe(Effect.provide(LocalNats.LocalNatsSettings.layer({ dataDir, port: -1 })))

const startWith = (dataDir: string, storeKey: string) =>
  LocalNats.make.pipe(
    Effect.provide(
      LocalNats.LocalNatsSettings.layer({ dataDir, port: -1, storeKey: Redacted.make(storeKey) }),
    ),
  )

/** A child process for the life of the scope (killed and awaited on release). */
const child = (command: string, args: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.async<ChildProcess>((resume) => {
      const c = spawn(command, args, { stdio: "ignore" })
      c.once("spawn", () => resume(Effect.succeed(c)))
    }),
    (c) =>
      Effect.async<void>((resume) => {
        if (c.exitCode !== null || c.signalCode !== null) return resume(Effect.void)
        c.once("exit", () => resume(Effect.void))
        c.kill("SIGKILL")
      }),
  )

/** Field 22 of /proc/<pid>/stat, the process's start time. */
const startTimeOf = (pid: number) => {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]
}

/** The pid of a process that has exited. */
const deadPid = Effect.async<number>((resume) => {
  const c = spawn("true", [], { stdio: "ignore" })
  c.once("exit", () => resume(Effect.succeed(c.pid!)))
})

const lockHolder = (dataDir: string) =>
  Effect.promise(() => readFile(LocalNats.lockFileOf(dataDir), "utf8")).pipe(
    Effect.map((content) => Number(content.split("\n")[0])),
  )

describe("LocalNats", () => {
  it.scoped(
    "locks the data folder: a second start fails naming the holder; after release a start works",
    () =>
      Effect.gen(function* () {
        const dataDir = yield* tempDataDir
        const first = yield* Scope.make()
        const server = yield* start(dataDir).pipe(Scope.extend(first))
        expect(server.storeDir).toBe(join(dataDir, "nats"))
        expect(server.url).toBe(`nats://127.0.0.1:${server.port}`)
        expect(existsSync(join(dataDir, "nats"))).toBe(true)
        expect(yield* lockHolder(dataDir)).toBe(process.pid)

        const second = yield* start(dataDir).pipe(Effect.scoped, Effect.flip)
        expect(second._tag).toBe("AlreadyRunning")
        expect(second).toMatchObject({ pid: process.pid, lockFile: join(dataDir, "hangar.lock") })
        expect(second.message).toContain(`already running (pid ${process.pid})`)
        // The refused start left the running server and its lock alone.
        expect(alive(server.pid)).toBe(true)
        expect(yield* lockHolder(dataDir)).toBe(process.pid)

        yield* Scope.close(first, Exit.void)
        expect(alive(server.pid)).toBe(false)
        expect(existsSync(LocalNats.lockFileOf(dataDir))).toBe(false)

        const again = yield* start(dataDir)
        expect(alive(again.pid)).toBe(true)
        expect(yield* lockHolder(dataDir)).toBe(process.pid)
      }),
  )

  it.scoped("refuses a lock held by another live process, naming its pid", () =>
    Effect.gen(function* () {
      const dataDir = yield* tempDataDir
      const other = yield* child("sleep", ["60"])
      // A pid without a start time (an older or hand-written lock) is judged by the pid alone.
      yield* Effect.promise(() => writeFile(LocalNats.lockFileOf(dataDir), `${other.pid}\n`))
      const error = yield* LocalNats.lock(dataDir).pipe(Effect.scoped, Effect.flip)
      expect(error._tag).toBe("AlreadyRunning")
      expect(error).toMatchObject({ pid: other.pid })
      expect(error.message).toContain(`pid ${other.pid}`)
      expect(yield* lockHolder(dataDir)).toBe(other.pid)
    }),
  )

  it.scoped("takes over a stale lock whose process is gone", () =>
    Effect.gen(function* () {
      const dataDir = yield* tempDataDir
      const dead = yield* deadPid
      yield* Effect.promise(() => writeFile(LocalNats.lockFileOf(dataDir), `${dead}\n`))
      const server = yield* start(dataDir)
      expect(alive(server.pid)).toBe(true)
      expect(yield* lockHolder(dataDir)).toBe(process.pid)
    }),
  )

  it.scoped("taking over a stale lock first stops the nats-server its crashed holder left running", () =>
    Effect.gen(function* () {
      const dataDir = yield* tempDataDir
      // The orphan: a real server on the same store, as left by a SIGKILLed `npm start`.
      const orphan = yield* NatsProcess.start({ storeDir: join(dataDir, "nats"), syncAlways: false })
      const dead = yield* deadPid
      yield* Effect.promise(() =>
        writeFile(LocalNats.lockFileOf(dataDir), `${dead}\n\n${orphan.pid}\n${startTimeOf(orphan.pid)}\n`),
      )
      const server = yield* start(dataDir)
      expect(alive(orphan.pid)).toBe(false)
      expect(alive(server.pid)).toBe(true)
      expect(yield* lockHolder(dataDir)).toBe(process.pid)
    }),
  )

  it.scoped("leaves alone a recorded server pid that now belongs to another process", () =>
    Effect.gen(function* () {
      const dataDir = yield* tempDataDir
      const bystander = yield* child("sleep", ["60"])
      const dead = yield* deadPid
      yield* Effect.promise(() =>
        writeFile(LocalNats.lockFileOf(dataDir), `${dead}\n\n${bystander.pid}\n1\n`),
      )
      yield* LocalNats.lock(dataDir)
      expect(alive(bystander.pid!)).toBe(true)
      expect(yield* lockHolder(dataDir)).toBe(process.pid)
    }),
  )

  it.scoped("takes over a lock whose pid now belongs to a different process (start time differs)", () =>
    Effect.gen(function* () {
      const dataDir = yield* tempDataDir
      yield* Effect.promise(() => writeFile(LocalNats.lockFileOf(dataDir), `${process.pid}\n1\n`))
      yield* LocalNats.lock(dataDir)
      const content = yield* Effect.promise(() => readFile(LocalNats.lockFileOf(dataDir), "utf8"))
      expect(content).toMatch(new RegExp(`^${process.pid}\\n\\d+\\n$`))
      expect(content).not.toBe(`${process.pid}\n1\n`)
    }),
  )

  it.scoped("takes over an unreadable (garbage) lock, and creates a missing data folder", () =>
    Effect.gen(function* () {
      const parent = yield* tempDataDir
      const dataDir = join(parent, "data")
      yield* LocalNats.lock(dataDir)
      expect(yield* lockHolder(dataDir)).toBe(process.pid)
      const other = join(parent, "other")
      yield* Effect.promise(async () => {
        await mkdir(other)
        await writeFile(LocalNats.lockFileOf(other), "not a pid\n")
      })
      yield* LocalNats.lock(other)
      expect(yield* lockHolder(other)).toBe(process.pid)
    }),
  )

  it.scoped(
    "takes any key of 32 bytes or more, config syntax included, and refuses a shorter one without showing it",
    () =>
      Effect.gen(function* () {
        for (const key of ['$HOME "quoted" \\x41 1234; true = $PATH {}', "1".repeat(40), "x".repeat(32)]) {
          const dataDir = yield* tempDataDir
          const first = yield* Scope.make()
          const server = yield* startWith(dataDir, key).pipe(Scope.extend(first))
          yield* publish(server.url, "KEYED", `value-${key.length}`)
          yield* Scope.close(first, Exit.void)
          const again = yield* startWith(dataDir, key)
          expect(yield* firstMessage(again.url, "KEYED")).toBe(`value-${key.length}`)
        }
        // Another key than the store was written with: refused, naming the store, the server stopped.
        const keyed = yield* tempDataDir
        const once = yield* Scope.make()
        const server = yield* startWith(keyed, "a".repeat(40)).pipe(Scope.extend(once))
        yield* publish(server.url, "KEYED", "x")
        yield* Scope.close(once, Exit.void)
        const wrong = yield* startWith(keyed, "b".repeat(40)).pipe(Effect.scoped, Effect.flip)
        expect(wrong.message).toContain(`the store key does not open the store in ${join(keyed, "nats")}`)
        expect(wrong.message).not.toContain("b".repeat(40))
        expect(
          yield* startWith(keyed, "a".repeat(40)).pipe(
            Effect.flatMap((s) => firstMessage(s.url, "KEYED")),
            Effect.scoped,
          ),
        ).toBe("x")
        const short = "s".repeat(31)
        const error = yield* startWith(yield* tempDataDir, short).pipe(Effect.scoped, Effect.flip)
        expect(error.message).toContain("at least 32 bytes")
        expect(error.message).not.toContain(short)
        // A key file too short (an empty one) is refused too.
        const dataDir = yield* tempDataDir
        yield* Effect.promise(() => writeFile(join(dataDir, "nats-store.key"), ""))
        const fromFile = yield* start(dataDir).pipe(Effect.scoped, Effect.flip)
        expect(fromFile.message).toContain("must be at least 32 bytes (it has 0)")
      }),
  )

  it.effect("reads HANGAR_NATS_PORT; defaults to 127.0.0.1:4222 with data in .data/", () =>
    Effect.gen(function* () {
      const read = LocalNats.LocalNatsSettings.Tag.pipe(
        Effect.provide(LocalNats.LocalNatsSettings.layerFromEnv),
      )
      const fromEnv = yield* read.pipe(
        Effect.withConfigProvider(ConfigProvider.fromMap(new Map([["HANGAR_NATS_PORT", "4333"]]))),
      )
      expect(fromEnv).toMatchObject({ dataDir: defaultDataDir, host: "127.0.0.1", port: 4333 })
      const defaults = yield* read.pipe(Effect.withConfigProvider(ConfigProvider.fromMap(new Map())))
      expect(defaults).toMatchObject({ dataDir: defaultDataDir, host: "127.0.0.1", port: 4222 })
      expect(Redacted.value(defaults.storeKey)).toBe("")
      const keyed = yield* read.pipe(
        Effect.withConfigProvider(
          ConfigProvider.fromMap(new Map([["HANGAR_NATS_STORE_KEY", "k".repeat(64)]])),
        ),
      )
      expect(Redacted.value(keyed.storeKey)).toBe("k".repeat(64))
    }),
  )

  it.scoped(
    "encrypts its store: a canary is in no file of the store; the key is the 0600 file's and reads the data back",
    () =>
      Effect.gen(function* () {
        const dataDir = yield* tempDataDir
        const canary = `canary-${randomBytes(8).toString("hex")}`
        // A store first written in clear (as before encryption), then started by LocalNats.
        const plain = yield* Scope.make()
        const orphan = yield* NatsProcess.start({ storeDir: join(dataDir, "nats"), syncAlways: false }).pipe(
          Scope.extend(plain),
        )
        yield* publish(orphan.url, "CLEAR", `${canary}-before`)
        yield* Scope.close(plain, Exit.void)
        expect(
          yield* Effect.promise(() => filesHolding(join(dataDir, "nats"), `${canary}-before`)),
        ).not.toEqual([])

        const first = yield* Scope.make()
        const server = yield* start(dataDir).pipe(Scope.extend(first))
        yield* publish(server.url, "LATER", `${canary}-after`)
        const keyFile = join(dataDir, "nats-store.key")
        expect(statSync(keyFile).mode & 0o777).toBe(0o600)
        expect(readFileSync(keyFile)).toHaveLength(32)
        yield* Scope.close(first, Exit.void)
        expect(yield* Effect.promise(() => filesHolding(dataDir, canary))).toEqual([])

        // The next start finds both messages.
        const again = yield* start(dataDir)
        expect(yield* firstMessage(again.url, "CLEAR")).toBe(`${canary}-before`)
        expect(yield* firstMessage(again.url, "LATER")).toBe(`${canary}-after`)
        // The key never reaches a file but its own: not the config, not the log.
        const key = readFileSync(keyFile).toString("hex")
        expect(yield* Effect.promise(() => filesHolding(dataDir, key))).toEqual([])
        expect(
          yield* Effect.promise(() =>
            filesHolding(tmpdir(), key, (name) => name.startsWith("hangar-nats-run-")),
          ),
        ).toEqual([])
      }),
  )
})

import { spawn, spawnSync } from "node:child_process"
import { existsSync } from "node:fs"
import { mkdtemp, readdir, rm } from "node:fs/promises"
import { connect } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { alive } from "../test/harness/NatsServer.ts"
import * as NatsProcess from "./NatsProcess.ts"

const tempDir = Effect.acquireRelease(
  Effect.promise(() => mkdtemp(join(tmpdir(), "hangar-natsprocess-test-"))),
  (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true })),
)

/**
 * Node arguments for a script that starts a server with `options` (never closing its scope),
 * prints the server's pid, then runs `then`.
 */
const serverScript = (options: NatsProcess.NatsProcessOptions, then: string) => [
  "--import",
  "tsx",
  "--input-type=module",
  "-e",
  [
    'import { Effect, Scope } from "effect"',
    `import * as NatsProcess from ${JSON.stringify(join(import.meta.dirname, "NatsProcess.ts"))}`,
    "const scope = Effect.runSync(Scope.make())",
    `const server = await Effect.runPromise(Scope.extend(NatsProcess.start(${JSON.stringify({ syncAlways: false, ...options })}), scope))`,
    "console.log(server.pid)",
    then,
  ].join("\n"),
]

describe("NatsProcess", () => {
  it.effect("starts on a free port, answers INFO, and is gone after release", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      const storeDir = yield* tempDir.pipe(Scope.extend(scope))
      const server = yield* NatsProcess.start({ storeDir, port: -1 }).pipe(Scope.extend(scope))
      expect(server.port).toBeGreaterThan(0)
      expect(server.url).toBe(`nats://127.0.0.1:${server.port}`)
      expect(alive(server.pid)).toBe(true)
      // The first line a NATS server sends is INFO with its JetStream flag.
      const info = yield* Effect.promise(
        () =>
          new Promise<string>((resolve, reject) => {
            const s = connect({ host: "127.0.0.1", port: server.port })
            s.once("data", (d) => {
              s.destroy()
              resolve(d.toString())
            })
            s.once("error", reject)
          }),
      )
      expect(info.startsWith("INFO ")).toBe(true)
      expect(JSON.parse(info.slice(5)).jetstream).toBe(true)
      yield* Scope.close(scope, Exit.void)
      expect(alive(server.pid)).toBe(false)
    }),
  )

  it.scoped("fails with the server's own message when the port is taken", () =>
    Effect.gen(function* () {
      const first = yield* NatsProcess.start({ storeDir: yield* tempDir, syncAlways: false })
      const error = yield* NatsProcess.start({ storeDir: yield* tempDir, port: first.port }).pipe(Effect.flip)
      expect(error._tag).toBe("NatsProcessError")
      expect(error.message).toContain("exited while starting")
      expect(error.stderr).toContain("address already in use")
      // The cause is in the message itself, which is what a failed test file prints.
      expect(error.message).toContain("address already in use")
    }),
  )

  it.scoped("fails with advice when the binary does not exist", () =>
    Effect.gen(function* () {
      const error = yield* NatsProcess.start({
        storeDir: yield* tempDir,
        binary: "/nonexistent/nats-server",
      }).pipe(Effect.flip)
      expect(error.message).toContain("cannot spawn /nonexistent/nats-server")
    }),
  )

  it("renders sync_interval always by default and omits it when turned off", () => {
    const base = { storeDir: "/s", host: "127.0.0.1", port: -1, portsFileDir: "/p" }
    expect(NatsProcess.renderConfig({ ...base, syncAlways: true })).toContain("sync_interval: always")
    expect(NatsProcess.renderConfig({ ...base, syncAlways: false })).not.toContain("sync_interval")
    expect(NatsProcess.renderConfig({ ...base, syncAlways: true })).toContain('store_dir: "/s"')
    expect(NatsProcess.renderConfig({ ...base, syncAlways: true })).not.toContain("cipher")
    // Encrypted: the key is a variable of the server's environment, never written in the config.
    const encrypted = NatsProcess.renderConfig({ ...base, syncAlways: true, encrypted: true })
    expect(encrypted).toContain("  cipher: aes\n")
    expect(encrypted).toContain(`  key: $${NatsProcess.storeKeyVariable}\n`)
  })

  it.scoped("writes the store under the given directory", () =>
    Effect.gen(function* () {
      const storeDir = yield* tempDir
      yield* NatsProcess.start({ storeDir, syncAlways: false })
      const entries = yield* Effect.promise(() => readdir(storeDir))
      expect(entries).toContain("jetstream")
    }),
  )

  it.scoped("a process that exits without closing the scope takes its server with it", () =>
    Effect.gen(function* () {
      const storeDir = yield* tempDir
      // A script that starts a server, prints its pid, and exits at once (as a script's
      // `process.exit` or a test worker at its timeout would), never closing the scope.
      const child = spawnSync(process.execPath, serverScript({ storeDir }, "process.exit(0)"), {
        cwd: join(import.meta.dirname, ".."),
        encoding: "utf8",
      })
      const pid = Number(child.stdout.trim())
      expect(pid, child.stderr).toBeGreaterThan(0)
      // SIGKILL is delivered at once; the server is gone (or a zombie reaped by init) right after.
      const gone = yield* Effect.promise(async () => {
        for (let i = 0; i < 100 && alive(pid); i++) await new Promise((r) => setTimeout(r, 20))
        return !alive(pid)
      })
      expect(gone).toBe(true)
    }),
  )

  it.scoped("a process killed outright takes its server and the folders it named with it", () =>
    Effect.gen(function* () {
      const storeDir = yield* tempDir
      // A script that starts a server, prints its pid, and waits; it is then SIGKILLed, so no exit
      // hook runs: the watchdog is what stops the server and removes the folders.
      const child = spawn(
        process.execPath,
        serverScript({ storeDir, removeOnCrash: [storeDir] }, "setInterval(() => undefined, 1000)"),
        { cwd: join(import.meta.dirname, ".."), stdio: ["ignore", "pipe", "inherit"] },
      )
      yield* Effect.addFinalizer(() => Effect.sync(() => child.kill("SIGKILL")))
      const pid = yield* Effect.promise(
        () =>
          new Promise<number>((resolve, reject) => {
            child.stdout.once("data", (d: Buffer) => resolve(Number(d.toString().trim())))
            child.once("exit", (code) => reject(new Error(`the script exited with ${code}`)))
          }),
      )
      expect(alive(pid)).toBe(true)
      expect(existsSync(storeDir)).toBe(true)
      child.kill("SIGKILL")
      // SIGTERM from the watchdog: the server shuts down in well under its 5 s grace.
      const cleaned = yield* Effect.promise(async () => {
        for (let i = 0; i < 300 && (alive(pid) || existsSync(storeDir)); i++)
          await new Promise((r) => setTimeout(r, 50))
        return { alive: alive(pid), store: existsSync(storeDir) }
      })
      expect(cleaned).toEqual({ alive: false, store: false })
    }),
  )
})

import { spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Redacted } from "effect"
import * as MasterKey from "./MasterKey.ts"

const tempDir = Effect.acquireRelease(
  Effect.promise(() => mkdtemp(join(tmpdir(), "hangar-masterkey-test-"))),
  (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true })),
)

const load = (file: string) => MasterKey.loadFile(file).pipe(Effect.map(MasterKey.fromKey))

const fromSettings = (settings: Partial<typeof MasterKey.MasterKeySettings.defaults>) =>
  MasterKey.MasterKey.pipe(
    Effect.provide(MasterKey.layer),
    Effect.provide(MasterKey.MasterKeySettings.layer(settings)),
  )

const dataKey = randomBytes(32)

// True when `b` opens what `a` wrapped: the two services hold the same key.
const sameKey = (a: MasterKey.MasterKeyService, b: MasterKey.MasterKeyService) =>
  Effect.gen(function* () {
    const wrapped = yield* a.wrap(dataKey, "datakey:acc_x")
    const opened = yield* Effect.either(b.unwrap(wrapped, "datakey:acc_x"))
    return Either.isRight(opened) && Buffer.from(opened.right).equals(dataKey)
  })

describe("MasterKey (local file)", () => {
  it.scoped("creates a 32-byte 0600 file on first start, reuses it after, leaves no temp file", () =>
    Effect.gen(function* () {
      const dir = yield* tempDir
      const file = join(dir, "nested", "master.key")
      const first = yield* fromSettings({ file })
      const info = yield* Effect.promise(() => stat(file))
      expect(info.size).toBe(32)
      expect(info.mode & 0o777).toBe(0o600)
      const bytes = yield* Effect.promise(() => readFile(file))
      const second = yield* fromSettings({ file })
      expect(yield* sameKey(first, second)).toBe(true)
      expect((yield* Effect.promise(() => readFile(file))).equals(bytes)).toBe(true)
      expect(yield* Effect.promise(() => readdir(join(dir, "nested")))).toEqual(["master.key"])
    }),
  )

  it.scoped("concurrent first starts in one process agree on one key", () =>
    Effect.gen(function* () {
      const dir = yield* tempDir
      const file = join(dir, "master.key")
      const services = yield* Effect.all(
        Array.from({ length: 8 }, () => load(file)),
        { concurrency: "unbounded" },
      )
      const reference = yield* load(file)
      for (const s of services) expect(yield* sameKey(s, reference)).toBe(true)
      expect(yield* Effect.promise(() => readdir(dir))).toEqual(["master.key"])
    }),
  )

  it.scoped("concurrent first starts in separate processes agree on one key", () =>
    Effect.gen(function* () {
      const dir = yield* tempDir
      const file = join(dir, "master.key")
      const module = fileURLToPath(new URL("./MasterKey.ts", import.meta.url))
      // Each child loads (or creates) the key and prints a data key wrapped with it.
      const script = `
        import { Effect } from "effect"
        import * as MasterKey from ${JSON.stringify(module)}
        const m = await Effect.runPromise(MasterKey.loadFile(${JSON.stringify(file)}).pipe(Effect.map(MasterKey.fromKey)))
        const w = await Effect.runPromise(m.wrap(Buffer.from(${JSON.stringify(dataKey.toString("hex"))}, "hex"), "child"))
        process.stdout.write(Buffer.from(w).toString("hex"))
      `
      const child = () =>
        Effect.async<string, Error>((resume) => {
          const proc = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
            cwd: fileURLToPath(new URL("..", import.meta.url)),
            stdio: ["ignore", "pipe", "pipe"],
          })
          let out = ""
          let err = ""
          proc.stdout.on("data", (d: Buffer) => {
            out += d.toString()
          })
          proc.stderr.on("data", (d: Buffer) => {
            err += d.toString()
          })
          proc.on("exit", (code) =>
            resume(code === 0 ? Effect.succeed(out) : Effect.fail(new Error(`child exited ${code}: ${err}`))),
          )
          return Effect.sync(() => proc.kill("SIGKILL"))
        })
      const outputs = yield* Effect.all([child(), child(), child(), child()], { concurrency: "unbounded" })
      const reference = yield* load(file)
      for (const hex of outputs) {
        const opened = yield* reference.unwrap(Buffer.from(hex, "hex"), "child")
        expect(Buffer.from(opened).equals(dataKey)).toBe(true)
      }
      expect(yield* Effect.promise(() => readdir(dir))).toEqual(["master.key"])
    }),
  )

  it.scoped("a file of the wrong length is refused, not padded or replaced", () =>
    Effect.gen(function* () {
      const dir = yield* tempDir
      for (const length of [0, 31, 33, 64]) {
        const file = join(dir, `short-${length}.key`)
        yield* Effect.promise(() => writeFile(file, randomBytes(length), { mode: 0o600 }))
        const error = yield* Effect.flip(fromSettings({ file }))
        expect(error._tag).toBe("MasterKeyInvalid")
        expect(error.message).toContain(`found ${length}`)
        expect((yield* Effect.promise(() => readFile(file))).byteLength).toBe(length)
      }
      const exact = join(dir, "exact.key")
      yield* Effect.promise(() => writeFile(exact, randomBytes(32), { mode: 0o600 }))
      yield* fromSettings({ file: exact })
    }),
  )

  it.scoped("an unreadable path is MasterKeyUnavailable", () =>
    Effect.gen(function* () {
      const dir = yield* tempDir
      const error = yield* Effect.flip(fromSettings({ file: dir })) // a directory
      expect(error._tag).toBe("MasterKeyUnavailable")
    }),
  )
})

describe("MasterKey (env key)", () => {
  it.scoped("HANGAR_MASTER_KEY (base64 of 32 bytes) wins over the file; other lengths are refused", () =>
    Effect.gen(function* () {
      const dir = yield* tempDir
      const file = join(dir, "master.key")
      const raw = randomBytes(32)
      const a = yield* fromSettings({ file, key: Redacted.make(raw.toString("base64")) })
      const b = MasterKey.fromKey((yield* Effect.promise(() => import("node:crypto"))).createSecretKey(raw))
      expect(yield* sameKey(a, b)).toBe(true)
      expect(yield* Effect.promise(() => readdir(dir))).toEqual([])
      const error = yield* Effect.flip(
        fromSettings({ file, key: Redacted.make(randomBytes(31).toString("base64")) }),
      )
      expect(error._tag).toBe("MasterKeyInvalid")
      expect(error.message).toContain("HANGAR_MASTER_KEY")
    }),
  )
})

describe("MasterKey wrap/unwrap", () => {
  it.effect("unwrap fails with DecryptFailed for another aad, another key, or altered bytes", () =>
    Effect.gen(function* () {
      const a = yield* MasterKey.MasterKey.pipe(Effect.provide(MasterKey.layerMemory()))
      const b = yield* MasterKey.MasterKey.pipe(Effect.provide(MasterKey.layerMemory()))
      const wrapped = yield* a.wrap(dataKey, "datakey:acc_1")
      expect(Buffer.from(wrapped).includes(dataKey)).toBe(false)
      expect(Buffer.from(yield* a.unwrap(wrapped, "datakey:acc_1")).equals(dataKey)).toBe(true)
      const failures = [
        a.unwrap(wrapped, "datakey:acc_2"),
        b.unwrap(wrapped, "datakey:acc_1"),
        a.unwrap(wrapped.subarray(0, wrapped.byteLength - 1), "datakey:acc_1"),
        a.unwrap(new Uint8Array(0), "datakey:acc_1"),
      ]
      for (let i = 0; i < wrapped.byteLength; i++) {
        const bad = Uint8Array.from(wrapped)
        bad[i]! ^= 0x01
        failures.push(a.unwrap(bad, "datakey:acc_1"))
      }
      for (const f of failures) expect((yield* Effect.flip(f))._tag).toBe("DecryptFailed")
    }),
  )
})

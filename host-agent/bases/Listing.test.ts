import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { BaseInfo } from "../../schema/Base.ts"
import { type HostRecord, HostRecord as HostRecordSchema } from "../../schema/Host.ts"
import { type Recipe, recipeHash, slimRecipePath } from "./Bases.ts"
import * as Listing from "./Listing.ts"

const sha = (c: string) => c.repeat(64)
const base = (name: string, c = "a", bytes = 1000) =>
  Schema.decodeSync(BaseInfo)({ name, sha256: sha(c), bytes })

const host = (id: string, bases: ReadonlyArray<BaseInfo>): HostRecord =>
  Schema.decodeSync(HostRecordSchema)({
    id,
    driver: "namespace",
    vcpus: 14,
    memory_mib: 16384,
    bases,
    started_at: "2026-01-01T00:00:00.000Z",
    heartbeat_at: "2026-01-01T00:00:00.000Z",
    machines: [],
    free_vcpus: 14,
    free_memory_mib: 16384,
  })

/** A temporary bases folder, removed with the scope. */
const tempDir = Effect.acquireRelease(
  Effect.promise(() => mkdtemp(join(tmpdir(), "hangar-bases-"))),
  (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true })),
)

const putBase = (dir: string, folder: string, meta: object) =>
  Effect.promise(async () => {
    await mkdir(join(dir, folder, "rootfs"), { recursive: true })
    await writeFile(join(dir, folder, "base.json"), JSON.stringify(meta))
  })

describe("bases listing", () => {
  it.scoped(
    "onDisk lists finished bases as {name, sha256, bytes}; invalid or unfinished ones are left out",
    () =>
      Effect.gen(function* () {
        const dir = yield* tempDir
        const good = { name: "debian-bookworm-20260101-0123456789ab", sha256: sha("b"), bytes: 42 }
        yield* putBase(dir, good.name, good)
        yield* putBase(dir, "hand-made", { name: "hand-made", sha256: sha("c"), bytes: 1 })
        yield* Effect.promise(() => mkdir(join(dir, "debian-trixie-20260101-0123456789ab"))) // no base.json yet
        yield* Effect.promise(() => mkdir(join(dir, ".build-x")))
        expect(yield* Listing.onDisk(dir)).toEqual([good])
        expect(yield* Listing.onDisk(join(dir, "missing"))).toEqual([])
      }),
  )

  it("listBases: the union over hosts, one item per name, newest date first, then by name", () => {
    const older = base("debian-bookworm-20250101-aaaaaaaaaaaa")
    const newerB = base("debian-bookworm-20260301-bbbbbbbbbbbb")
    const newerT = base("debian-trixie-20260301-cccccccccccc")
    const newest = base("debian-trixie-20260402-dddddddddddd")
    const listed = Listing.listBases([
      host("h1", [older, newerT]),
      host("h2", [newerT, newest, newerB]),
      host("h3", []),
    ])
    expect(listed.map((b) => b.name)).toEqual([newest.name, newerB.name, newerT.name, older.name])
    expect(listed[0]).toEqual({ name: newest.name, sha256: newest.sha256, bytes: newest.bytes })
    expect(Listing.listBases([])).toEqual([])
  })
})

describe("full base recipes", () => {
  const readRecipe = async (path: string) => JSON.parse(await readFile(path, "utf8")) as Recipe
  const recipe = (name: string) => readRecipe(join(slimRecipePath, "..", `${name}.json`))

  it.effect("parse, name their release, carry the spec's tools, and hash differently from slim", () =>
    Effect.gen(function* () {
      const slim = yield* Effect.promise(() => readRecipe(slimRecipePath))
      const bookworm = yield* Effect.promise(() => recipe("debian-bookworm-full"))
      const trixie = yield* Effect.promise(() => recipe("debian-trixie-full"))
      expect([bookworm.distro, bookworm.release]).toEqual(["debian", "bookworm"])
      expect([trixie.distro, trixie.release]).toEqual(["debian", "trixie"])
      for (const r of [bookworm, trixie]) {
        for (const p of [
          "python3",
          "git",
          "curl",
          "jq",
          "ripgrep",
          "xz-utils",
          "zstd",
          "chromium",
          "openssh-client",
          "xvfb",
          "imagemagick",
        ])
          expect(r.packages).toContain(p)
        expect(r.mirrors.every((m) => m.includes(` ${r.release} `))).toBe(true)
      }
      // Both start the display and capture it to /tmp/screen.png; only the newer one sets a wallpaper.
      for (const r of [bookworm, trixie]) {
        expect(r.hooks?.some((h) => h.includes("Xvfb :99 -screen 0 1440x900x24"))).toBe(true)
        expect(r.hooks?.some((h) => h.includes("/tmp/screen.png"))).toBe(true)
      }
      expect(trixie.hooks?.some((h) => h.includes("wallpaper.png"))).toBe(true)
      expect(bookworm.hooks?.some((h) => h.includes("wallpaper"))).toBe(false)
      const hashes = new Set([recipeHash(slim), recipeHash(bookworm), recipeHash(trixie)])
      expect(hashes.size).toBe(3)
      const name = `debian-bookworm-20260101-${recipeHash(bookworm)}`
      expect(Schema.is(BaseInfo)({ name, sha256: sha("e"), bytes: 1 })).toBe(true)
    }),
  )
})

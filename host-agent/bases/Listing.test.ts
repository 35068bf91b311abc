import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { BaseInfo } from "../../schema/Base.ts"
import { buildingBases, type HostRecord, HostRecord as HostRecordSchema } from "../../schema/Host.ts"
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
    "onDisk lists finished bases of the host's recipes as {name, sha256, bytes}; invalid, unfinished or other ones are left out",
    () =>
      Effect.gen(function* () {
        const dir = yield* tempDir
        const good = { name: "debian-bookworm-20260101-0123456789ab", sha256: sha("b"), bytes: 42 }
        yield* putBase(dir, good.name, { ...good, recipe: "full" })
        yield* putBase(dir, "debian-bookworm-20260101-aaaaaaaaaaaa", {
          name: "debian-bookworm-20260101-aaaaaaaaaaaa",
          sha256: sha("d"),
          bytes: 1,
          recipe: "slim",
        })
        yield* putBase(dir, "hand-made", { name: "hand-made", sha256: sha("c"), bytes: 1, recipe: "full" })
        yield* Effect.promise(() => mkdir(join(dir, "debian-trixie-20260101-0123456789ab"))) // no base.json yet
        yield* Effect.promise(() => mkdir(join(dir, ".build-x")))
        expect(yield* Listing.onDisk(dir, ["full"])).toEqual([good])
        expect(yield* Listing.onDisk(join(dir, "missing"), ["full"])).toEqual([])
        // A base built before the recipe was recorded counts by the current recipe's name and hash.
        const slim = yield* Effect.promise(
          async () => JSON.parse(await readFile(slimRecipePath, "utf8")) as Recipe,
        )
        const old = { name: `debian-bookworm-20250101-${recipeHash(slim)}`, sha256: sha("e"), bytes: 7 }
        yield* putBase(dir, old.name, old)
        expect(yield* Listing.onDisk(dir, ["debian-bookworm-slim"])).toEqual([old])
        expect(yield* Listing.onDisk(dir, ["full"])).toEqual([good])
      }),
  )

  it.scoped("buildingIn names the live builds of the host's recipes; a dead builder's lock is not one", () =>
    Effect.gen(function* () {
      const dir = yield* tempDir
      const lock = (hash: string, owner: object) =>
        Effect.promise(async () => {
          await mkdir(join(dir, `.lock-${hash}`))
          await writeFile(join(dir, `.lock-${hash}`, "owner.json"), JSON.stringify(owner))
        })
      const live = "debian-trixie-20260101-0123456789ab"
      yield* lock("0123456789ab", { name: live, recipe: "full", pid: process.pid, started: 0 })
      yield* lock("aaaaaaaaaaaa", {
        name: "debian-bookworm-20260101-aaaaaaaaaaaa",
        recipe: "slim",
        pid: process.pid,
        started: 0,
      })
      // pid_max is at most 2^22: no process has this id.
      yield* lock("bbbbbbbbbbbb", {
        name: "debian-bookworm-20260101-bbbbbbbbbbbb",
        recipe: "full",
        pid: 2 ** 23,
        started: 0,
      })
      expect(yield* Listing.buildingIn(dir, ["full"])).toEqual([live])
    }),
  )

  it("listBases: the union over hosts, one item per name, newest date first, then newer release, then by name", () => {
    const older = base("debian-bookworm-20250101-aaaaaaaaaaaa")
    const newerB = base("debian-bookworm-20260301-bbbbbbbbbbbb")
    const newerT = base("debian-trixie-20260301-cccccccccccc")
    const newest = base("debian-trixie-20260402-dddddddddddd")
    const listed = Listing.listBases([
      host("h1", [older, newerT]),
      host("h2", [newerT, newest, newerB]),
      host("h3", []),
    ])
    expect(listed.map((b) => b.name)).toEqual([newest.name, newerT.name, newerB.name, older.name])
    expect(listed[0]).toEqual({ name: newest.name, sha256: newest.sha256, bytes: newest.bytes })
    expect(Listing.listBases([])).toEqual([])
    // Built the same day (a host's first start): the newer release first, unknown ones after by name.
    const sameDay = ["debian-bookworm", "debian-trixie", "other-sid", "alpine-edge"].map((r) =>
      base(`${r}-20260501-eeeeeeeeeeee`),
    )
    expect(Listing.listBases([host("h1", sameDay)]).map((b) => b.name)).toEqual([
      "debian-trixie-20260501-eeeeeeeeeeee",
      "debian-bookworm-20260501-eeeeeeeeeeee",
      "alpine-edge-20260501-eeeeeeeeeeee",
      "other-sid-20260501-eeeeeeeeeeee",
    ])
  })

  it("buildingBases: what live hosts build and none has finished, newest first", () => {
    const done = base("debian-trixie-20260301-cccccccccccc")
    const withBuilds = (id: string, bases: ReadonlyArray<BaseInfo>, building: ReadonlyArray<string>) =>
      Schema.decodeSync(HostRecordSchema)({ ...host(id, bases), building })
    const listed = buildingBases([
      withBuilds("h1", [], ["debian-bookworm-20260301-aaaaaaaaaaaa", done.name]),
      withBuilds("h2", [done], ["debian-trixie-20260402-dddddddddddd"]),
      host("h3", []),
    ])
    expect(listed).toEqual(["debian-trixie-20260402-dddddddddddd", "debian-bookworm-20260301-aaaaaaaaaaaa"])
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

/**
 * The host's background base builder (`Builder.ts`) as `npm start` runs it on a first start: real
 * mmdebstrap builds from Debian's archive into a fresh cache folder, the steps logged as they come,
 * the base found at once on the next start; a recipe whose mirror cannot be reached fails, is logged
 * with a retry, and leaves nothing half-built in the cache.
 */
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Layer, Logger, Scope } from "effect"
import { afterAll, expect, it } from "vitest"
import { BasesSettings, find, recipePathOf } from "./Bases.ts"
import * as Builder from "./Builder.ts"

const dirs: Array<string> = []
const fresh = (label: string) => {
  const dir = mkdtempSync(join(tmpdir(), `hangar-builder-${label}-`))
  dirs.push(dir)
  return dir
}

afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true })
})

/** Starts the builder for `recipes` in `dir`; answers its log lines (as they come) and a stop. */
const start = async (dir: string, recipes: ReadonlyArray<string>) => {
  const lines: Array<string> = []
  const logger = Logger.make(({ message }) => {
    lines.push((Array.isArray(message) ? message : [message]).map(String).join(" "))
  })
  const scope = Effect.runSync(Scope.make())
  await Effect.runPromise(
    Layer.buildWithScope(
      Builder.layer.pipe(
        Layer.provide(BasesSettings.layer({ dir, recipes })),
        Layer.provide(Logger.replace(Logger.defaultLogger, logger)),
      ),
      scope,
    ),
  )
  return { lines, stop: () => Effect.runPromise(Scope.close(scope, Exit.void)) }
}

const until = async (check: () => boolean, what: () => string, ms: number) => {
  const deadline = Date.now() + ms
  while (!check()) {
    if (Date.now() > deadline) throw new Error(what())
    await new Promise((r) => setTimeout(r, 250))
  }
}

it(
  "builds a missing base in the background with its steps logged; the next start finds it at once",
  async () => {
    const dir = fresh("ok")
    const slim = "debian-bookworm-slim"
    const first = await start(dir, [slim])
    try {
      await until(
        () => first.lines.includes("base built"),
        () => `no "base built" in:\n${first.lines.join("\n")}`,
        10 * 60_000,
      )
    } finally {
      await first.stop()
    }
    expect(first.lines[0]).toMatch(/^building a base in the background/)
    expect(first.lines.filter((l) => l.startsWith("base build: ")).length).toBeGreaterThan(2)
    const base = await Effect.runPromise(find(dir, recipePathOf(slim)))
    expect(base?.name).toMatch(/^debian-bookworm-\d{8}-[0-9a-f]+$/)
    // Only the base's own folder is left (no temporary build folder, no lock).
    expect(readdirSync(dir)).toEqual([base?.name])

    const second = await start(dir, [slim])
    await new Promise((r) => setTimeout(r, 1_000))
    await second.stop()
    expect(second.lines).toEqual([])
  },
  12 * 60_000,
)

it(
  "a build that fails is logged with its retry and leaves nothing in the cache",
  async () => {
    const dir = fresh("fail")
    const recipe = join(fresh("recipe"), "unreachable.json")
    writeFileSync(
      recipe,
      JSON.stringify({
        distro: "debian",
        release: "bookworm",
        variant: "minbase",
        // Nothing listens on port 9 of loopback: the download fails at once, offline or not.
        mirrors: ["deb http://127.0.0.1:9/debian bookworm main"],
        packages: ["bash"],
      }),
    )
    const builder = await start(dir, [recipe])
    try {
      await until(
        () => builder.lines.includes("base build failed; trying again later"),
        () => `no failure logged in:\n${builder.lines.join("\n")}`,
        5 * 60_000,
      )
    } finally {
      await builder.stop()
    }
    expect(readdirSync(dir)).toEqual([])
  },
  6 * 60_000,
)

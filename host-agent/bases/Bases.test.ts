import { readFile } from "node:fs/promises"
import { Effect } from "effect"
import { beforeAll, expect, it } from "vitest"
import {
  type Base,
  BasesSettings,
  ensure,
  ensureTestBase,
  list,
  recipeHash,
  slimRecipePath,
} from "./Bases.ts"

let base: Base
beforeAll(async () => {
  base = await ensureTestBase()
}, 15 * 60_000)

it("names a base <distro>-<release>-<date>-<recipe hash>, finds it again, and lists it", async () => {
  const recipe = JSON.parse(await readFile(slimRecipePath, "utf8"))
  expect(base.name).toMatch(new RegExp(`^debian-bookworm-\\d{8}-${recipeHash(recipe)}$`))
  expect(base.sha256).toMatch(/^[0-9a-f]{64}$/)
  expect(base.bytes).toBeGreaterThan(0)
  // Asking again reuses the finished base rather than building another.
  expect(await Effect.runPromise(ensure(BasesSettings.defaults.dir, slimRecipePath))).toEqual(base)
  const listed = await Effect.runPromise(list(BasesSettings.defaults.dir))
  expect(listed).toContainEqual(base)
  // A different recipe has a different hash, so it is never mistaken for this base.
  expect(recipeHash({ ...recipe, packages: [...recipe.packages, "vim"] })).not.toBe(recipeHash(recipe))
})

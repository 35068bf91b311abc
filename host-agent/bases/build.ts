/**
 * Builds a base from a recipe once: `node --import tsx host-agent/bases/build.ts <recipe>`, where
 * `<recipe>` is a name in `deploy/bases/` (e.g. `debian-bookworm-slim`) or a path to a recipe.
 * Prints the finished base's listing item; a base already built from the same recipe is reused.
 */
import { Effect } from "effect"
import { BasesSettings, ensure, recipePathOf } from "./Bases.ts"

const arg = process.argv[2]
if (!arg) {
  process.stderr.write("usage: build.ts <recipe name or path>\n")
  process.exit(2)
}
const program = Effect.gen(function* () {
  const settings = yield* BasesSettings.Tag
  const started = Date.now()
  const base = yield* ensure(settings.dir, recipePathOf(arg), (line) => process.stderr.write(`${line}\n`))
  process.stdout.write(`${JSON.stringify({ ...base, seconds: (Date.now() - started) / 1000 })}\n`)
})
Effect.runPromise(program.pipe(Effect.provide(BasesSettings.layerFromEnv))).catch((e) => {
  process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`)
  process.exit(1)
})

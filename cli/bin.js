#!/usr/bin/env node
// The `hangar` command. The project runs TypeScript directly (no build step), so a user's command
// would pay tsx's compile at every start. Instead the user CLI (`cli/user/`) is bundled by esbuild
// into `.tools/cli/` the first time it runs after a change to its sources (a few stats tell), and
// started from there; each command's code is its own chunk, loaded only when that command runs.
// `serve` and `admin` (the service itself) and any failure to bundle go through tsx as before.
import { mkdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
const command = process.argv[2]

/** The bundle's entry when it is newer than every source it was made from, else undefined. */
const fresh = (dir) => {
  try {
    const made = JSON.parse(readFileSync(join(dir, "inputs.json"), "utf8"))
    const at = statSync(join(dir, "main.mjs")).mtimeMs
    for (const input of made.inputs) if (statSync(join(root, input)).mtimeMs > at) return undefined
    return join(dir, "main.mjs")
  } catch {
    return undefined
  }
}

/** Bundles the user CLI into `dir` (a fresh folder swapped in whole); answers its entry. */
const bundle = async (dir) => {
  const { build } = await import("esbuild")
  const temporary = `${dir}.${process.pid}.tmp`
  rmSync(temporary, { recursive: true, force: true })
  const result = await build({
    entryPoints: { main: join(root, "cli", "user", "main.ts") },
    outdir: temporary,
    outExtension: { ".js": ".mjs" },
    bundle: true,
    splitting: true,
    format: "esm",
    platform: "node",
    target: "node20",
    packages: "external",
    metafile: true,
    logLevel: "silent",
    define: {
      HANGAR_VERSION: JSON.stringify(JSON.parse(readFileSync(join(root, "package.json"), "utf8")).version),
    },
  })
  const inputs = [...Object.keys(result.metafile.inputs), "package.json"]
  writeFileSync(join(temporary, "inputs.json"), JSON.stringify({ inputs }))
  rmSync(dir, { recursive: true, force: true })
  renameSync(temporary, dir)
  return join(dir, "main.mjs")
}

const user = async () => {
  const dir = join(process.env.HANGAR_TOOLS_DIR ?? join(root, ".tools"), "cli")
  let entry = fresh(dir)
  if (entry === undefined) {
    try {
      mkdirSync(dirname(dir), { recursive: true })
      entry = await bundle(dir)
    } catch {
      return false
    }
  }
  const { main } = await import(pathToFileURL(entry).href)
  const status = await main(process.argv.slice(2))
  process.stdout.write("", () => process.exit(status))
  return true
}

if (command === "serve" || command === "admin" || !(await user())) {
  const { register } = await import("tsx/esm/api")
  register()
  await import("./main.ts")
}

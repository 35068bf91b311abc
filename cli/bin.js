#!/usr/bin/env node
// The `hangar` command. The project runs TypeScript directly (no build step), so a user's command
// would pay tsx's compile at every start. Instead the user CLI (`cli/user/`) is bundled by esbuild
// into `.tools/cli/` the first time it runs after a change to its sources (a few stats tell), and
// started from there; each command's code is its own chunk, loaded only when that command runs.
// `serve` and `admin` (the service itself) and any failure to bundle go through tsx as before.
//
// Each bundle is a folder of its own, never changed; `.tools/cli/current` names the newest (written
// whole and renamed into place), so processes bundling at once, or a process still loading chunks
// of an older bundle, never see a half-made or removed folder. Bundles an hour older than the
// current one are removed by the next bundling.
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"

// Node 20.15 or later (package.json `engines`): the folder upload builds its gzip members with
// `zlib.crc32`. Said at once, not as a crash mid-upload.
const [major, minor] = process.versions.node.split(".").map(Number)
if (major < 20 || (major === 20 && minor < 15)) {
  process.stderr.write(`hangar needs Node.js 20.15 or later; this is ${process.version}\n`)
  process.exit(1)
}

const root = join(dirname(fileURLToPath(import.meta.url)), "..")
const command = process.argv[2]
const home = join(process.env.HANGAR_TOOLS_DIR ?? join(root, ".tools"), "cli")
const pointer = join(home, "current")

/** The current bundle's entry when it is newer than every source it was made from, else undefined. */
const fresh = () => {
  try {
    const dir = join(home, readFileSync(pointer, "utf8").trim())
    const made = JSON.parse(readFileSync(join(dir, "inputs.json"), "utf8"))
    const at = statSync(join(dir, "main.mjs")).mtimeMs
    for (const input of made.inputs) if (statSync(join(root, input)).mtimeMs > at) return undefined
    return join(dir, "main.mjs")
  } catch {
    return undefined
  }
}

/** Bundles the user CLI into a new folder and makes it the current one; answers its entry. */
const bundle = async () => {
  const { build } = await import("esbuild")
  mkdirSync(home, { recursive: true })
  const name = `b-${Date.now()}-${process.pid}`
  const dir = join(home, name)
  const result = await build({
    entryPoints: { main: join(root, "cli", "user", "main.ts") },
    outdir: dir,
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
  writeFileSync(join(dir, "inputs.json"), JSON.stringify({ inputs }))
  const temporary = `${pointer}.${process.pid}.tmp`
  writeFileSync(temporary, name)
  renameSync(temporary, pointer)
  const old = Date.now() - 3600_000
  for (const entry of readdirSync(home))
    if (entry.startsWith("b-") && entry !== name && Number(entry.split("-")[1]) < old)
      rmSync(join(home, entry), { recursive: true, force: true })
  return join(dir, "main.mjs")
}

const user = async () => {
  let entry = fresh()
  if (entry === undefined) {
    try {
      entry = await bundle()
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

#!/usr/bin/env node
// The `hangar` command. The project runs TypeScript directly (no build step), so a command would
// pay tsx's compile at every start. Instead the user CLI (`cli/user/`) and the operator commands
// (`hangar admin`, `cli/admin.ts`) are bundled by esbuild into `.tools/cli/` the first time one
// runs after a change to their sources (a few stats tell), and started from there; each user
// command's code is its own chunk, loaded only when that command runs. The packages they use
// (effect, the NATS client, ws, …) are bundled in too: loaded from `node_modules/` file by file,
// effect's few hundred modules alone took the operator commands' start from about 0.45 s to 1 s.
// The operator commands are one CommonJS file (`admin.cjs`, 2 MB), started from V8's code cache
// of it (`admin.cjs.v8`, written by the first start): compiling it took a third of their start. `serve` (the service
// itself) and any failure to bundle go through tsx as before.
//
// Each bundle is a folder of its own, never changed; `.tools/cli/current` names the newest (written
// whole and renamed into place), so processes bundling at once, or a process still loading chunks
// of an older bundle, never see a half-made or removed folder. Bundles an hour older than the
// current one are removed by the next bundling.
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
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

/** The entries of a bundle and their files: the user CLI (ES modules, a chunk per command), and the operator commands. */
const entries = { main: join(root, "cli", "user", "main.ts"), admin: join(root, "cli", "admin.ts") }
const files = { main: "main.mjs", admin: "admin.cjs" }

/**
 * Beside the sources, what a bundle is made from: the version, the packages (npm writes both lock
 * files on every install, so stating them stands for stating each package's files, hundreds) and
 * how it is bundled. Checked on every start, whether or not an older bundle listed them.
 */
const makers = [
  "package.json",
  "package-lock.json",
  join("node_modules", ".package-lock.json"),
  "cli/bin.js",
  "cli/bundle.mjs",
]

/** The current bundle's folder when it is newer than every source and maker it was made from, else undefined. */
const fresh = () => {
  try {
    const dir = join(home, readFileSync(pointer, "utf8").trim())
    const made = JSON.parse(readFileSync(join(dir, "inputs.json"), "utf8"))
    const at = statSync(join(dir, "main.mjs")).mtimeMs
    for (const input of made.inputs) if (statSync(join(root, input)).mtimeMs > at) return undefined
    for (const maker of makers)
      if ((statSync(join(root, maker), { throwIfNoEntry: false })?.mtimeMs ?? 0) > at) return undefined
    for (const file of Object.values(files)) statSync(join(dir, file))
    return dir
  } catch {
    return undefined
  }
}

/**
 * The bundled CommonJS packages' `require` (of Node's modules, and of the optional native helpers
 * ws looks for), resolved from the repository as from its sources wherever the bundle is.
 */
const requireFromRoot = join(root, "package.json")
const requireBanner = `import { createRequire as __hangarRequire } from "node:module"; const require = __hangarRequire(${JSON.stringify(pathToFileURL(requireFromRoot).href)});`

/** Bundles the user CLI and the operator commands into a new folder and makes it the current one; answers it. */
const bundle = async () => {
  const [{ build }, { sourceUrls }] = await Promise.all([import("esbuild"), import("./bundle.mjs")])
  mkdirSync(home, { recursive: true })
  const name = `b-${Date.now()}-${process.pid}`
  const dir = join(home, name)
  const common = {
    outdir: dir,
    bundle: true,
    platform: "node",
    target: "node20",
    metafile: true,
    logLevel: "silent",
    plugins: [sourceUrls],
    define: {
      HANGAR_VERSION: JSON.stringify(JSON.parse(readFileSync(join(root, "package.json"), "utf8")).version),
    },
  }
  const results = await Promise.all([
    build({
      ...common,
      entryPoints: { main: entries.main },
      outExtension: { ".js": ".mjs" },
      splitting: true,
      format: "esm",
      banner: { js: requireBanner },
    }),
    build({
      ...common,
      entryPoints: { admin: entries.admin },
      outExtension: { ".js": ".cjs" },
      format: "cjs",
    }),
  ])
  const inputs = [...new Set(results.flatMap((r) => Object.keys(r.metafile.inputs)))].filter(
    (input) => !input.startsWith("node_modules/"),
  )
  writeFileSync(join(dir, "inputs.json"), JSON.stringify({ inputs }))
  const temporary = `${pointer}.${process.pid}.tmp`
  writeFileSync(temporary, name)
  renameSync(temporary, pointer)
  const old = Date.now() - 3600_000
  for (const entry of readdirSync(home))
    if (entry.startsWith("b-") && entry !== name && Number(entry.split("-")[1]) < old)
      rmSync(join(home, entry), { recursive: true, force: true })
  return dir
}

/**
 * The exports of the CommonJS file `file`, compiled with V8's code cache of it (`<file>.v8`), which
 * is written when there is none or V8 refused it (another Node.js): after the module ran, so it
 * holds the functions its start compiled too. Written whole and renamed into place.
 */
const loadCached = async (file) => {
  const { constants, Script } = await import("node:vm") // only here: the user commands do without it
  const cache = `${file}.v8`
  let cachedData
  try {
    cachedData = readFileSync(cache)
  } catch {}
  const wrapped = `(function (exports, require, module, __filename, __dirname) {${readFileSync(file, "utf8")}\n})`
  const script = new Script(wrapped, {
    filename: file,
    cachedData,
    importModuleDynamically: constants.USE_MAIN_CONTEXT_DEFAULT_LOADER,
  })
  const module = { exports: {} }
  const require = createRequire(requireFromRoot)
  script.runInThisContext().call(module.exports, module.exports, require, module, file, dirname(file))
  if (cachedData === undefined || script.cachedDataRejected) {
    try {
      const temporary = `${cache}.${process.pid}.tmp`
      writeFileSync(temporary, script.createCachedData())
      renameSync(temporary, cache)
    } catch {} // a folder it may not write in: it starts without the cache
  }
  return module.exports
}

/** Runs the command from the bundle (made first when stale); false when it could not be made. */
const bundled = async () => {
  let dir = fresh()
  if (dir === undefined) {
    try {
      dir = await bundle()
    } catch {
      return false
    }
  }
  if (command === "admin") {
    // It prints its answer and exits by itself.
    const { main } = await loadCached(join(dir, files.admin))
    main(process.argv.slice(3))
    return true
  }
  const { main } = await import(pathToFileURL(join(dir, files.main)).href)
  const status = await main(process.argv.slice(2))
  process.stdout.write("", () => process.exit(status))
  return true
}

if (command === "serve" || !(await bundled())) {
  const { register } = await import("tsx/esm/api")
  register()
  await import("./main.ts")
}

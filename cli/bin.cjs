#!/usr/bin/env node
// The `hangar` command. The project runs TypeScript directly (no build step), so a command would
// pay tsx's compile at every start. Instead the user CLI (`cli/user/`) and the operator commands
// (`hangar admin`, `cli/admin.ts`) are bundled by esbuild into `.tools/cli/` the first time one
// runs after a change to their sources (a few stats tell), and started from there. `serve` (the
// service itself) and any failure to bundle go through tsx as before.
//
// What makes the start short, each measured against `node -e 0` (`bench/cli.ts`):
// - Each bundle is one CommonJS file with the packages it uses in it (effect, the NATS client, ws,
//   yaml…). Loaded from `node_modules/` file by file, effect's few hundred modules took the
//   operator commands' start from about 0.45 s to 1 s. A user command's code is set up only when
//   that command runs (esbuild's lazy module init).
// - Each is compiled from V8's code cache of it (`<file>.v8`, written by its first start):
//   compiling `admin.cjs` (1.4 MB) took a third of the operator commands' start.
// - This file is CommonJS too: an ES module entry, or ES module chunks, cost Node's module loader
//   about 10 ms more on every start.
//
// Each bundle is a folder of its own, never changed (but for its code caches, written whole and
// renamed into place); `.tools/cli/current` names the newest (the same way), so processes bundling
// at once, or a process still loading an older bundle, never see a half-made or removed folder.
// Bundles an hour older than the current one are removed by the next bundling.
const {
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} = require("node:fs")
const { dirname, join } = require("node:path")

// Node 20.15 or later (package.json `engines`): the folder upload builds its gzip members with
// `zlib.crc32`. Said at once, not as a crash mid-upload.
const [major, minor] = process.versions.node.split(".").map(Number)
if (major < 20 || (major === 20 && minor < 15)) {
  process.stderr.write(`hangar needs Node.js 20.15 or later; this is ${process.version}\n`)
  process.exit(1)
}

const root = join(__dirname, "..")
const command = process.argv[2]
const home = join(process.env.HANGAR_TOOLS_DIR ?? join(root, ".tools"), "cli")
const pointer = join(home, "current")

/** The entries of a bundle: the user CLI, and the operator commands (`<name>.cjs` each). */
const entries = { main: join(root, "cli", "user", "main.ts"), admin: join(root, "cli", "admin.ts") }

/**
 * Beside the sources, what a bundle is made from: the version, the packages (npm writes both lock
 * files on every install, so stating them stands for stating each package's files, hundreds) and
 * how it is bundled. Checked on every start, whether or not an older bundle listed them.
 */
const makers = [
  "package.json",
  "package-lock.json",
  join("node_modules", ".package-lock.json"),
  "cli/bin.cjs",
  "core/SourceUrls.mjs",
]

/** The current bundle's folder when it is newer than every source and maker it was made from, else undefined. */
const fresh = () => {
  try {
    const dir = join(home, readFileSync(pointer, "utf8").trim())
    const made = JSON.parse(readFileSync(join(dir, "inputs.json"), "utf8"))
    const at = statSync(join(dir, "main.cjs")).mtimeMs
    for (const input of made.inputs) if (statSync(join(root, input)).mtimeMs > at) return undefined
    for (const maker of makers)
      if ((statSync(join(root, maker), { throwIfNoEntry: false })?.mtimeMs ?? 0) > at) return undefined
    for (const name of Object.keys(entries)) statSync(join(dir, `${name}.cjs`))
    return dir
  } catch {
    return undefined
  }
}

/** Writes `data` to `file` whole: a temporary file renamed into place. */
const writeWhole = (file, data) => {
  const temporary = `${file}.${process.pid}.tmp`
  writeFileSync(temporary, data)
  renameSync(temporary, file)
}

/** Bundles the user CLI and the operator commands into a new folder and makes it the current one; answers it. */
const bundle = async () => {
  const [{ build }, { sourceUrls }] = await Promise.all([import("esbuild"), import("../core/SourceUrls.mjs")])
  mkdirSync(home, { recursive: true })
  const name = `b-${Date.now()}-${process.pid}`
  const dir = join(home, name)
  const result = await build({
    entryPoints: entries,
    outdir: dir,
    outExtension: { ".js": ".cjs" },
    bundle: true,
    format: "cjs",
    platform: "node",
    target: "node20",
    // Names kept (so is what an error says), spaces and long forms not: a smaller file to read
    // at every start (616 KB against 383 KB: about 4 ms of `hangar version`).
    minifyWhitespace: true,
    minifySyntax: true,
    metafile: true,
    logLevel: "silent",
    plugins: [sourceUrls],
    define: {
      HANGAR_VERSION: JSON.stringify(JSON.parse(readFileSync(join(root, "package.json"), "utf8")).version),
    },
  })
  const inputs = Object.keys(result.metafile.inputs).filter((input) => !input.startsWith("node_modules/"))
  writeFileSync(join(dir, "inputs.json"), JSON.stringify({ inputs }))
  writeWhole(pointer, name)
  const old = Date.now() - 3600_000
  for (const entry of readdirSync(home))
    if (entry.startsWith("b-") && entry !== name && Number(entry.split("-")[1]) < old)
      rmSync(join(home, entry), { recursive: true, force: true })
  return dir
}

/**
 * The exports of the bundled file `file`, compiled with V8's code cache of it (`<file>.v8`), which
 * is written when there is none or V8 refused it (another Node.js): after the module ran, so it
 * holds the functions its start compiled too. Its `require` (of Node's modules, and of the
 * optional native helpers ws looks for) resolves from the repository wherever the bundle is.
 */
const loadCached = (file) => {
  const { constants, Script } = require("node:vm")
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
  const loaded = { exports: {} }
  const fromRoot = require("node:module").createRequire(join(root, "package.json"))
  script.runInThisContext().call(loaded.exports, loaded.exports, fromRoot, loaded, file, dirname(file))
  if (cachedData === undefined || script.cachedDataRejected) {
    try {
      writeWhole(cache, script.createCachedData())
    } catch {} // a folder it may not write in: it starts without the cache
  }
  return loaded.exports
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
    loadCached(join(dir, "admin.cjs")).main(process.argv.slice(3))
    return true
  }
  const status = await loadCached(join(dir, "main.cjs")).main(process.argv.slice(2))
  process.stdout.write("", () => process.exit(status))
  return true
}

const start = async () => {
  if (command === "serve" || !(await bundled())) {
    const { register } = await import("tsx/esm/api")
    register()
    await import("./main.ts")
  }
}
start()

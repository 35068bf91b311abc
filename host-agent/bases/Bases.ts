/**
 * Bases: read-only root filesystems built once from Debian packages with `mmdebstrap`, cached on
 * disk outside the repository as `<dir>/<name>/{rootfs/,base.json}`.
 *
 * A base is named `<distro>-<release>-<date>-<hash>` where the hash covers the recipe, so the same
 * recipe is found again whatever day it was built. A base is built in a temporary folder beside
 * the cache and renamed into place in one step, and never modified afterwards: machines only use
 * its `rootfs/` as the lower layer of an overlay.
 */
import { spawn } from "node:child_process"
import { createHash } from "node:crypto"
import { createReadStream } from "node:fs"
import * as fs from "node:fs/promises"
import { basename, join, resolve } from "node:path"
import { Config, Data, Effect } from "effect"
import { defineSettings, env } from "../../core/Config.ts"
import { repositoryRoot as root } from "../../core/DataDir.ts"

/**
 * Where bases are cached (shared by every checkout on the host), and the recipes of
 * `deploy/bases/` this host offers (`HANGAR_BASES`, comma-separated, newest first): it builds the
 * missing ones at start and lists only bases built from them, so a test fixture such as the slim
 * base in the same cache is never offered to users.
 */
export const BasesSettings = defineSettings(
  "host-agent/Bases",
  {
    dir: "/var/cache/hangar/bases",
    recipes: ["debian-trixie-full", "debian-bookworm-full"] as ReadonlyArray<string>,
  },
  (d) => ({
    dir: env.string("BASES_DIR", d.dir),
    recipes: Config.map(env.string("BASES", d.recipes.join(",")), (v) =>
      v
        .split(",")
        .map((r) => r.trim())
        .filter((r) => r !== ""),
    ),
  }),
)

/** A recipe in `deploy/bases/*.json`. */
export interface Recipe {
  readonly distro: string
  readonly release: string
  readonly variant: string
  readonly mirrors: ReadonlyArray<string>
  readonly packages: ReadonlyArray<string>
  readonly exclude?: ReadonlyArray<string>
  /** Shell commands run after the common ones as mmdebstrap customize hooks (`$1` is the root); part of the hash. */
  readonly hooks?: ReadonlyArray<string>
}

/** A built base as listed (`{name, sha256, bytes}` is the spec's bases listing item). */
export interface Base {
  readonly name: string
  readonly sha256: string
  readonly bytes: number
  /** The read-only root filesystem, the overlay's lower layer. */
  readonly rootfs: string
  /** The recipe's name in `deploy/bases/` (left out by bases built before it was recorded). */
  readonly recipe?: string
}

/** A base being built now (by this process or another): its name is chosen when the build starts. */
export interface Building {
  readonly name: string
  readonly recipe: string
  readonly pid: number
  /** When the build started (ms since the epoch). */
  readonly started: number
}

/** Building a base failed; `detail` carries the tail of the builder's output. */
export class BaseBuildFailed extends Data.TaggedError("BaseBuildFailed")<{
  readonly recipe: string
  readonly detail: string
}> {}

/** The recipe of the slim test base (no browser or display, quick to build). */
export const slimRecipePath = join(root, "deploy", "bases", "debian-bookworm-slim.json")

/** The first 12 hex digits of the recipe's canonical JSON hash. */
export const recipeHash = (recipe: Recipe): string =>
  createHash("sha256")
    .update(JSON.stringify(recipe, Object.keys(recipe).sort()))
    .update(JSON.stringify(recipe.packages))
    .update(JSON.stringify(recipe.mirrors))
    .update(JSON.stringify(recipe.exclude ?? []))
    .digest("hex")
    .slice(0, 12)

const readRecipe = async (path: string): Promise<Recipe> =>
  JSON.parse(await fs.readFile(path, "utf8")) as Recipe

/** A recipe's name: its file name in `deploy/bases/` without `.json`. */
export const recipeNameOf = (recipePath: string) => basename(recipePath).replace(/\.json$/, "")

const readBase = async (dir: string, name: string): Promise<Base | undefined> => {
  try {
    const meta = JSON.parse(await fs.readFile(join(dir, name, "base.json"), "utf8")) as Omit<Base, "rootfs">
    const base = {
      name: meta.name,
      sha256: meta.sha256,
      bytes: meta.bytes,
      rootfs: join(dir, name, "rootfs"),
    }
    return meta.recipe === undefined ? base : { ...base, recipe: meta.recipe }
  } catch {
    return undefined
  }
}

const listIn = async (dir: string): Promise<Array<Base>> => {
  const names = await fs.readdir(dir).catch(() => [] as Array<string>)
  const bases: Array<Base> = []
  for (const name of names.sort()) {
    if (name.startsWith(".")) continue
    const base = await readBase(dir, name)
    if (base) bases.push(base)
  }
  return bases
}

const builtFrom = (base: Base, recipe: Recipe) =>
  base.name.startsWith(`${recipe.distro}-${recipe.release}-`) && base.name.endsWith(`-${recipeHash(recipe)}`)

const findIn = async (dir: string, recipe: Recipe): Promise<Base | undefined> =>
  (await listIn(dir)).find((b) => builtFrom(b, recipe))

const run = (
  cmd: string,
  args: ReadonlyArray<string>,
  onLine?: (line: string) => void,
  signal?: AbortSignal,
) =>
  new Promise<string>((ok, fail) => {
    const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], ...(signal ? { signal } : {}) })
    let tail = ""
    const take = (b: Buffer) => {
      const text = b.toString("utf8")
      tail = (tail + text).slice(-4000)
      if (onLine) for (const line of text.split("\n")) if (line.trim()) onLine(line)
    }
    child.stdout.on("data", take)
    child.stderr.on("data", take)
    child.on("error", (e) => fail(new Error(`${cmd}: ${e.message}`)))
    child.on("close", (code) => (code === 0 ? ok(tail) : fail(new Error(`${cmd} exited ${code}: ${tail}`))))
  })

const sha256File = (path: string) =>
  new Promise<string>((ok, fail) => {
    const hash = createHash("sha256")
    createReadStream(path)
      .on("data", (b) => hash.update(b))
      .on("error", fail)
      .on("end", () => ok(hash.digest("hex")))
  })

// Machines need a few things every base provides: a mount point for the workspace disk, sshd's
// privilege separation folder, and no host keys (each machine gets its own, generated by the driver).
const customizeHooks = [
  'rm -f "$1"/etc/ssh/ssh_host_*',
  'mkdir -p "$1"/workspace "$1"/run/sshd "$1"/root/.ssh',
  'chmod 700 "$1"/root/.ssh',
  'printf "machine\\n" > "$1"/etc/hostname',
]

const buildIn = async (
  dir: string,
  recipePath: string,
  recipe: Recipe,
  name: string,
  log: (line: string) => void,
  signal?: AbortSignal,
): Promise<Base> => {
  const tmp = await fs.mkdtemp(join(dir, `.build-${name}-`))
  try {
    const tar = join(tmp, "rootfs.tar")
    await run(
      "mmdebstrap",
      [
        `--variant=${recipe.variant}`,
        "--mode=root",
        "--format=tar",
        `--include=${recipe.packages.join(",")}`,
        '--aptopt=Acquire::Languages "none"',
        ...(recipe.exclude ?? []).map((p) => `--dpkgopt=path-exclude=${p}`),
        ...[...customizeHooks, ...(recipe.hooks ?? [])].map((h) => `--customize-hook=${h}`),
        recipe.release,
        tar,
        ...recipe.mirrors,
      ],
      log,
      signal,
    )
    log("I: hashing and unpacking the image...")
    const sha256 = await sha256File(tar)
    const bytes = (await fs.stat(tar)).size
    await fs.mkdir(join(tmp, "rootfs"))
    await run(
      "tar",
      ["-xf", tar, "-C", join(tmp, "rootfs"), "--numeric-owner", "--xattrs", "--xattrs-include=*"],
      undefined,
      signal,
    )
    await fs.rm(tar)
    const recipeName = recipeNameOf(recipePath)
    await fs.writeFile(
      join(tmp, "base.json"),
      `${JSON.stringify({ name, sha256, bytes, recipe: recipeName }, null, 2)}\n`,
    )
    // One rename publishes the finished base; a reader never sees a half-built one.
    await fs.rename(tmp, join(dir, name))
    return { name, sha256, bytes, rootfs: join(dir, name, "rootfs"), recipe: recipeName }
  } catch (e) {
    await fs.rm(tmp, { recursive: true, force: true })
    throw e
  }
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"
  }
}

const ownerOf = async (lock: string): Promise<Building | undefined> => {
  try {
    return JSON.parse(await fs.readFile(join(lock, "owner.json"), "utf8")) as Building
  } catch {
    return undefined
  }
}

// A lock is stale when the process that took it is gone (a build killed with its host agent); one
// whose owner is not written yet counts as held for a minute.
const staleLock = async (lock: string) => {
  const owner = await ownerOf(lock)
  if (owner !== undefined) return !alive(owner.pid)
  const age = await fs.stat(lock).then(
    (s) => Date.now() - s.mtimeMs,
    () => 0,
  )
  return age > 60_000
}

// Two processes may ask for the same missing base at once (two test files, a host agent and
// build.ts): one builds, the other waits for it. The lock names the base being built, which is how
// `building` sees it.
const withBuildLock = async <A>(dir: string, owner: Building, f: () => Promise<A>): Promise<A> => {
  await fs.mkdir(dir, { recursive: true })
  const hash = owner.name.slice(owner.name.lastIndexOf("-") + 1)
  const lock = join(dir, `.lock-${hash}`)
  for (;;) {
    try {
      await fs.mkdir(lock)
      break
    } catch {
      if (await staleLock(lock)) await fs.rm(lock, { recursive: true, force: true })
      else await new Promise((r) => setTimeout(r, 1000))
    }
  }
  try {
    await fs.writeFile(join(lock, "owner.json"), JSON.stringify(owner))
    // A build of this recipe killed outright left its temporary folder; with the lock held, no
    // live build owns one.
    for (const left of await fs.readdir(dir))
      if (left.startsWith(".build-") && left.includes(`-${hash}-`))
        await fs.rm(join(dir, left), { recursive: true, force: true })
    return await f()
  } finally {
    await fs.rm(lock, { recursive: true, force: true })
  }
}

/** The bases being built now in `dir`, by any live process. */
export const building = (dir: string): Effect.Effect<ReadonlyArray<Building>> =>
  Effect.promise(async () => {
    const names = await fs.readdir(dir).catch(() => [] as Array<string>)
    const found: Array<Building> = []
    for (const name of names.sort()) {
      if (!name.startsWith(".lock-")) continue
      const owner = await ownerOf(join(dir, name))
      if (owner !== undefined && alive(owner.pid)) found.push(owner)
    }
    return found
  })

/**
 * Whether `base` is one this host offers: built from one of `recipes` (by the recipe recorded at
 * build, or for an older base without one, by the current recipe's name and hash).
 */
export const served = (recipes: ReadonlyArray<string>) =>
  Effect.promise(async () => {
    const current = await Promise.all(
      recipes.map(async (name) => readRecipe(recipePathOf(name)).catch(() => undefined)),
    )
    return (base: Base) =>
      base.recipe !== undefined
        ? recipes.includes(base.recipe)
        : current.some((r) => r !== undefined && builtFrom(base, r))
  })

/** The finished base built from the recipe at `recipePath`, if there is one. */
export const find = (dir: string, recipePath: string) =>
  Effect.tryPromise({
    try: async () => findIn(dir, await readRecipe(recipePath)),
    catch: (e) =>
      new BaseBuildFailed({ recipe: recipePath, detail: e instanceof Error ? e.message : String(e) }),
  })

/** Every finished base in `dir`, by name. */
export const list = (dir: string) => Effect.promise(() => listIn(dir))

/** The name a base built today from `recipe` gets. */
export const nameFor = (recipe: Recipe, at: Date = new Date()) =>
  `${recipe.distro}-${recipe.release}-${at.toISOString().slice(0, 10).replaceAll("-", "")}-${recipeHash(recipe)}`

/**
 * The base built from the recipe at `recipePath`, building it first when it is missing (minutes:
 * `log` gets mmdebstrap's lines as it goes). Interrupting it stops the build and removes its
 * temporary folder.
 */
export const ensure = (dir: string, recipePath: string, log: (line: string) => void = () => {}) =>
  Effect.tryPromise({
    try: async (signal) => {
      const recipe = await readRecipe(recipePath)
      const found = await findIn(dir, recipe)
      if (found) return found
      const owner = {
        name: nameFor(recipe),
        recipe: recipeNameOf(recipePath),
        pid: process.pid,
        started: Date.now(),
      }
      return withBuildLock(dir, owner, async () => {
        // Another process may have finished it while this one waited for the lock.
        const built = await findIn(dir, recipe)
        return built ?? buildIn(dir, recipePath, recipe, owner.name, log, signal)
      })
    },
    catch: (e) =>
      new BaseBuildFailed({ recipe: recipePath, detail: e instanceof Error ? e.message : String(e) }),
  })

/** The slim test base under the default cache folder (built on first use, minutes); its path. */
export const ensureTestBase = (): Promise<Base> =>
  Effect.runPromise(ensure(BasesSettings.defaults.dir, slimRecipePath))

/**
 * The full bases a host offers by default (browser and display), newest first, under the default
 * cache folder: built on first use (about two minutes each, side by side), then found at once.
 */
export const ensureFullBases = (): Promise<ReadonlyArray<Base>> =>
  Effect.runPromise(
    Effect.forEach(
      BasesSettings.defaults.recipes,
      (recipe) => ensure(BasesSettings.defaults.dir, recipePathOf(recipe)),
      { concurrency: "unbounded" },
    ),
  )

/** Resolves a recipe argument: a path, or a name in `deploy/bases/`. */
export const recipePathOf = (arg: string) =>
  arg.endsWith(".json") ? resolve(arg) : join(root, "deploy", "bases", `${arg}.json`)

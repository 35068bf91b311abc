// The bootstrap run first by `npm start`, `npm test` and `npm run bench`: it installs whatever is
// missing on a fresh Debian 12 + Node 20 machine, and does nothing (quickly) when all is present.
//
// Plain JavaScript with Node built-ins only: it runs before any npm dependency exists.
//
//   node deploy/bootstrap.mjs              every step, in order
//   node deploy/bootstrap.mjs nats-server  only the named steps (ids below)
//
// `HANGAR_TOOLS_DIR` moves the tools folder (default `.tools/`); it is read in `deploy/tools.mjs`,
// so the bootstrap and everything that later reads `nats-server.path` agree on it.
//
// Each step prints one line `bootstrap: <step> … <state>` (and a second one when it had to act);
// any failure prints `bootstrap: <step> failed: <why>` and exits with status 1.
import { spawnSync } from "node:child_process"
import { createHash } from "node:crypto"
import {
  accessSync,
  constants,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs"
import { delimiter, join } from "node:path"
import { natsServerPathFile, root, toolsDir } from "./tools.mjs"

/** The oldest nats-server with what we use (message schedules, per-message TTL, batch publish). */
const NATS_MIN = [2, 12, 0]

/** The Debian suite whose `nats-server` package is new enough (bookworm's own is 2.9). */
const DEBIAN_SOURCE =
  "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian testing main"

class StepError extends Error {}

const say = (step, state) => process.stdout.write(`bootstrap: ${step} … ${state}\n`)

/** Runs a command to completion; returns its result (never throws on a non-zero status). */
const run = (command, args, options = {}) =>
  spawnSync(command, args, { encoding: "utf8", maxBuffer: 64 * 1024 * 1024, ...options })

/** Runs a command and throws a StepError with the tail of its output when it fails. */
const runOrFail = (what, command, args, options = {}) => {
  const result = run(command, args, options)
  if (result.error) throw new StepError(`${what}: cannot run ${command}: ${result.error.message}`)
  if (result.status !== 0) {
    const output = `${result.stdout ?? ""}${result.stderr ?? ""}`.trim().split("\n").slice(-15).join("\n")
    throw new StepError(`${what}: \`${command} ${args.join(" ")}\` exited with ${result.status}\n${output}`)
  }
  return result
}

/** Writes a file whole or not at all, so a reader never sees a half-written marker. */
const writeAtomic = (path, content) => {
  const temp = `${path}.${process.pid}.tmp`
  writeFileSync(temp, content)
  renameSync(temp, path)
}

/** The first executable named `name` on PATH, or undefined. */
const onPath = (name) => {
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (dir === "") continue
    const candidate = join(dir, name)
    try {
      accessSync(candidate, constants.X_OK)
      if (statSync(candidate).isFile()) return candidate
    } catch {
      // not here
    }
  }
  return undefined
}

// ---------------------------------------------------------------------------------------------
// npm dependencies

const nodeModules = join(root, "node_modules")
const lockMarker = join(nodeModules, ".hangar-lock-hash")

/**
 * What an install depends on: the lock file, and the platform and Node ABI (native modules such
 * as uWebSockets.js pick their binary for them).
 */
const lockHash = () =>
  createHash("sha256")
    .update(readFileSync(join(root, "package-lock.json")))
    .update(`\0${process.platform}-${process.arch}-abi${process.versions.modules}`)
    .digest("hex")

/**
 * Whether node_modules, installed by something other than this script (a manual `npm ci`), matches
 * the lock file: npm records what it installed in `node_modules/.package-lock.json`. Every
 * installed package must be locked at the same version, and every locked package installed except
 * optional ones (other platforms' binaries).
 */
const installMatchesLock = () => {
  try {
    const locked = JSON.parse(readFileSync(join(root, "package-lock.json"), "utf8")).packages ?? {}
    const installed = JSON.parse(readFileSync(join(nodeModules, ".package-lock.json"), "utf8")).packages ?? {}
    for (const [path, entry] of Object.entries(installed)) {
      if (locked[path]?.version !== entry.version) return false
    }
    for (const [path, entry] of Object.entries(locked)) {
      if (path !== "" && !entry.optional && !(path in installed)) return false
    }
    return true
  } catch {
    return false
  }
}

/** Runs npm in the repository: the npm running this script when there is one, else `npm` on PATH. */
const npm = (args, stdio) => {
  const cli = process.env.npm_execpath
  const [command, argv] = cli?.endsWith(".js") ? [process.execPath, [cli, ...args]] : ["npm", args]
  const result = spawnSync(command, argv, {
    cwd: root,
    encoding: "utf8",
    maxBuffer: 64 * 1024 * 1024,
    stdio: ["ignore", stdio, stdio],
  })
  if (result.error) throw new StepError(`cannot run npm: ${result.error.message}`)
  return result
}

const npmDependencies = () => {
  const step = "npm dependencies"
  const hash = lockHash()
  const marker = existsSync(lockMarker) ? readFileSync(lockMarker, "utf8").trim() : undefined
  if (marker === hash) return say(step, "present")
  // Adopting an install that matches avoids wiping a working node_modules that other processes
  // may be using; a marker that differs means the lock file changed since our own install.
  if (marker === undefined && existsSync(nodeModules) && installMatchesLock()) {
    writeAtomic(lockMarker, `${hash}\n`)
    return say(step, "present (matches package-lock.json)")
  }
  const why = !existsSync(nodeModules)
    ? "missing"
    : marker === undefined
      ? "not from package-lock.json"
      : "stale"
  say(step, `installing (${why}): npm ci`)
  const lockBefore = readFileSync(join(root, "package-lock.json"), "utf8")
  // `npm ci` (npm 10 and 11 alike) installs exactly the lock file, removing node_modules first.
  const ci = npm(["ci", "--no-audit", "--no-fund"], "pipe")
  if (ci.status === 0) {
    process.stdout.write(`${ci.stdout}${ci.stderr}`)
  } else {
    // npm ci refuses a lock file that lacks entries npm expects (e.g. other platforms' optional
    // binaries missing from a registry mirror); `npm install` installs the same locked versions.
    const reason = `${ci.stdout}${ci.stderr}`.split("\n").find((line) => /npm error (?!code)\S/.test(line))
    say(
      step,
      `npm ci failed (${reason?.replace(/^npm error\s*/, "") ?? `status ${ci.status}`}); trying npm install`,
    )
    const install = npm(["install", "--no-audit", "--no-fund"], "inherit")
    if (install.status !== 0)
      throw new StepError(`npm install exited with ${install.status} (see its output above)`)
    if (readFileSync(join(root, "package-lock.json"), "utf8") !== lockBefore) {
      say(step, "warning: npm install changed package-lock.json (package.json and the lock file disagree)")
    }
  }
  writeAtomic(lockMarker, `${lockHash()}\n`)
  say(step, "installed")
}

// ---------------------------------------------------------------------------------------------
// nats-server

/** `[major, minor, patch]` from `nats-server --version` ("nats-server: v2.15.1"), or undefined. */
const natsVersion = (binary) => {
  const result = run(binary, ["--version"], { timeout: 10_000 })
  if (result.error || result.status !== 0) return undefined
  const match = /v(\d+)\.(\d+)\.(\d+)/.exec(result.stdout ?? "")
  return match ? [Number(match[1]), Number(match[2]), Number(match[3])] : undefined
}

const newEnough = (version) => {
  if (version === undefined) return false
  for (let i = 0; i < 3; i++) {
    if (version[i] !== NATS_MIN[i]) return version[i] > NATS_MIN[i]
  }
  return true
}

const showVersion = (version) => (version === undefined ? "no version" : `v${version.join(".")}`)

/**
 * Fetches Debian testing's nats-server package with apt-get against private sources, lists and
 * cache under `<tools>/apt/` (the system's apt sources and state are left alone), and unpacks it
 * with `dpkg -x` into `<tools>/nats-server/`. Returns the binary's path.
 */
const fetchNatsFromDebian = () => {
  const aptGet = onPath("apt-get")
  const dpkg = onPath("dpkg")
  if (aptGet === undefined || dpkg === undefined) {
    throw new StepError(
      `need apt-get and dpkg to fetch it from Debian (not found on PATH); install nats-server ≥ ${NATS_MIN.join(".")} on PATH instead`,
    )
  }
  const aptDir = join(toolsDir, "apt")
  const lists = join(aptDir, "lists")
  const cache = join(aptDir, "cache")
  mkdirSync(join(lists, "partial"), { recursive: true })
  mkdirSync(join(cache, "archives", "partial"), { recursive: true })
  const sourceList = join(aptDir, "sources.list")
  writeFileSync(sourceList, `${DEBIAN_SOURCE}\n`)
  const options = [
    ["Dir::Etc::SourceList", sourceList],
    ["Dir::Etc::SourceParts", "/dev/null"],
    ["Dir::Etc::Preferences", "/dev/null"],
    ["Dir::Etc::PreferencesParts", "/dev/null"],
    ["Dir::State::Lists", lists],
    ["Dir::Cache", cache],
    ["Dir::State::status", "/dev/null"],
    ["Acquire::Languages", "none"],
    // As root apt downloads as the `_apt` user, which cannot write into our private folders.
    ...(process.getuid?.() === 0 ? [["APT::Sandbox::User", "root"]] : []),
  ].flatMap(([key, value]) => ["-o", `${key}=${value}`])
  runOrFail("apt-get update (Debian testing, private lists)", aptGet, ["-q", ...options, "update"])

  const download = join(toolsDir, `download.${process.pid}`)
  const unpacked = join(toolsDir, `nats-server.${process.pid}.tmp`)
  const target = join(toolsDir, "nats-server")
  try {
    rmSync(download, { recursive: true, force: true })
    mkdirSync(download, { recursive: true })
    runOrFail("apt-get download nats-server", aptGet, ["-q", ...options, "download", "nats-server"], {
      cwd: download,
    })
    const deb = readdirSync(download).find((name) => name.startsWith("nats-server_") && name.endsWith(".deb"))
    if (deb === undefined) throw new StepError("apt-get download nats-server left no .deb")
    rmSync(unpacked, { recursive: true, force: true })
    runOrFail("dpkg -x", dpkg, ["-x", join(download, deb), unpacked])
    // Swap in the new tree whole, so a half-unpacked one is never at the recorded path.
    rmSync(target, { recursive: true, force: true })
    renameSync(unpacked, target)
  } finally {
    rmSync(download, { recursive: true, force: true })
    rmSync(unpacked, { recursive: true, force: true })
  }
  return join(target, "usr", "sbin", "nats-server")
}

const natsServer = () => {
  const step = "nats-server"
  const recorded = existsSync(natsServerPathFile) ? readFileSync(natsServerPathFile, "utf8").trim() : ""
  if (recorded !== "") {
    const version = natsVersion(recorded)
    if (newEnough(version)) return say(step, `present (${showVersion(version)}, ${recorded})`)
  }
  const system = onPath("nats-server")
  const systemVersion = system === undefined ? undefined : natsVersion(system)
  let chosen = system
  let version = systemVersion
  if (!newEnough(systemVersion)) {
    const found = system === undefined ? "none on PATH" : `${system} is ${showVersion(systemVersion)}`
    say(step, `fetching Debian testing's package (${found}; need ≥ v${NATS_MIN.join(".")})`)
    mkdirSync(toolsDir, { recursive: true })
    chosen = fetchNatsFromDebian()
    version = natsVersion(chosen)
    if (!newEnough(version)) {
      throw new StepError(`the fetched ${chosen} is ${showVersion(version)}; need ≥ v${NATS_MIN.join(".")}`)
    }
  }
  mkdirSync(toolsDir, { recursive: true })
  writeAtomic(natsServerPathFile, `${chosen}\n`)
  say(step, `${chosen === system ? "using" : "installed"} ${showVersion(version)} at ${chosen}`)
}

// ---------------------------------------------------------------------------------------------
// Debian packages the host agent uses: crun (the OCI runtime), Podman's default seccomp profile
// (golang-github-containers-common), lxcfs, perl (the machine-root helper, which makes a
// machine's mounts; it needs only perl-base, which is essential on Debian, so it is never
// missing), python3 (the helper that starts host tools, through posix_spawn, and runs nft scripts
// through libnftables with ctypes, which python3-minimal lacks) and the namespace tools for
// namespace machines, mmdebstrap to build bases, nftables for the machines' network policy, e2fsprogs for sized
// machine disks, QEMU for the qemu driver. Installed from the system's own apt sources when
// missing (root only; elsewhere the step says what to install and goes on).

const DEBIAN_PACKAGES = [
  "crun",
  "golang-github-containers-common",
  "lxcfs",
  "bubblewrap", // only for bench/machines.ts's baseline (the old driver)
  "mmdebstrap",
  "nftables",
  "e2fsprogs",
  "iproute2",
  "python3",
  "openssh-client",
  "util-linux",
  "procps",
  "qemu-system-x86",
  "qemu-utils",
  "busybox-static",
  "tmux", // only for test/cli.shell.test.ts (`hangar shell` in a real terminal)
  "chromium", // only for test/console*.test.ts (the web console in a real browser, via playwright-core)
]

const missingPackages = () =>
  DEBIAN_PACKAGES.filter((name) => {
    // biome-ignore lint/suspicious/noTemplateCurlyInString: dpkg-query's own ${Field} format syntax
    const result = run("dpkg-query", ["-W", "--showformat=${Status}", name])
    return result.status !== 0 || !String(result.stdout).includes("install ok installed")
  })

const debianPackages = () => {
  const step = "Debian packages"
  const missing = missingPackages()
  if (missing.length === 0) return say(step, "present")
  if (typeof process.getuid !== "function" || process.getuid() !== 0) {
    return say(step, `missing ${missing.join(" ")} (not root: install them to run machines)`)
  }
  say(step, `installing ${missing.join(" ")}`)
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" }
  runOrFail("apt-get update", "apt-get", ["update", "-qq"], { env })
  runOrFail("apt-get install", "apt-get", ["install", "-y", "-qq", "--no-install-recommends", ...missing], {
    env,
  })
  const still = missingPackages()
  if (still.length > 0) throw new StepError(`still missing after apt-get install: ${still.join(" ")}`)
  say(step, "installed")
}

// ---------------------------------------------------------------------------------------------
// Steps, in order.

const steps = [
  { id: "npm", name: "npm dependencies", run: npmDependencies },
  { id: "nats-server", name: "nats-server", run: natsServer },
  { id: "debian", name: "Debian packages", run: debianPackages },
]

const main = () => {
  const wanted = process.argv.slice(2)
  const unknown = wanted.filter((id) => !steps.some((s) => s.id === id))
  if (unknown.length > 0) {
    process.stderr.write(
      `bootstrap: unknown step ${unknown.join(", ")} (steps: ${steps.map((s) => s.id).join(", ")})\n`,
    )
    process.exit(2)
  }
  for (const step of steps) {
    if (wanted.length > 0 && !wanted.includes(step.id)) continue
    try {
      step.run()
    } catch (e) {
      const why = e instanceof StepError ? e.message : (e?.stack ?? String(e))
      process.stderr.write(`bootstrap: ${step.name} failed: ${why}\n`)
      process.exit(1)
    }
  }
}

main()

/**
 * The guest kernel and the shared initramfs, made once from Debian's kernel package and cached as
 * `<cacheDir>/kernel/<package>-<init hash>/{vmlinuz,initrd.cpio}`. The package (by default the cloud kernel,
 * small and made for virtual machines) is fetched with `apt-get download` and unpacked with
 * `dpkg -x`; only the kernel image and the few modules the init loads are kept. The initramfs is
 * left uncompressed so a machine's own archive can be appended to it by plain concatenation.
 */
import { createHash } from "node:crypto"
import { chmod, mkdir, mkdtemp, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { run } from "../namespace/exec.ts"
import { type Entry, newc } from "./Cpio.ts"
import { initScript, modules } from "./Init.ts"

/** A cached kernel and initramfs. */
export interface Kernel {
  readonly vmlinuz: string
  readonly initrd: string
  /** The kernel package it came from, e.g. `linux-image-6.1.0-56-cloud-amd64`. */
  readonly package: string
}

const exists = (path: string) =>
  stat(path).then(
    () => true,
    () => false,
  )

/** Follows a metapackage (`linux-image-cloud-amd64`) to the versioned package it depends on. */
const resolvePackage = async (name: string): Promise<string> => {
  if (/^linux-image-\d/.test(name)) return name
  const out = await run("apt-cache", ["depends", "--no-recommends", "--no-suggests", name])
  const dep = /Depends: (linux-image-\d\S*)/.exec(out)
  if (!dep?.[1]) throw new Error(`${name} does not depend on a versioned kernel package:\n${out}`)
  return dep[1]
}

const findFile = async (dir: string, name: string): Promise<string | undefined> => {
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, e.name)
    if (e.isDirectory()) {
      const found = await findFile(path, name)
      if (found) return found
    } else if (e.name === name) return path
  }
  return undefined
}

// A module's dependencies, read from its `.modinfo` section (no depmod on the host needed).
const dependsOf = (ko: Buffer): Array<string> => {
  const at = ko.indexOf("\0depends=")
  if (at < 0) return []
  const end = ko.indexOf(0, at + 1)
  const list = ko.subarray(at + 9, end).toString("utf8")
  return list ? list.split(",") : []
}

const build = async (dir: string, pkg: string, busybox: string): Promise<void> => {
  const tmp = await mkdtemp(`${dir}.tmp-`)
  try {
    await run("sh", ["-c", 'cd "$1" && apt-get download -q "$2"', "sh", tmp, pkg])
    const deb = (await readdir(tmp)).find((f) => f.endsWith(".deb"))
    if (!deb) throw new Error(`apt-get download ${pkg} gave no .deb`)
    const x = join(tmp, "x")
    await run("dpkg", ["-x", join(tmp, deb), x])
    const vmlinuz = (await readdir(join(x, "boot"))).find((f) => f.startsWith("vmlinuz-"))
    if (!vmlinuz) throw new Error(`${pkg} holds no vmlinuz`)
    const moduleRoot = join(x, "lib", "modules")
    const entries: Array<Entry> = [
      { type: "dir", path: "bin" },
      { type: "file", path: "bin/busybox", data: await readFile(busybox), mode: 0o755 },
      { type: "file", path: "init", data: Buffer.from(initScript), mode: 0o755 },
      { type: "dir", path: "lib" },
      { type: "dir", path: "lib/modules" },
    ]
    for (const m of modules) {
      const path = await findFile(moduleRoot, `${m}.ko`)
      if (!path) throw new Error(`${pkg} has no module ${m} (built in kernels are not supported yet)`)
      const ko = await readFile(path)
      const missing = dependsOf(ko).filter((d) => !(modules as ReadonlyArray<string>).includes(d))
      if (missing.length > 0)
        throw new Error(`module ${m} needs ${missing.join(", ")}, which the init does not load`)
      entries.push({ type: "file", path: `lib/modules/${m}.ko`, data: ko })
    }
    const out = join(tmp, "out")
    await mkdir(out)
    await rename(join(x, "boot", vmlinuz), join(out, "vmlinuz"))
    await writeFile(join(out, "initrd.cpio"), newc(entries))
    await chmod(out, 0o755)
    // One rename publishes the finished kernel; a reader never sees a half-made one.
    await rename(out, dir)
  } finally {
    await rm(tmp, { recursive: true, force: true })
  }
}

/** A lock folder held while `f` runs; a lock older than 30 minutes is taken as abandoned. */
export const withLock = async <A>(lock: string, f: () => Promise<A>): Promise<A> => {
  for (;;) {
    try {
      await mkdir(lock)
      break
    } catch {
      const age = await stat(lock).then(
        (s) => Date.now() - s.mtimeMs,
        () => 0,
      )
      if (age > 30 * 60_000) await rm(lock, { recursive: true, force: true })
      else await new Promise((r) => setTimeout(r, 500))
    }
  }
  try {
    return await f()
  } finally {
    await rm(lock, { recursive: true, force: true })
  }
}

/** The kernel of package `name` and its initramfs, fetched and made on first use. */
export const ensure = async (cacheDir: string, name: string, busybox: string): Promise<Kernel> => {
  const kernels = join(cacheDir, "kernel")
  await mkdir(kernels, { recursive: true })
  // The initramfs changes with the init, so the init is part of the cache key.
  const recipe = createHash("sha256").update(initScript).update(modules.join(",")).digest("hex").slice(0, 12)
  let pkg: string
  try {
    pkg = await resolvePackage(name)
  } catch (e) {
    // Without apt's package lists (offline, or before `apt-get update`) the newest kernel already
    // made will do.
    const made = (await readdir(kernels)).filter(
      (d) => d.startsWith("linux-image-") && d.endsWith(`-${recipe}`),
    )
    const newest = made.sort().at(-1)
    if (!newest) throw e
    pkg = newest.slice(0, -recipe.length - 1)
  }
  const dir = join(kernels, `${pkg}-${recipe}`)
  const kernel = { vmlinuz: join(dir, "vmlinuz"), initrd: join(dir, "initrd.cpio"), package: pkg }
  if (await exists(dir)) return kernel
  return withLock(join(kernels, `.lock-${pkg}`), async () => {
    if (!(await exists(dir))) await build(dir, pkg, busybox)
    return kernel
  })
}

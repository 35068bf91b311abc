/**
 * A machine's disks. The base becomes an ext4 image once (cached as
 * `<cacheDir>/bases/<base>-<path hash>.ext4`, read-only, never written again); each machine's root
 * disk is a qcow2 overlay backed by it, so the machine's writes land only in its own folder. The
 * `/workspace` disk is a sparse ext4 image of the size's capacity, so a full disk is a real ENOSPC
 * in the guest.
 */
import { createHash, randomBytes } from "node:crypto"
import { closeSync, openSync, truncateSync, utimesSync } from "node:fs"
import { chmod, mkdir, readdir, rename, rm, stat } from "node:fs/promises"
import { basename, dirname, join, resolve } from "node:path"
import { alive } from "../MachineDriver.ts"
import { run } from "../namespace/exec.ts"
import { withLock } from "./Kernel.ts"

const exists = (path: string) =>
  stat(path).then(
    () => true,
    () => false,
  )

const MKFS = ["-q", "-F", "-m", "0"] as const
const LAZY = ["lazy_itable_init=1", "lazy_journal_init=1", "nodiscard"] as const
const mkfs = (image: string, extra: ReadonlyArray<string>) =>
  run("mkfs.ext4", [...MKFS, "-E", LAZY.join(","), ...extra, image])

/** A sparse file of `bytes` (synchronous: three steps on a new file, each waiting its turn else). */
const sparseFile = (path: string, bytes: number) => {
  closeSync(openSync(path, "wx"))
  truncateSync(path, bytes)
}

/** The read-only ext4 image of the base folder `rootfs`, made on first use; its path. */
export const baseImage = async (cacheDir: string, rootfs: string, headroomBytes: number): Promise<string> => {
  const folder = resolve(rootfs)
  const name = basename(folder) === "rootfs" ? basename(dirname(folder)) : basename(folder)
  const hash = createHash("sha256").update(folder).digest("hex").slice(0, 8)
  const dir = join(cacheDir, "bases")
  const image = join(dir, `${name}-${hash}.ext4`)
  if (await exists(image)) return image
  await mkdir(dir, { recursive: true })
  return withLock(join(dir, `.lock-${name}-${hash}`), async () => {
    if (await exists(image)) return image
    const used = Number((await run("du", ["-sb", folder])).split("\t")[0])
    // The root filesystem's free space is what the machine may add outside /workspace.
    const bytes = Math.ceil((used * 1.3 + headroomBytes) / 4096) * 4096
    const tmp = `${image}.tmp-${process.pid}`
    await rm(tmp, { force: true })
    try {
      sparseFile(tmp, bytes)
      await mkfs(tmp, ["-L", "hangar-root", "-d", folder])
      await chmod(tmp, 0o444)
      await rename(tmp, image)
    } catch (e) {
      await rm(tmp, { force: true })
      throw e
    }
    return image
  })
}

/** A copy-on-write root disk at `path` over the base image. */
export const overlay = (path: string, base: string) =>
  run("qemu-img", ["create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, path])

// An empty workspace filesystem: without the resize inode, which reserves room to grow the
// filesystem 1,024 times while mounted, which a machine's disk never does (its size is its
// machine's), and mkfs wrote and synced 4 MiB of it on every start (a 16 GiB disk: 36 → 10 ms,
// 1,079 → 53 writes).
const WORKSPACE_FS = ["-L", "workspace", "-O", "^resize_inode"] as const

/** An empty ext4 disk of `bytes` at `path` (sparse: only what is written takes space). */
export const workspace = async (path: string, bytes: number) => {
  sparseFile(path, bytes)
  await mkfs(path, WORKSPACE_FS)
}

/** How many empty disks a templates folder keeps, the least recently used removed first. */
export const KEPT_TEMPLATES = 8

const TEMPLATE_NAME = /^workspace-\d+-[0-9a-f]+\.ext4$/

/**
 * Tidies the templates folder `dir` once `made` is in it: removes the templates half made by
 * processes that ended before they were done, and all but the `KEPT_TEMPLATES` last used (a
 * template's time is its last use). Machine sizes are few; tests' made-up sizes are not.
 */
const tidy = async (dir: string, made: string) => {
  const kept: Array<{ readonly path: string; readonly used: number }> = []
  for (const name of await readdir(dir)) {
    const path = join(dir, name)
    const pid = Number(/\.tmp-(\d+)-[0-9a-f]+$/.exec(name)?.[1])
    if (Number.isInteger(pid) && !(await alive(pid))) await rm(path, { force: true })
    else if (TEMPLATE_NAME.test(name) && path !== made) {
      const st = await stat(path).catch(() => undefined)
      if (st !== undefined) kept.push({ path, used: st.mtimeMs })
    }
  }
  kept.sort((a, b) => b.used - a.used)
  for (const { path } of kept.slice(KEPT_TEMPLATES - 1)) await rm(path, { force: true })
}

// Templates being made, by path: machines made meanwhile wait for the one mkfs.
const making = new Map<string, Promise<string>>()
const TEMPLATE_RECIPE = createHash("sha256")
  .update(JSON.stringify([MKFS, LAZY, WORKSPACE_FS]))
  .digest("hex")
  .slice(0, 10)

/**
 * The empty workspace disk of `bytes` (root-owned, read-only), in folder `dir`, made on first use
 * and kept there for every later machine and host agent process: a machine's disk is a sparse copy
 * of it (`machine-root.pl`: its ~270 KB of written blocks, of a 16 GiB disk), where a mkfs took ~12
 * ms of every machine's start, in a tool run of its own. Its name carries the mkfs arguments, so a
 * template made otherwise is never taken for it. Every disk copied from one template has that
 * template's filesystem UUID; nothing in a machine or on the host goes by it. Each use marks it
 * used (its time), and the folder keeps the `KEPT_TEMPLATES` last used.
 */
export const workspaceTemplate = (dir: string, bytes: number): Promise<string> => {
  const path = join(dir, `workspace-${bytes}-${TEMPLATE_RECIPE}.ext4`)
  try {
    const now = new Date()
    utimesSync(path, now, now)
    return Promise.resolve(path)
  } catch {
    // not made yet (or removed as the least used): made below
  }
  const under = making.get(path)
  if (under !== undefined) return under
  const made = (async () => {
    await mkdir(dir, { recursive: true })
    const tmp = `${path}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`
    try {
      await workspace(tmp, bytes)
      await chmod(tmp, 0o444)
      await rename(tmp, path)
    } finally {
      await rm(tmp, { force: true })
    }
    await tidy(dir, path)
    return path
  })().finally(() => making.delete(path))
  making.set(path, made)
  return made
}

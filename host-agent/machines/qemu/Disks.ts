/**
 * A machine's disks. The base becomes an ext4 image once (cached as
 * `<cacheDir>/bases/<base>-<path hash>.ext4`, read-only, never written again); each machine's root
 * disk is a qcow2 overlay backed by it, so the machine's writes land only in its own folder. The
 * `/workspace` disk is a sparse ext4 image of the size's capacity, so a full disk is a real ENOSPC
 * in the guest.
 */
import { createHash } from "node:crypto"
import { closeSync, openSync, truncateSync } from "node:fs"
import { chmod, mkdir, rename, rm, stat } from "node:fs/promises"
import { basename, dirname, join, resolve } from "node:path"
import { run } from "../namespace/exec.ts"
import { withLock } from "./Kernel.ts"

const exists = (path: string) =>
  stat(path).then(
    () => true,
    () => false,
  )

const mkfs = (image: string, extra: ReadonlyArray<string>, extended: ReadonlyArray<string> = []) =>
  run("mkfs.ext4", [
    "-q",
    "-F",
    "-m",
    "0",
    "-E",
    ["lazy_itable_init=1", "lazy_journal_init=1", "nodiscard", ...extended].join(","),
    ...extra,
    image,
  ])

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

/**
 * An ext4 disk of `bytes` at `path` (sparse: only what is written takes space), empty or holding a
 * copy of the folder `seed`, its root owned by `owner` (a machine's root on the host) when given.
 * Without the resize inode: it reserves room to grow the filesystem 1,024 times while mounted, which
 * a machine's disk never does (its size is its machine's), and mkfs wrote and synced 4 MiB of it on
 * every start (a 16 GiB disk: 36 → 10 ms, 1,079 → 53 writes).
 */
export const workspace = async (
  path: string,
  bytes: number,
  options: { readonly seed?: string; readonly owner?: number } = {},
) => {
  sparseFile(path, bytes)
  await mkfs(
    path,
    ["-L", "workspace", "-O", "^resize_inode", ...(options.seed === undefined ? [] : ["-d", options.seed])],
    options.owner === undefined ? [] : [`root_owner=${options.owner}:${options.owner}`],
  )
}

/**
 * Secret files of local mode (the master key, the local issuer's key, the link-signing key): read
 * the file, or create it once. Creation writes a private temporary file (0600, fsynced) and
 * hard-links it to the real name, which fails if the name exists: of several processes starting
 * at once, exactly one file wins and every process reads that one. The folder is fsynced so the
 * name survives a power cut before anything is protected by the key it names.
 */
import { randomBytes } from "node:crypto"
import { link, mkdir, open, readFile, unlink } from "node:fs/promises"
import { dirname } from "node:path"

const isCode = (error: unknown, code: string) => (error as { code?: unknown } | null)?.code === code

const fsync = async (path: string) => {
  const handle = await open(path, "r")
  try {
    await handle.sync()
  } finally {
    await handle.close()
  }
}

const createOnce = async (file: string, content: Uint8Array): Promise<void> => {
  const dir = dirname(file)
  await mkdir(dir, { recursive: true, mode: 0o700 })
  const temp = `${file}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`
  try {
    const handle = await open(temp, "wx", 0o600)
    try {
      await handle.writeFile(content)
      await handle.sync()
    } finally {
      await handle.close()
    }
    try {
      await link(temp, file)
    } catch (error) {
      if (!isCode(error, "EEXIST")) throw error
    }
    await fsync(dir)
  } finally {
    await unlink(temp).catch(() => undefined)
  }
}

/**
 * The content of `file`, creating it with `make()` when it does not exist. `make` runs only when
 * this process tries to create the file; its bytes are zeroed afterwards whether or not they won.
 */
export const readOrCreate = async (file: string, make: () => Uint8Array): Promise<Buffer> => {
  try {
    return await readFile(file)
  } catch (error) {
    if (!isCode(error, "ENOENT")) throw error
  }
  const fresh = make()
  try {
    await createOnce(file, fresh)
  } finally {
    fresh.fill(0)
  }
  return readFile(file)
}

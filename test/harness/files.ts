/** Looking through folders the way an attacker with the disk would. */
import { readdir, readFile } from "node:fs/promises"
import { join } from "node:path"

/** The files under `dir` (in its entries `keep` accepts) whose bytes contain `text`. */
export const filesHolding = async (
  dir: string,
  text: string | Uint8Array,
  keep: (name: string) => boolean = () => true,
): Promise<Array<string>> => {
  const found: Array<string> = []
  const needle = typeof text === "string" ? Buffer.from(text) : Buffer.from(text)
  const walk = async (at: string, top: boolean): Promise<void> => {
    for (const entry of await readdir(at, { withFileTypes: true }).catch(() => [])) {
      if (top && !keep(entry.name)) continue
      const path = join(at, entry.name)
      if (entry.isDirectory()) await walk(path, false)
      else if (entry.isFile() && (await readFile(path).catch(() => Buffer.alloc(0))).includes(needle))
        found.push(path)
    }
  }
  await walk(dir, true)
  return found
}

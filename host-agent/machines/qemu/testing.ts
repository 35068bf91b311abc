/** Helpers for tests that make real qemu machines. */

import { readdir, readFile, stat } from "node:fs/promises"
import { join } from "node:path"
import { halfMadeOf } from "../MachineDriver.ts"
import { QemuDriverSettings } from "./QemuDriver.ts"

/** Everything machine `id` could have left behind on the host (its folder, a process naming it); empty when clean. */
export const leftovers = async (id: string, machinesDir = QemuDriverSettings.defaults.machinesDir) => {
  const found: Array<string> = []
  const dir = join(machinesDir, id)
  if (
    await stat(dir).then(
      () => true,
      () => false,
    )
  )
    found.push(`folder ${dir}`)
  for (const f of await readdir(machinesDir).catch(() => [] as Array<string>))
    if (f.startsWith(halfMadeOf(id))) found.push(`half-made folder ${f}`)
  for (const pid of await readdir("/proc")) {
    if (!/^\d+$/.test(pid)) continue
    const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")
    if (cmdline.includes(dir)) found.push(`process ${pid}: ${cmdline.replaceAll("\0", " ").slice(0, 200)}`)
  }
  return found
}

/** Helpers for tests that make real namespace machines. */

import { randomBytes } from "node:crypto"
import { readdir, readFile, stat } from "node:fs/promises"
import { join } from "node:path"
import * as Policy from "../../network/Policy.ts"
import { halfMadeOf, newKeyPair } from "../MachineDriver.ts"
import * as Cgroups from "./Cgroups.ts"
import { run } from "./exec.ts"
import { NamespaceDriverSettings } from "./NamespaceDriver.ts"
import * as Net from "./Net.ts"

/**
 * The driver settings of tests: the defaults, with machine disks promised 16 times over (tests run
 * many 16 GiB machines on small CI disks; the admission test uses the defaults).
 */
export const testDriverSettings = { ...NamespaceDriverSettings.defaults, diskOvercommit: 16 }

/** A fresh client key pair and host key pair. */
export const newKeys = () => ({ client: newKeyPair(), host: newKeyPair() })

/** A machine id unique to this test run. */
export const testId = (label: string) => `t${label}_${randomBytes(5).toString("hex")}`

const exists = (path: string) =>
  stat(path).then(
    () => true,
    () => false,
  )

/**
 * Everything machine `id` could have left behind on the host, by kind; empty when clean. `places`
 * names the host agent's folders when they are not the defaults (another host agent of a test).
 */
export const leftovers = async (
  id: string,
  places: Pick<
    typeof NamespaceDriverSettings.defaults,
    "machinesDir" | "runDir"
  > = NamespaceDriverSettings.defaults,
): Promise<Array<string>> => {
  const s = { ...NamespaceDriverSettings.defaults, ...places }
  const found: Array<string> = []
  const dir = join(s.machinesDir, id)
  // What the folder still holds tells a claim (owner, kept.json) from a machine half removed.
  if (await exists(dir))
    found.push(`folder ${dir} (${(await readdir(dir).catch(() => [] as Array<string>)).join(", ")})`)
  for (const f of await readdir(s.machinesDir).catch(() => [] as Array<string>))
    if (f.startsWith(halfMadeOf(id))) found.push(`half-made folder ${f}`)
  for (const c of Cgroups.hierarchies(s.cgroupRoot)) {
    if (await exists(Cgroups.groupOf(s.cgroupRoot, c, id))) found.push(`cgroup ${c}/hangar/${id}`)
  }
  if (await exists(join(s.runDir, "crun", id))) found.push("crun state")
  const links = await run("ip", ["-o", "link", "show"])
  if (links.includes(Net.hostIfOf(id))) found.push(`veth ${Net.hostIfOf(id)}`)
  if ((await run("ip", ["netns", "list"])).includes(Net.netnsOf(id))) found.push(`netns ${Net.netnsOf(id)}`)
  if (Net.leased(s.runDir, id)) found.push("network lease")
  found.push(...(await Policy.traces(Policy.PolicySettings.defaults, Net.hostIfOf(id))))
  for (const line of (await run("losetup", ["-a"])).split("\n"))
    if (line.includes(`${dir}/`)) found.push(`loop device: ${line.trim()}`)
  // Mounts and processes: look through every process's view of the mounts and its command line.
  for (const pid of await readdir("/proc")) {
    if (!/^\d+$/.test(pid)) continue
    const mounts = await readFile(`/proc/${pid}/mountinfo`, "utf8").catch(() => "")
    if (mounts.includes(dir)) found.push(`mount seen by pid ${pid}`)
    const cmdline = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")
    if (cmdline.includes(dir) || cmdline.includes(Net.netnsOf(id))) found.push(`process ${pid}`)
  }
  return found
}

/**
 * Machine address pools for the extra host agents of a test (`Stack.startExtra("host")`): each
 * gets a /16 of its own, as separate hosts would, so two host agents with their own run folders
 * (and so their own address leases) never hand out the same address. The default pool
 * (`10.213.0.0`) stays the main host agents'; these come from `10.214.0.0` up, claimed across test
 * processes by a file each in `/run/hangar-test-pools/` (created exclusively, naming the claiming
 * process; a claim whose process is gone is taken over).
 */
import { mkdir, readFile, unlink, writeFile } from "node:fs/promises"
import { join } from "node:path"

const claims = "/run/hangar-test-pools"
const first = 214
const last = 250

/** A claimed pool: its first address (`HANGAR_MACHINE_ADDRESS_POOL`) and its release. */
export interface AddressPool {
  readonly address: string
  readonly release: () => Promise<void>
}

const running = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/** Claims a free pool for this process. */
export const claimAddressPool = async (): Promise<AddressPool> => {
  await mkdir(claims, { recursive: true })
  for (let second = first; second <= last; second++) {
    const address = `10.${second}.0.0`
    const file = join(claims, address)
    const claim = async () => {
      await writeFile(file, String(process.pid), { flag: "wx" })
      return { address, release: () => unlink(file).catch(() => undefined) }
    }
    try {
      return await claim()
    } catch {
      const owner = Number(await readFile(file, "utf8").catch(() => "0"))
      if (Number.isInteger(owner) && owner > 0 && running(owner)) continue
      await unlink(file).catch(() => undefined)
      try {
        return await claim()
      } catch {}
    }
  }
  throw new Error(`no free test address pool among 10.${first}–${last}.0.0`)
}

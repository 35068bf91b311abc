/**
 * Machine networks: each machine gets its own network namespace joined to the host by a veth
 * pair on a /30 from a private pool. Slots are leased with exclusive-create files under the run
 * folder, so several host-agent processes (or test files) never hand out the same addresses.
 */
import { createHash } from "node:crypto"
import { mkdirSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { readText } from "../HostFiles.ts"
import { network, run } from "./exec.ts"

/** The addresses and names of one machine's network. */
export interface NetLease {
  readonly slot: number
  readonly netns: string
  readonly hostIf: string
  readonly hostAddress: string
  readonly guestAddress: string
}

const SLOTS = 16384 // a /16 pool cut into /30s

const addressOf = (pool: string, slot: number, offset: number) => {
  const [a, b] = pool.split(".").map(Number)
  const n = slot * 4 + offset
  return `${a}.${b}.${n >> 8}.${n & 255}`
}

/** The netns of machine `id`. */
export const netnsOf = (id: string) => `hangar-${id}`

/** The host-side interface of machine `id` (interface names are at most 15 bytes). */
export const hostIfOf = (id: string) => `hg${createHash("sha256").update(id).digest("hex").slice(0, 12)}`

const leaseOf = (pool: string, id: string, slot: number): NetLease => ({
  slot,
  netns: netnsOf(id),
  hostIf: hostIfOf(id),
  hostAddress: addressOf(pool, slot, 1),
  guestAddress: addressOf(pool, slot, 2),
})

/**
 * Leases a free slot for machine `id`. The slot files are in the run folder (a tmpfs): written
 * synchronously, as the machine folder's small files.
 */
export const lease = async (runDir: string, pool: string, id: string): Promise<NetLease> => {
  const slots = join(runDir, "net", "slot")
  mkdirSync(slots, { recursive: true })
  mkdirSync(join(runDir, "net", "by-id"), { recursive: true })
  const start = Math.floor(Math.random() * SLOTS)
  for (let i = 0; i < SLOTS; i++) {
    const slot = (start + i) % SLOTS
    try {
      writeFileSync(join(slots, String(slot)), id, { flag: "wx" })
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "EEXIST") continue // another machine's
      throw e
    }
    writeFileSync(slotFileOf(runDir, id), String(slot))
    return leaseOf(pool, id, slot)
  }
  throw new Error("no free network slot")
}

/**
 * Whether machine `id` holds a slot. Only such an id may have a network: the slot is leased before
 * any part of it is made, and the drivers give it back only once those parts are removed. An id
 * without one (a claim no machine took over, a machine already removed) has none to take down.
 */
export const leased = (runDir: string, id: string): boolean => readText(slotFileOf(runDir, id)) !== undefined

/** The file naming the slot machine `id` holds. */
const slotFileOf = (runDir: string, id: string) => join(runDir, "net", "by-id", id)

/** Gives back the slot of machine `id`, if it holds one. */
export const release = async (runDir: string, id: string): Promise<void> => {
  const byId = slotFileOf(runDir, id)
  const slot = readText(byId)
  if (slot !== undefined) rmSync(join(runDir, "net", "slot", slot.trim()), { force: true })
  rmSync(byId, { force: true })
}

/**
 * Makes the netns (or names the one process `pid` is in) and the veth pair, addressed and up,
 * with a default route to the host side. With `bytesPerSecond`, each direction is shaped to it:
 * traffic to the machine on the host end, traffic from it on its own end (the machine has no
 * `CAP_NET_ADMIN`, so it cannot lift it). Made by the tool helper over rtnetlink (`exec.ts`
 * `network`), as these would make it:
 *
 *     ip netns attach NETNS PID                       (without a pid: ip netns add NETNS)
 *     ip link add HOSTIF type veth peer name eth0 netns NETNS
 *     ip addr add HOST/30 dev HOSTIF; ip link set HOSTIF up
 *     ip route add GUEST/32 dev HOSTIF quickack 1
 *     ip -n NETNS addr add GUEST/30 dev eth0; ip -n NETNS link set lo up; … link set eth0 up
 *     ip -n NETNS route add default via HOST
 *     tc [-n NETNS] qdisc replace dev HOSTIF|eth0 root tbf rate Bbps burst max(64 KiB, B/50) latency 50ms
 *
 * The host route's `quickack`: the host ACKs the machine's packets at once. The guest's sshd leaves
 * Nagle on for sessions without a terminal (every command's), so each answer after the first waits
 * for an ACK, and a delayed one costs ~40 ms (a connect's file channel, a command's end).
 */
export const up = async (
  n: NetLease,
  options: { readonly pid?: number; readonly bytesPerSecond?: number } = {},
): Promise<void> => {
  const { pid, bytesPerSecond } = options
  if (pid === undefined) await run("ip", ["netns", "add", n.netns])
  await network("up", [
    n.netns,
    pid === undefined ? "" : String(pid),
    n.hostIf,
    n.hostAddress,
    n.guestAddress,
    bytesPerSecond === undefined ? "" : String(bytesPerSecond),
  ])
}

/** Removes the veth pair and the netns of machine `id`; missing parts are fine. */
export const down = async (id: string): Promise<void> => {
  // Deleting one end of a veth pair deletes both; then the netns, going on past a missing part.
  await network("down", [hostIfOf(id), netnsOf(id)]).catch(() => undefined)
}

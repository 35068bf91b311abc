/**
 * A machine's network as the tool helper makes it over rtnetlink (`Net.up`, `Net.down`): the same
 * links, addresses, routes and shaping as the `ip` and `tc` runs it replaced (both made side by
 * side and compared), the netns of a process named by its pid, every part removed (and removing
 * again is fine), and refusals that name what failed and leave nothing behind.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { existsSync, readFileSync, statSync } from "node:fs"
import { afterAll, describe, expect, it } from "vitest"
import { run } from "./exec.ts"
import { NamespaceDriverSettings } from "./NamespaceDriver.ts"
import * as Net from "./Net.ts"
import { testId } from "./testing.ts"

const s = NamespaceDriverSettings.defaults
const RATE = 25_000_000
const leases: Array<Net.NetLease & { id: string }> = []
const children: Array<ChildProcess> = []

const leased = async (label: string) => {
  const id = testId(label)
  const lease = { ...(await Net.lease(s.runDir, s.addressPool, id)), id }
  leases.push(lease)
  return lease
}

afterAll(async () => {
  for (const l of leases) {
    await Net.down(l.id)
    await Net.release(s.runDir, l.id)
  }
  for (const c of children) c.kill("SIGKILL")
})

/** The network `ip` and `tc` made before the helper did it (the same commands, by the programs). */
const byTools = async (n: Net.NetLease) => {
  await run("ip", ["-batch", "-"], {
    input: [
      `netns add ${n.netns}`,
      `link add ${n.hostIf} type veth peer name eth0 netns ${n.netns}`,
      `addr add ${n.hostAddress}/30 dev ${n.hostIf}`,
      `link set ${n.hostIf} up`,
      `route add ${n.guestAddress}/32 dev ${n.hostIf} quickack 1`,
    ].join("\n"),
  })
  await run("ip", ["-n", n.netns, "-batch", "-"], {
    input: [
      `addr add ${n.guestAddress}/30 dev eth0`,
      "link set lo up",
      "link set eth0 up",
      `route add default via ${n.hostAddress}`,
    ].join("\n"),
  })
  const tbf = (dev: string) =>
    `qdisc replace dev ${dev} root tbf rate ${RATE}bps burst ${Math.max(65536, Math.ceil(RATE / 50))} latency 50ms`
  await run("tc", ["-batch", "-"], { input: tbf(n.hostIf) })
  await run("tc", ["-n", n.netns, "-batch", "-"], { input: tbf("eth0") })
}

/**
 * What the kernel holds of `n`'s network, both ends, as `ip` and `tc` show it, with its names and
 * addresses as placeholders and what the kernel picks itself (indexes, MACs, qdisc handles) left out.
 */
const view = async (n: Net.NetLease) => {
  const both = async (args: Array<string>, dev: string) => ({
    host: JSON.parse(await run(args[0] as string, [...args.slice(1), "dev", n.hostIf])),
    guest: JSON.parse(await run(args[0] as string, ["-n", n.netns, ...args.slice(1), "dev", dev])),
  })
  const links = await both(["ip", "-j", "link", "show"], "eth0")
  const lo = JSON.parse(await run("ip", ["-n", n.netns, "-j", "link", "show", "dev", "lo"]))
  const addresses = await both(["ip", "-j", "-4", "addr", "show"], "eth0")
  const routes = await both(["ip", "-j", "-d", "-4", "route", "show"], "eth0")
  const qdiscs = await both(["tc", "-j", "qdisc", "show"], "eth0")
  const pick = (l: { flags: unknown; mtu: unknown; operstate: unknown; qdisc: unknown }) => ({
    flags: l.flags,
    mtu: l.mtu,
    operstate: l.operstate,
    qdisc: l.qdisc,
  })
  const shown = JSON.stringify({
    links: { host: links.host.map(pick), guest: links.guest.map(pick), lo: lo.map(pick) },
    addresses: {
      host: addresses.host.map((a: { addr_info: unknown }) => a.addr_info),
      guest: addresses.guest.map((a: { addr_info: unknown }) => a.addr_info),
    },
    routes,
    qdiscs: {
      host: qdiscs.host.map(({ handle: _, ...q }: { handle: unknown }) => q),
      guest: qdiscs.guest.map(({ handle: _, ...q }: { handle: unknown }) => q),
    },
  })
  return JSON.parse(
    shown
      .replaceAll(n.hostIf, "HOSTIF")
      .replaceAll(n.netns, "NETNS")
      .replaceAll(n.hostAddress, "HOST")
      .replaceAll(n.guestAddress, "GUEST")
      .replaceAll(
        n.hostAddress.replace(/\d+$/, (last) => String(Number(last) - 1)),
        "SUBNET",
      ),
  )
}

/**
 * `view(n)` once both ends' operational state is up (the kernel sets it apart from the link's
 * flags, a moment after both ends are up), or after 5 s.
 */
const settled = async (n: Net.NetLease) => {
  const deadline = Date.now() + 5_000
  for (;;) {
    const seen = await view(n)
    const up = [...seen.links.host, ...seen.links.guest].every(
      (l: { operstate: string }) => l.operstate === "UP",
    )
    if (up || Date.now() > deadline) return seen
    await new Promise((r) => setTimeout(r, 20))
  }
}

const gone = async (n: Net.NetLease) => ({
  link: (await run("ip", ["-o", "link", "show"])).includes(n.hostIf),
  netns: (await run("ip", ["netns", "list"])).includes(n.netns),
  file: existsSync(`/run/netns/${n.netns}`),
  mount: readFileSync("/proc/self/mountinfo", "utf8").includes(`/run/netns/${n.netns} `),
})
const nothing = { link: false, netns: false, file: false, mount: false }

describe("machine network", () => {
  it("is what the ip and tc runs made: links up, addresses, routes (quickack to the machine), shaping both ways", async () => {
    const [tools, helper] = [await leased("nettools"), await leased("nethelper")]
    await byTools(tools)
    await Net.up(helper, { bytesPerSecond: RATE })
    const made = await settled(helper)
    expect(made).toEqual(await settled(tools))
    // Not an empty view that happens to match: the parts are there, as named.
    expect(made.links.host[0].flags).toContain("UP")
    expect(made.links.guest[0].operstate).toBe("UP")
    expect(made.addresses.guest[0][0]).toMatchObject({ local: "GUEST", prefixlen: 30 })
    expect(JSON.stringify(made.routes.host)).toContain('"quickack":1')
    expect(made.routes.guest).toContainEqual(expect.objectContaining({ dst: "default", gateway: "HOST" }))
    expect(made.qdiscs.guest[0]).toMatchObject({ kind: "tbf", options: { rate: RATE } })
    for (const n of [tools, helper]) {
      await Net.down(n.id)
      expect(await gone(n)).toEqual(nothing)
    }
    // Removing what is gone already is fine.
    await Net.down(helper.id)
    expect(await gone(helper)).toEqual(nothing)
  })

  it("takes the netns of a process by its pid; refuses a second network of the same names, and a pid that is no process, leaving nothing", async () => {
    const n = await leased("netpid")
    const child = spawn("unshare", ["--net", "sleep", "120"], { stdio: "ignore" })
    children.push(child)
    const pid = child.pid as number
    // unshare has made the netns once it is sleep.
    for (let i = 0; i < 200 && !readFileSync(`/proc/${pid}/cmdline`, "utf8").startsWith("sleep"); i++)
      await new Promise((r) => setTimeout(r, 10))
    await Net.up(n, { pid })
    expect(statSync(`/run/netns/${n.netns}`).ino).toBe(statSync(`/proc/${pid}/ns/net`).ino)
    expect(await run("ip", ["-n", n.netns, "-4", "-o", "addr", "show", "dev", "eth0"])).toContain(
      `${n.guestAddress}/30`,
    )
    await expect(Net.up(n, { pid })).rejects.toThrow(`File exists: /run/netns/${n.netns}`)
    // The first is untouched.
    expect(await run("ip", ["-n", n.netns, "-4", "-o", "addr", "show", "dev", "eth0"])).toContain(
      `${n.guestAddress}/30`,
    )
    await Net.down(n.id)
    expect(await gone(n)).toEqual(nothing)

    const lost = await leased("netlost")
    await expect(Net.up(lost, { pid: 0x3fffffff })).rejects.toThrow(
      `netns attach ${lost.netns} ${0x3fffffff}: No such file or directory`,
    )
    expect(await gone(lost)).toEqual(nothing)
  })

  it("refuses a host interface name in use, naming the step", async () => {
    const n = await leased("netused")
    await run("ip", ["link", "add", n.hostIf, "type", "veth", "peer", "name", `z${n.hostIf}`])
    try {
      await expect(Net.up(n)).rejects.toThrow(`link add ${n.hostIf}: File exists`)
    } finally {
      await run("ip", ["link", "del", n.hostIf])
    }
  })
})

import { randomBytes } from "node:crypto"
import { ConfigProvider, Effect, Layer } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { run } from "../machines/namespace/exec.ts"
import * as Policy from "./Policy.ts"

const defaults = Policy.PolicySettings.defaults
const guest = { iface: "hgabc123", guestAddress: "10.213.4.6" }

// `nft --check` asks the kernel to validate a script without committing anything.
const check = (script: string) => run("nft", ["--check", "-f", "-"], { input: `${script}\n` })

describe("rendering", () => {
  it("forbids the spec's ranges, port 25 and other sources, and limits new connections", () => {
    const base = Policy.renderBase(defaults)
    for (const range of [
      "10.0.0.0/8",
      "172.16.0.0/12",
      "192.168.0.0/16",
      "100.64.0.0/10",
      "169.254.0.0/16",
    ]) {
      expect(base).toContain(range)
    }
    const machine = Policy.renderAttach(defaults, guest)
    expect(machine).toContain("add rule inet hangar m_hgabc123 meta nfproto != ipv4 drop")
    expect(machine).toContain("ip saddr != 10.213.4.6 drop")
    expect(machine).toContain("ip daddr @forbidden4 goto refuse")
    expect(machine).toContain("th dport 25 goto refuse")
    expect(machine).toContain("oifname != @uplinks goto refuse")
    expect(machine).toContain("ct state new limit rate over 200/second burst 20 packets goto refuse")
    expect(machine).toContain('add element inet hangar guests { "hgabc123" : jump m_hgabc123 }')
  })

  it("masquerades only when the setting is on", async () => {
    const off = Policy.renderBase(defaults)
    expect(off).not.toContain(" masquerade\n")
    expect(off).toContain("delete chain inet hangar postrouting")
    const on = Policy.renderBase({ ...defaults, masquerade: true, uplinks: "eth0" })
    expect(on).toContain(
      "add rule inet hangar postrouting oifname @uplinks ip saddr @masquerade_sources masquerade",
    )
    expect(on).toContain('add element inet hangar uplinks { "eth0" }')
    expect(on).toContain("add element inet hangar masquerade_sources { 10.213.0.0/16 }")
    // Both are valid rule sets (checked only: a test never turns masquerading on).
    for (const base of [off, on]) await check(`${base}\n${Policy.renderAttach(defaults, guest)}`)
    await check(Policy.renderDetach(defaults, guest.iface))
  })

  it("a host agent from the environment lets machines out by the default route, masqueraded; tests never", async () => {
    const fromEnv = (vars: Record<string, string>) =>
      Effect.runPromise(
        Effect.provide(
          Policy.PolicySettings.Tag,
          Layer.provide(
            Policy.PolicySettings.layerFromEnv,
            Layer.setConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(vars)))),
          ),
        ),
      )
    const deployed = await fromEnv({})
    expect(deployed.uplinks).toBe("auto")
    expect(deployed.masquerade).toBe(true)
    // The code's defaults, and this test run's environment (vitest.config.ts), reach nothing.
    expect(defaults.uplinks).toBe("")
    expect(defaults.masquerade).toBe(false)
    expect(process.env.HANGAR_MACHINE_UPLINKS).toBe("none")
    const off = await fromEnv({ HANGAR_MACHINE_UPLINKS: "none", HANGAR_MACHINE_MASQUERADE: "false" })
    expect(Policy.renderBase(off)).not.toContain("add element inet hangar uplinks")

    // `auto` is the interface of the host's default route, checked against `ip route` itself.
    const routes = JSON.parse(await run("ip", ["-j", "-4", "route", "show", "default"])) as Array<{
      dev: string
    }>
    const resolved = await Policy.resolveUplinks(deployed)
    expect(resolved.uplinks).toBe([...new Set(routes.map((r) => r.dev))].join(","))
    const base = Policy.renderBase(resolved)
    for (const dev of new Set(routes.map((r) => r.dev))) expect(base).toContain(`"${dev}"`)
    expect(base).toContain("ip saddr @masquerade_sources masquerade")
    // What arrives on an uplink is forwarded only as replies to machines, never routed elsewhere.
    const forward = base.split("\n").filter((l) => l.includes(" forward "))
    const toGuests = forward.findIndex((l) =>
      l.includes("oifname @guest_ifs ct state established,related accept"),
    )
    const fromUplinks = forward.findIndex((l) => l.includes("iifname @uplinks drop"))
    expect(toGuests).toBeGreaterThanOrEqual(0)
    expect(fromUplinks).toBeGreaterThan(toGuests)
    // A valid rule set that still refuses every forbidden range before the uplink (checked only,
    // never committed: no test machine may leave by a real interface).
    await check(`${base}\n${Policy.renderAttach(resolved, guest)}`)
    const machine = Policy.renderAttach(resolved, guest)
    expect(machine.indexOf("@forbidden4 goto refuse")).toBeLessThan(machine.indexOf("oifname != @uplinks"))
    expect(await Policy.resolveUplinks({ ...defaults, uplinks: "eth9" })).toMatchObject({ uplinks: "eth9" })
  })

  it("refuses names and addresses that are not plain, at the interface name's 15-byte limit", () => {
    expect(() => Policy.renderAttach(defaults, { ...guest, iface: "a".repeat(15) })).not.toThrow()
    expect(() => Policy.renderAttach(defaults, { ...guest, iface: "a".repeat(16) })).toThrow(/interface name/)
    expect(() => Policy.renderAttach(defaults, { ...guest, iface: "x; flush ruleset" })).toThrow(
      /interface name/,
    )
    expect(() => Policy.renderAttach(defaults, { ...guest, iface: 'x" }' })).toThrow(/interface name/)
    expect(() => Policy.renderAttach(defaults, { ...guest, guestAddress: "10.0.0.256" })).toThrow(/IPv4/)
    expect(() => Policy.renderAttach(defaults, { ...guest, guestAddress: "1.2.3.4 accept" })).toThrow(/IPv4/)
    expect(() => Policy.renderBase({ ...defaults, uplinks: "eth0,bad name" })).toThrow(/interface name/)
    expect(() =>
      Policy.renderBase({ ...defaults, masquerade: true, masqueradeSources: "10.0.0.0/33" }),
    ).toThrow(/IPv4 range/)
  })

  it("the rate must be a positive integer", () => {
    expect(() => Policy.renderAttach({ ...defaults, newConnectionsPerSecond: 1 }, guest)).not.toThrow()
    expect(() => Policy.renderAttach({ ...defaults, newConnectionsPerSecond: 0 }, guest)).toThrow(
      /newConnectionsPerSecond/,
    )
    expect(() => Policy.renderAttach({ ...defaults, burst: 0 }, guest)).toThrow(/burst/)
  })
})

describe("applying, in a scratch table", () => {
  const tag = randomBytes(4).toString("hex")
  const settings = { ...defaults, table: `hgtest_${tag}` }
  const iface = `hgtd${tag}` // a veth end stands in for a machine's veth

  afterAll(async () => {
    await run("ip", ["link", "del", iface]).catch(() => undefined)
    await run("nft", ["delete", "table", "inet", settings.table]).catch(() => undefined)
  })

  it("attach and detach are per interface and idempotent", async () => {
    await run("ip", ["link", "add", iface, "type", "veth", "peer", "name", `${iface}p`])
    const other = { iface: `${iface}x`, guestAddress: "10.213.9.2" } // attached, never a device
    await Policy.attach(settings, { iface, guestAddress: "10.213.9.6" })
    await Policy.attach(settings, { iface, guestAddress: "10.213.9.6" })
    await Policy.nftScript(Policy.renderAttach(settings, other))
    const listed = await run("nft", ["list", "table", "inet", settings.table])
    expect(listed.split(`chain m_${iface} {`).length - 1).toBe(1)
    expect(listed.split(`"${iface}" : jump m_${iface}`).length - 1).toBe(1)
    expect(await Policy.traces(settings, iface)).toEqual([`nft chain m_${iface}`, `nft element "${iface}"`])
    expect(await run("cat", [`/proc/sys/net/ipv4/conf/${iface}/forwarding`])).toBe("1\n")

    await Policy.detach(settings, iface)
    await Policy.detach(settings, iface)
    await Policy.detach(settings, "hgneverthere")
    expect(await Policy.traces(settings, iface)).toEqual([])
    // The other machine keeps everything it had.
    expect(await Policy.traces(settings, other.iface)).toHaveLength(2)
    await Policy.detach(settings, other.iface)
    expect(await Policy.traces(settings, other.iface)).toEqual([])
  })
})

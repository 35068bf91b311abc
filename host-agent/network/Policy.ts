/**
 * Policy: what a machine's network may reach, enforced on the host in the root network namespace
 * by one nftables table (`inet hangar`). A machine is keyed only by its host-side interface (the
 * namespace driver's veth, a qemu tap) and its guest address, so any driver can use it.
 *
 * Per machine there is one chain `m_<interface>`, one element in the `guests` verdict map (its
 * interface jumps to that chain) and one in the `guest_ifs` set; attaching and detaching replace
 * or remove exactly those, atomically and idempotently, and leave the rest of the table alone.
 *
 * What a machine may do:
 * - open connections only out of an uplink interface (the `uplinks` set: the host's way to the
 *   internet). A host agent started from the environment takes the interface of the host's default
 *   route (`auto`) and masquerades machine addresses out of it, so machines reach the internet as
 *   the spec says; the settings' `defaults` object (what code and tests get without the
 *   environment) names no uplink and does not masquerade, and the test configuration sets
 *   `HANGAR_MACHINE_UPLINKS=none`, so no test machine ever has a way to a real network;
 * - never to a private, shared, link-local (metadata), loopback, multicast or reserved IPv4
 *   range (`forbidden4`), so not to other machines either, and never to port 25;
 * - at most `newConnectionsPerSecond` new connections (conntrack `new`) per second, with a burst of
 *   `burst`; beyond that they are refused;
 * - never to the host itself (input from a machine is only replies to connections the host opened,
 *   which is how the host agent's SSH reaches the guest);
 * - only from its own address (no spoofing), and no IPv6 at all: machines get no IPv6 address or
 *   route, and every IPv6 packet from them is dropped, so the IPv6 private/local ranges
 *   (fc00::/7, fe80::/10, ::1, ::ffff:0:0/96, 64:ff9b::/96…) need no separate list;
 * - nothing from outside opens a connection into a machine (only replies are forwarded to it).
 *
 * Refusals answer at once (a TCP reset, or ICMP admin-prohibited for other protocols) so programs
 * in the machine fail fast instead of waiting out SYN retries. Masquerading out of the uplinks is a
 * production setting, on from the environment's defaults and never turned on by tests.
 */
import { writeFile } from "node:fs/promises"
import { defineSettings, env } from "../../core/Config.ts"
import { nft, run } from "../machines/namespace/exec.ts"

/** How machine networks are policed and where the internet is. */
export const PolicySettings = defineSettings(
  "host-agent/Policy",
  {
    /** The nftables table (family `inet`) that holds every rule of machine networks. */
    table: "hangar",
    newConnectionsPerSecond: 200,
    /** New connections allowed at once above the rate (the token bucket's size). */
    burst: 20,
    /**
     * Comma-separated host interfaces that lead to the internet; machines may leave only by them.
     * `auto`: the interface of the host's default route; `none` (or empty): no way out.
     */
    uplinks: "",
    /** Masquerade machine traffic out of the uplinks (production; never in tests). */
    masquerade: false,
    /** Comma-separated source ranges to masquerade: the machine address pools. */
    masqueradeSources: "10.213.0.0/16",
  },
  (d) => ({
    // A deployed host agent lets machines out by the host's default route, masqueraded.
    uplinks: env.string("MACHINE_UPLINKS", "auto"),
    masquerade: env.boolean("MACHINE_MASQUERADE", true),
    masqueradeSources: env.string("MACHINE_MASQUERADE_SOURCES", d.masqueradeSources),
    newConnectionsPerSecond: env.integer("MACHINE_NEW_CONNECTIONS_PER_SECOND", d.newConnectionsPerSecond),
  }),
)
export type PolicySettingsValue = typeof PolicySettings.defaults

/** IPv4 ranges no machine may reach (RFC 1918, shared, link-local and metadata, loopback, "this", multicast, reserved). */
export const forbidden4: ReadonlyArray<string> = [
  "0.0.0.0/8",
  "10.0.0.0/8",
  "100.64.0.0/10",
  "127.0.0.0/8",
  "169.254.0.0/16",
  "172.16.0.0/12",
  "192.168.0.0/16",
  "224.0.0.0/4",
  "240.0.0.0/4",
]

/** A machine's network as the policy sees it. */
export interface Guest {
  /** The host-side interface the machine's traffic arrives on (veth end or tap). */
  readonly iface: string
  /** The machine's one IPv4 address. */
  readonly guestAddress: string
}

const IFACE = /^[A-Za-z0-9_.-]{1,15}$/
const IPV4 = /^(25[0-5]|2[0-4]\d|1?\d?\d)(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}$/
const CIDR4 = /^(25[0-5]|2[0-4]\d|1?\d?\d)(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}\/(3[0-2]|[12]?\d)$/

const checkIface = (iface: string) => {
  if (!IFACE.test(iface)) throw new Error(`interface name must match ${IFACE}: ${JSON.stringify(iface)}`)
  return iface
}

const list = (csv: string) =>
  csv
    .split(",")
    .map((x) => x.trim())
    .filter((x) => x.length > 0 && x !== "none")

/** The interfaces of the host's default IPv4 routes (what `auto` names). */
export const defaultRouteInterfaces = async (): Promise<Array<string>> => {
  const routes = JSON.parse((await run("ip", ["-j", "-4", "route", "show", "default"])) || "[]") as Array<{
    dev?: string
  }>
  return [...new Set(routes.flatMap((r) => (r.dev ? [r.dev] : [])))]
}

let defaultRoute: { readonly at: number; readonly interfaces: Promise<Array<string>> } | undefined

/** The settings with `auto` replaced by the default route's interfaces (none when the host has no default route; looked up at most every 30 s). */
export const resolveUplinks = async (s: PolicySettingsValue): Promise<PolicySettingsValue> => {
  const named = list(s.uplinks)
  if (!named.includes("auto")) return s
  if (defaultRoute === undefined || Date.now() - defaultRoute.at > 30_000)
    defaultRoute = { at: Date.now(), interfaces: defaultRouteInterfaces().catch(() => []) }
  const found = await defaultRoute.interfaces
  return { ...s, uplinks: [...named.filter((u) => u !== "auto"), ...found].join(",") }
}

/** The per-machine chain of `iface`. */
export const chainOf = (iface: string) => `m_${checkIface(iface)}`

// Declarations only: safe to repeat, never touch other machines' elements.
const declare = (t: string) => [
  `add table inet ${t}`,
  `add set inet ${t} guest_ifs { type ifname; }`,
  `add map inet ${t} guests { type ifname : verdict; }`,
  `add set inet ${t} uplinks { type ifname; }`,
]

/**
 * The table's shared part as an nft script: sets, the refusal chain and the hooked chains. Base
 * chains and the static sets are flushed and refilled in the same transaction, so re-running it
 * (every attach does) is atomic and picks up a changed rule set.
 */
export const renderBase = (s: PolicySettingsValue): string => {
  const t = s.table
  const uplinks = list(s.uplinks).map(checkIface)
  const sources = list(s.masqueradeSources)
  for (const c of sources) if (!CIDR4.test(c)) throw new Error(`not an IPv4 range: ${c}`)
  const nat = `add chain inet ${t} postrouting { type nat hook postrouting priority srcnat; policy accept; }`
  const natSet = `add set inet ${t} masquerade_sources { type ipv4_addr; flags interval; }`
  return [
    ...declare(t),
    `add set inet ${t} forbidden4 { type ipv4_addr; flags interval; }`,
    `flush set inet ${t} forbidden4`,
    `add element inet ${t} forbidden4 { ${forbidden4.join(", ")} }`,
    ...(uplinks.length > 0
      ? [`add element inet ${t} uplinks { ${uplinks.map((u) => `"${u}"`).join(", ")} }`]
      : []),
    // A TCP reset is never rate limited by the kernel (ICMP errors are), so TCP callers always
    // learn at once that they were refused.
    `add chain inet ${t} refuse`,
    `flush chain inet ${t} refuse`,
    `add rule inet ${t} refuse meta l4proto tcp reject with tcp reset`,
    `add rule inet ${t} refuse reject with icmpx admin-prohibited`,
    `add chain inet ${t} forward { type filter hook forward priority filter; policy accept; }`,
    `flush chain inet ${t} forward`,
    `add rule inet ${t} forward iifname vmap @guests`,
    `add rule inet ${t} forward oifname @guest_ifs ct state established,related accept`,
    `add rule inet ${t} forward oifname @guest_ifs drop`,
    // Forwarding is switched on for the uplinks (for machines' replies): nothing that arrives on
    // one is routed anywhere but to a machine (a Hangar host is no router for its uplink's network).
    `add rule inet ${t} forward iifname @uplinks drop`,
    `add chain inet ${t} input { type filter hook input priority filter; policy accept; }`,
    `flush chain inet ${t} input`,
    `add rule inet ${t} input iifname @guest_ifs meta nfproto ipv6 drop`,
    `add rule inet ${t} input iifname @guest_ifs ct state established,related accept`,
    `add rule inet ${t} input iifname @guest_ifs goto refuse`,
    // Add-flush-delete removes the NAT parts when masquerading is off, whether or not they exist.
    nat,
    `flush chain inet ${t} postrouting`,
    natSet,
    `flush set inet ${t} masquerade_sources`,
    ...(s.masquerade && sources.length > 0
      ? [
          `add element inet ${t} masquerade_sources { ${sources.join(", ")} }`,
          `add rule inet ${t} postrouting oifname @uplinks ip saddr @masquerade_sources masquerade`,
        ]
      : [`delete chain inet ${t} postrouting`, `delete set inet ${t} masquerade_sources`]),
  ].join("\n")
}

/** The nft script that gives machine `g` its chain and elements (replacing any earlier ones). */
export const renderAttach = (s: PolicySettingsValue, g: Guest): string => {
  const t = s.table
  const c = chainOf(g.iface)
  if (!IPV4.test(g.guestAddress)) throw new Error(`not an IPv4 address: ${g.guestAddress}`)
  if (!Number.isInteger(s.newConnectionsPerSecond) || s.newConnectionsPerSecond < 1)
    throw new Error("newConnectionsPerSecond must be a positive integer")
  if (!Number.isInteger(s.burst) || s.burst < 1) throw new Error("burst must be a positive integer")
  return [
    `add chain inet ${t} ${c}`,
    `flush chain inet ${t} ${c}`,
    `add rule inet ${t} ${c} meta nfproto != ipv4 drop`,
    `add rule inet ${t} ${c} ip saddr != ${g.guestAddress} drop`,
    `add rule inet ${t} ${c} ct state established,related accept`,
    `add rule inet ${t} ${c} ip daddr @forbidden4 goto refuse`,
    `add rule inet ${t} ${c} meta l4proto { tcp, udp, udplite, sctp, dccp } th dport 25 goto refuse`,
    `add rule inet ${t} ${c} oifname != @uplinks goto refuse`,
    `add rule inet ${t} ${c} ct state new limit rate over ${s.newConnectionsPerSecond}/second burst ${s.burst} packets goto refuse`,
    `add rule inet ${t} ${c} accept`,
    `add element inet ${t} guest_ifs { "${g.iface}" }`,
    `add element inet ${t} guests { "${g.iface}" : jump ${c} }`,
  ].join("\n")
}

/** The nft script that removes every trace of `iface`; it succeeds whether or not they exist. */
export const renderDetach = (s: PolicySettingsValue, iface: string): string => {
  const t = s.table
  const c = chainOf(iface)
  // Adding first makes each delete valid when the machine was never attached or is already gone.
  return [
    ...declare(t),
    `add chain inet ${t} ${c}`,
    `add element inet ${t} guest_ifs { "${iface}" }`,
    `add element inet ${t} guests { "${iface}" : jump ${c} }`,
    `delete element inet ${t} guests { "${iface}" }`,
    `delete element inet ${t} guest_ifs { "${iface}" }`,
    `flush chain inet ${t} ${c}`,
    `delete chain inet ${t} ${c}`,
  ].join("\n")
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/**
 * Runs an nft script as one transaction. Every script here is idempotent, so one that lost a race
 * with another process's transaction (the kernel answers "busy" or asks for a restart) runs again.
 */
export const nftScript = async (script: string): Promise<void> => {
  for (let attempt = 1; ; attempt++) {
    try {
      await nft(`${script}\n`)
      return
    } catch (e) {
      if (attempt >= 4) throw e
      await sleep(20 * attempt)
    }
  }
}

// IPv4 forwarding is switched on per interface (the one a packet arrives on decides), so the host
// forwards only what comes from machines and uplinks, never what arrives on its other interfaces.
const forwardOn = (iface: string) => writeFile(`/proc/sys/net/ipv4/conf/${checkIface(iface)}/forwarding`, "1")

/**
 * The rules half of `attach`: refreshes the shared table and (re)places the machine's chain and
 * elements in one transaction. Rules match interfaces by name, so they may be placed before the
 * machine's interface exists (a driver does it while the machine is made). Idempotent.
 */
export const attachRules = async (settings: PolicySettingsValue, g: Guest): Promise<void> => {
  const s = await resolveUplinks(settings)
  await nftScript(`${renderBase(s)}\n${renderAttach(s, g)}`)
}

/** The forwarding half of `attach`: the host forwards what arrives on the uplinks and on `iface` (which must exist). */
export const forward = async (settings: PolicySettingsValue, iface: string): Promise<void> => {
  const s = await resolveUplinks(settings)
  for (const u of list(s.uplinks)) await forwardOn(u)
  await forwardOn(iface)
}

/**
 * Puts machine `g` under the policy: its rules (`attachRules`), then lets the host forward its
 * packets (`forward`). Idempotent.
 */
export const attach = async (settings: PolicySettingsValue, g: Guest): Promise<void> => {
  await attachRules(settings, g)
  await forward(settings, g.iface)
}

/** Removes the machine behind `iface` from the policy; idempotent, and a no-op for an unknown interface. */
export const detach = (s: PolicySettingsValue, iface: string): Promise<void> =>
  nftScript(renderDetach(s, iface))

/**
 * Lets machines reach the internet through `iface` (added to `uplinks`, and replies arriving on it
 * are forwarded). Idempotent. The settings' uplinks are added by every attach; this is for uplinks
 * that come and go, such as a test's stand-in for the internet.
 */
export const addUplink = async (s: PolicySettingsValue, iface: string): Promise<void> => {
  await nftScript(
    [...declare(s.table), `add element inet ${s.table} uplinks { "${checkIface(iface)}" }`].join("\n"),
  )
  await forwardOn(iface)
}

/** Removes `iface` from the uplinks; idempotent. */
export const removeUplink = (s: PolicySettingsValue, iface: string): Promise<void> =>
  nftScript(
    [
      ...declare(s.table),
      `add element inet ${s.table} uplinks { "${checkIface(iface)}" }`,
      `delete element inet ${s.table} uplinks { "${iface}" }`,
    ].join("\n"),
  )

/** What the table still holds about `iface` (its chain, set and map elements); empty when none. */
export const traces = async (s: PolicySettingsValue, iface: string): Promise<Array<string>> => {
  const text = await run("nft", ["list", "table", "inet", s.table]).catch(() => "")
  const found: Array<string> = []
  if (text.includes(`chain ${chainOf(iface)} {`)) found.push(`nft chain ${chainOf(iface)}`)
  if (text.includes(`"${iface}"`)) found.push(`nft element "${iface}"`)
  return found
}

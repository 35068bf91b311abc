/**
 * Public addresses: before the service connects to an address a customer gave it (webhooks), the
 * host is resolved and refused unless EVERY address it resolves to is public, and the caller then
 * connects to the one address that was checked, so a second DNS answer (rebinding) cannot send the
 * connection somewhere else.
 *
 * "Public" is decided by refusing what is known not to be (a deny list per family, from the IANA
 * special-purpose registries), plus for IPv6 an allow rule: only global unicast `2000::/3` can be
 * public at all, which also covers ranges assigned after this list was written.
 *
 * IPv4 refused: `0/8` this network, `10/8`, `172.16/12`, `192.168/16` private, `100.64/10` shared
 * (CGNAT), `127/8` loopback, `169.254/16` link-local (cloud metadata), `192.0.0/24` protocol
 * assignments, `192.0.2/24`, `198.51.100/24`, `203.0.113/24` documentation, `192.88.99/24` 6to4
 * relay, `198.18/15` benchmarking, `224/4` multicast, `240/4` reserved and broadcast.
 *
 * IPv6 refused: `::` unspecified, `::1` loopback, `::ffff:0:0/96` IPv4-mapped unless the mapped
 * IPv4 address is public (it is then connected to as that IPv4 address), the rest of `::/8`
 * (IPv4-compatible, IPv4-translated), `64:ff9b::/96` and `64:ff9b:1::/48` NAT64 (a translator
 * may lead to any IPv4 address, private ones included), `100::/64` discard, `2001::/23` protocol
 * assignments (Teredo `2001::/32`, benchmarking, ORCHID), `2001:db8::/32` and `3fff::/20`
 * documentation, `2002::/16` 6to4 (tunnels to an embedded IPv4 address), `fc00::/7` unique-local,
 * `fe80::/10` link-local, `fec0::/10` site-local, `ff00::/8` multicast.
 *
 * Host names are resolved with the system resolver (`dns.lookup`, all addresses), which is also what
 * a plain connection would use; IP literals (with or without brackets) are judged as they are.
 */
import { lookup as dnsLookup } from "node:dns/promises"
import { isIP } from "node:net"
import { Data, Effect } from "effect"

/** The host resolves to at least one address that is not public; nothing was connected to. */
export class AddressRefused extends Data.TaggedError("AddressRefused")<{
  readonly host: string
  readonly address: string
  /** Which kind of address it is (`loopback`, `private`, `link-local`…). */
  readonly reason: string
  readonly message: string
}> {}

/** The host name did not resolve (or resolved to nothing). */
export class AddressUnresolved extends Data.TaggedError("AddressUnresolved")<{
  readonly host: string
  readonly message: string
}> {}

/** An address to connect to, checked (or, with `allowPrivate`, at least resolved). */
export interface CheckedAddress {
  readonly address: string
  readonly family: 4 | 6
}

/** A resolver returning every address of a host (defaults to `dns.lookup` with `all: true`). */
export type Resolver = (host: string) => Promise<ReadonlyArray<{ address: string; family: number }>>

const systemResolver: Resolver = (host) => dnsLookup(host, { all: true, verbatim: true })

/** An IPv4 range: network as a 32-bit number and prefix length. */
interface Range4 {
  readonly net: number
  readonly bits: number
  readonly reason: string
}

const parse4 = (s: string): number | undefined => {
  const parts = s.split(".")
  if (parts.length !== 4) return undefined
  let n = 0
  for (const p of parts) {
    if (!/^\d{1,3}$/.test(p)) return undefined
    const v = Number(p)
    if (v > 255) return undefined
    n = n * 256 + v
  }
  return n
}

const range4 = (cidr: string, reason: string): Range4 => {
  const [net, bits] = cidr.split("/")
  return { net: parse4(net!)!, bits: Number(bits), reason }
}

const inRange4 = (addr: number, r: Range4): boolean => {
  if (r.bits === 0) return true
  const size = 2 ** (32 - r.bits)
  return Math.floor(addr / size) === Math.floor(r.net / size)
}

/** IPv4 ranges that are not public (see the module comment). */
export const denied4: ReadonlyArray<Range4> = [
  range4("0.0.0.0/8", "this network"),
  range4("10.0.0.0/8", "private"),
  range4("100.64.0.0/10", "shared address space (CGNAT)"),
  range4("127.0.0.0/8", "loopback"),
  range4("169.254.0.0/16", "link-local"),
  range4("172.16.0.0/12", "private"),
  range4("192.0.0.0/24", "IETF protocol assignments"),
  range4("192.0.2.0/24", "documentation"),
  range4("192.88.99.0/24", "6to4 relay anycast"),
  range4("192.168.0.0/16", "private"),
  range4("198.18.0.0/15", "benchmarking"),
  range4("198.51.100.0/24", "documentation"),
  range4("203.0.113.0/24", "documentation"),
  range4("224.0.0.0/4", "multicast"),
  range4("240.0.0.0/4", "reserved or broadcast"),
]

/** Eight 16-bit groups of an IPv6 address, or undefined when it is not one. */
const parse6 = (input: string): number[] | undefined => {
  let s = input
  const zone = s.indexOf("%")
  if (zone >= 0) s = s.slice(0, zone)
  if (isIP(s) !== 6) return undefined
  // A dotted IPv4 tail (`::ffff:1.2.3.4`) becomes two groups.
  const lastColon = s.lastIndexOf(":")
  const tail = s.slice(lastColon + 1)
  if (tail.includes(".")) {
    const v4 = parse4(tail)
    if (v4 === undefined) return undefined
    s = `${s.slice(0, lastColon + 1)}${Math.floor(v4 / 65536).toString(16)}:${(v4 % 65536).toString(16)}`
  }
  const halves = s.split("::")
  if (halves.length > 2) return undefined
  const groups = (h: string) => (h === "" ? [] : h.split(":").map((g) => Number.parseInt(g, 16)))
  const head = groups(halves[0]!)
  if (halves.length === 1) return head.length === 8 ? head : undefined
  const rest = groups(halves[1]!)
  const zeros = 8 - head.length - rest.length
  if (zeros < 0) return undefined
  return [...head, ...Array<number>(zeros).fill(0), ...rest]
}

/** Whether the first `bits` bits of `g` equal those of `prefix` (both as 16-bit groups). */
const inRange6 = (g: ReadonlyArray<number>, prefix: ReadonlyArray<number>, bits: number): boolean => {
  for (let i = 0; i < 8 && bits > 0; i++, bits -= 16) {
    const take = Math.min(16, bits)
    const mask = (0xffff << (16 - take)) & 0xffff
    if ((g[i]! & mask) !== ((prefix[i] ?? 0) & mask)) return false
  }
  return true
}

interface Range6 {
  readonly prefix: ReadonlyArray<number>
  readonly bits: number
  readonly reason: string
}

const range6 = (cidr: string, reason: string): Range6 => {
  const [net, bits] = cidr.split("/")
  return { prefix: parse6(net!)!, bits: Number(bits), reason }
}

/** IPv6 ranges that are not public, checked in order (IPv4-mapped is handled before these). */
export const denied6: ReadonlyArray<Range6> = [
  range6("::/128", "unspecified"),
  range6("::1/128", "loopback"),
  range6("64:ff9b::/96", "NAT64"),
  range6("64:ff9b:1::/48", "NAT64 (local use)"),
  // After NAT64, which lies inside it.
  range6("::/8", "reserved (IPv4-compatible or translated)"),
  range6("100::/64", "discard-only"),
  range6("2001:db8::/32", "documentation"),
  range6("2001::/32", "Teredo"),
  range6("2001::/23", "IETF protocol assignments"),
  range6("2002::/16", "6to4"),
  range6("3fff::/20", "documentation"),
  range6("fc00::/7", "unique-local"),
  range6("fe80::/10", "link-local"),
  range6("fec0::/10", "site-local"),
  range6("ff00::/8", "multicast"),
]

const globalUnicast = range6("2000::/3", "global unicast")

/**
 * Why `address` (an IP literal, IPv6 with or without brackets) is not public, or undefined when it
 * is. Something that is not an IP address at all is "not an IP address".
 */
export const nonPublicReason = (address: string): string | undefined => {
  const a = address.startsWith("[") && address.endsWith("]") ? address.slice(1, -1) : address
  const v4 = parse4(a)
  if (v4 !== undefined) return denied4.find((r) => inRange4(v4, r))?.reason
  const g = parse6(a)
  if (g === undefined) return "not an IP address"
  if (a.includes("%")) return "link-local (zoned)"
  // ::ffff:0:0/96: judged (and connected to) as the IPv4 address it maps.
  if (inRange6(g, [0, 0, 0, 0, 0, 0xffff], 96)) {
    const mapped = denied4.find((r) => inRange4(g[6]! * 65536 + g[7]!, r))
    return mapped === undefined ? undefined : `IPv4-mapped ${mapped.reason}`
  }
  const denied = denied6.find((r) => inRange6(g, r.prefix, r.bits))
  if (denied !== undefined) return denied.reason
  return inRange6(g, globalUnicast.prefix, globalUnicast.bits) ? undefined : "not global unicast"
}

/** Whether `address` (an IP literal) is public. */
export const isPublic = (address: string): boolean => nonPublicReason(address) === undefined

/** The IPv4 address an IPv4-mapped IPv6 address stands for, else the address unchanged. */
const unmapped = (address: string, family: 4 | 6): CheckedAddress => {
  if (family === 6) {
    const g = parse6(address)
    if (g !== undefined && inRange6(g, [0, 0, 0, 0, 0, 0xffff], 96)) {
      const n = g[6]! * 65536 + g[7]!
      return { address: [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join("."), family: 4 }
    }
  }
  return { address, family }
}

/**
 * Resolves `host` (a name, or an IP literal with or without brackets) and answers the address to
 * connect to: the first one, once every address it resolves to has been found public. Refuses with
 * `AddressRefused` naming the first non-public address otherwise. With `allowPrivate` (tests
 * only) nothing is refused, but the answer is still one resolved address to connect to.
 */
export const resolvePublic = (
  host: string,
  options: { readonly allowPrivate?: boolean; readonly resolver?: Resolver } = {},
): Effect.Effect<CheckedAddress, AddressRefused | AddressUnresolved> =>
  Effect.gen(function* () {
    const bare = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host
    if (bare === "") return yield* new AddressUnresolved({ host, message: "the host is empty" })
    const literal = isIP(bare.split("%")[0]!)
    const resolver = options.resolver ?? systemResolver
    const found: ReadonlyArray<{ address: string; family: number }> =
      literal !== 0
        ? [{ address: bare, family: literal }]
        : yield* Effect.tryPromise({
            try: () => resolver(bare),
            catch: (e) =>
              new AddressUnresolved({
                host,
                message: `could not resolve ${host}: ${(e as { code?: string }).code ?? String(e)}`,
              }),
          })
    if (found.length === 0)
      return yield* new AddressUnresolved({ host, message: `${host} resolved to no address` })
    if (options.allowPrivate !== true) {
      for (const { address } of found) {
        const reason = nonPublicReason(address)
        if (reason !== undefined)
          return yield* new AddressRefused({
            host,
            address,
            reason,
            message: `${host} resolves to ${address}, which is not a public address (${reason})`,
          })
      }
    }
    const first = found[0]!
    return unmapped(first.address, first.family === 6 ? 6 : 4)
  })

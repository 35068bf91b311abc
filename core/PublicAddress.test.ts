/**
 * Public-address checks: every kind of non-public address refused as a literal and as what a host
 * name resolves to (the system resolver for `localhost`, a table resolver for the rest), a name
 * with one bad address among good ones refused, public addresses accepted and answered as the
 * address to connect to (IPv4-mapped ones as their IPv4 address).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { AddressRefused, isPublic, nonPublicReason, type Resolver, resolvePublic } from "./PublicAddress.ts"

const refused: ReadonlyArray<readonly [string, string]> = [
  ["0.0.0.0", "this network"],
  ["0.1.2.3", "this network"],
  ["10.0.0.1", "private"],
  ["10.255.255.255", "private"],
  ["100.64.0.1", "shared address space (CGNAT)"],
  ["100.127.255.254", "shared address space (CGNAT)"],
  ["127.0.0.1", "loopback"],
  ["127.255.0.9", "loopback"],
  ["169.254.169.254", "link-local"],
  ["172.16.0.1", "private"],
  ["172.31.255.255", "private"],
  ["192.0.0.8", "IETF protocol assignments"],
  ["192.0.2.10", "documentation"],
  ["192.88.99.1", "6to4 relay anycast"],
  ["192.168.1.1", "private"],
  ["198.18.0.1", "benchmarking"],
  ["198.19.255.255", "benchmarking"],
  ["198.51.100.7", "documentation"],
  ["203.0.113.9", "documentation"],
  ["224.0.0.1", "multicast"],
  ["239.255.255.250", "multicast"],
  ["240.0.0.1", "reserved or broadcast"],
  ["255.255.255.255", "reserved or broadcast"],
  ["::", "unspecified"],
  ["::1", "loopback"],
  ["fe80::1", "link-local"],
  ["febf:ffff::1", "link-local"],
  ["fc00::1", "unique-local"],
  ["fd12:3456:789a::1", "unique-local"],
  ["fec0::1", "site-local"],
  ["ff02::1", "multicast"],
  ["ff0e::101", "multicast"],
  ["::ffff:127.0.0.1", "IPv4-mapped loopback"],
  ["::ffff:7f00:1", "IPv4-mapped loopback"],
  ["::ffff:10.1.2.3", "IPv4-mapped private"],
  ["::ffff:169.254.169.254", "IPv4-mapped link-local"],
  ["::ffff:192.168.0.1", "IPv4-mapped private"],
  ["::ffff:100.64.0.1", "IPv4-mapped shared address space (CGNAT)"],
  ["::127.0.0.1", "reserved (IPv4-compatible or translated)"],
  ["::ffff:0:8.8.8.8", "reserved (IPv4-compatible or translated)"],
  ["64:ff9b::a00:1", "NAT64"],
  ["64:ff9b::8.8.8.8", "NAT64"],
  ["64:ff9b:1::1", "NAT64 (local use)"],
  ["100::1", "discard-only"],
  ["2001:db8::1", "documentation"],
  ["2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"],
  ["2001:2::1", "IETF protocol assignments"],
  ["2002:c0a8:101::1", "6to4"],
  ["3fff::1", "documentation"],
  ["4000::1", "not global unicast"],
  ["5f00::1", "not global unicast"],
]

const accepted: ReadonlyArray<string> = [
  "8.8.8.8",
  "1.1.1.1",
  "93.184.216.34",
  "172.32.0.1",
  "100.128.0.1",
  "192.169.0.1",
  "198.20.0.1",
  "2606:4700:4700::1111",
  "2a00:1450:4001:82b::200e",
  "2001:4860:4860::8888",
]

/** A resolver answering from a table (an unknown name fails as the system resolver would). */
const tableResolver =
  (table: Record<string, ReadonlyArray<string>>): Resolver =>
  async (host) => {
    const found = table[host]
    if (found === undefined)
      throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: "ENOTFOUND" })
    return found.map((address) => ({ address, family: address.includes(":") ? 6 : 4 }))
  }

describe("nonPublicReason", () => {
  it.each(refused)("%s is refused (%s)", (address, reason) => {
    expect(nonPublicReason(address)).toBe(reason)
    expect(isPublic(address)).toBe(false)
  })
  it.each(accepted)("%s is public", (address) => {
    expect(nonPublicReason(address)).toBeUndefined()
  })
  it("brackets and zones", () => {
    expect(nonPublicReason("[::1]")).toBe("loopback")
    expect(nonPublicReason("fe80::1%eth0")).toBe("link-local (zoned)")
    expect(nonPublicReason("example.com")).toBe("not an IP address")
  })
})

describe("resolvePublic", () => {
  it.effect("refuses every non-public literal, bracketed or not", () =>
    Effect.gen(function* () {
      for (const [address, reason] of refused) {
        const host = address.includes(":") ? `[${address}]` : address
        const result = yield* Effect.either(resolvePublic(host))
        expect(Either.isLeft(result), address).toBe(true)
        const error = Either.getLeft(result).pipe((o) => (o._tag === "Some" ? o.value : undefined))
        expect(error).toBeInstanceOf(AddressRefused)
        expect((error as AddressRefused).reason).toBe(reason)
      }
    }),
  )

  it.effect("refuses a name resolving to each kind of non-public address", () =>
    Effect.gen(function* () {
      const table = Object.fromEntries(refused.map(([address], i) => [`h${i}.example`, [address]]))
      const resolver = tableResolver(table)
      for (const [i, [address, reason]] of refused.entries()) {
        const error = yield* Effect.flip(resolvePublic(`h${i}.example`, { resolver }))
        expect(error._tag, address).toBe("AddressRefused")
        expect(error).toMatchObject({ host: `h${i}.example`, address, reason })
      }
    }),
  )

  it.effect("refuses a name when any one of its addresses is not public", () =>
    Effect.gen(function* () {
      const resolver = tableResolver({ "mixed.example": ["93.184.216.34", "2606:4700::1", "10.0.0.5"] })
      const error = yield* Effect.flip(resolvePublic("mixed.example", { resolver }))
      expect(error).toMatchObject({ _tag: "AddressRefused", address: "10.0.0.5", reason: "private" })
    }),
  )

  it.effect("refuses localhost through the system resolver", () =>
    Effect.gen(function* () {
      const error = yield* Effect.flip(resolvePublic("localhost"))
      expect(error._tag).toBe("AddressRefused")
      expect((error as AddressRefused).reason).toMatch(/loopback/)
    }),
  )

  it.effect("answers the first address of a public name, IPv4-mapped as IPv4", () =>
    Effect.gen(function* () {
      const resolver = tableResolver({
        "ok.example": ["2606:4700:4700::1111", "1.1.1.1"],
        "mapped.example": ["::ffff:8.8.4.4"],
      })
      expect(yield* resolvePublic("ok.example", { resolver })).toEqual({
        address: "2606:4700:4700::1111",
        family: 6,
      })
      expect(yield* resolvePublic("mapped.example", { resolver })).toEqual({ address: "8.8.4.4", family: 4 })
      expect(yield* resolvePublic("[2001:4860:4860::8888]")).toEqual({
        address: "2001:4860:4860::8888",
        family: 6,
      })
      expect(yield* resolvePublic("8.8.8.8")).toEqual({ address: "8.8.8.8", family: 4 })
    }),
  )

  it.effect("allowPrivate answers the private address instead of refusing", () =>
    Effect.gen(function* () {
      expect(yield* resolvePublic("127.0.0.1", { allowPrivate: true })).toEqual({
        address: "127.0.0.1",
        family: 4,
      })
    }),
  )

  it.effect("a name that does not resolve, and an empty host, are unresolved", () =>
    Effect.gen(function* () {
      const resolver = tableResolver({ "empty.example": [] })
      expect(yield* Effect.flip(resolvePublic("nowhere.example", { resolver }))).toMatchObject({
        _tag: "AddressUnresolved",
        message: "could not resolve nowhere.example: ENOTFOUND",
      })
      expect((yield* Effect.flip(resolvePublic("empty.example", { resolver })))._tag).toBe(
        "AddressUnresolved",
      )
      expect((yield* Effect.flip(resolvePublic("")))._tag).toBe("AddressUnresolved")
    }),
  )
})

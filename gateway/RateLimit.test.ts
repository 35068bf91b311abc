import { describe, expect, it } from "vitest"
import { Buckets, keyOf, limiter } from "./RateLimit.ts"

describe("token buckets", () => {
  it("a fresh credential gets exactly `burst` requests, the next waits for a token", () => {
    const buckets = new Buckets(2, 5)
    for (let i = 0; i < 5; i++) expect(buckets.take("k", 1_000)).toBe(0)
    // One token refills in 0.5 s at 2/s: Retry-After rounds up to whole seconds.
    expect(buckets.take("k", 1_000)).toBe(1)
    expect(buckets.take("other", 1_000)).toBe(0)
  })

  it("refills at `perSecond` and never above `burst`", () => {
    const buckets = new Buckets(2, 5)
    for (let i = 0; i < 5; i++) buckets.take("k", 0)
    expect(buckets.take("k", 499)).toBe(1)
    expect(buckets.take("k", 500)).toBe(0)
    expect(buckets.take("k", 500)).toBe(1)
    // An hour idle still leaves only `burst` tokens.
    const later = 3_600_000
    for (let i = 0; i < 5; i++) expect(buckets.take("k", later)).toBe(0)
    expect(buckets.take("k", later)).toBe(1)
  })

  it("Retry-After is the whole seconds until one token is back", () => {
    const slow = new Buckets(0.1, 1)
    expect(slow.take("k", 0)).toBe(0)
    expect(slow.take("k", 0)).toBe(10)
    expect(slow.take("k", 4_000)).toBe(6)
  })

  it("peek answers as take would, and takes nothing", () => {
    const buckets = new Buckets(1, 2)
    expect(buckets.peek("k", 0)).toBe(0)
    expect(buckets.size).toBe(0)
    buckets.take("k", 0)
    buckets.take("k", 0)
    expect(buckets.peek("k", 0)).toBe(1)
    expect(buckets.peek("k", 999)).toBe(1)
    expect(buckets.peek("k", 1_000)).toBe(0)
    expect(buckets.peek("k", 1_000)).toBe(0)
    expect(buckets.take("k", 1_000)).toBe(0)
    expect(buckets.take("k", 1_000)).toBe(1)
    // Its wait counts what came back meanwhile, as `take`'s does.
    const slow = new Buckets(0.1, 1)
    slow.take("k", 0)
    expect(slow.peek("k", 4_000)).toBe(6)
    expect(slow.take("k", 4_000)).toBe(6)
  })

  it("sweep drops buckets that are full again and keeps the others", () => {
    const buckets = new Buckets(1, 2)
    buckets.take("a", 0)
    buckets.take("b", 0)
    buckets.take("b", 0)
    buckets.sweep(1_000)
    expect(buckets.size).toBe(1)
    buckets.sweep(2_000)
    expect(buckets.size).toBe(0)
  })
})

describe("bucket keys", () => {
  it("a bearer token is keyed by its SHA-256, never by its text", () => {
    const noAddress = () => {
      throw new Error("the address is not asked for when there is a token")
    }
    const key = keyOf("Bearer hgr_secret", noAddress)
    expect(key).toMatch(/^tok:[0-9a-f]{64}$/)
    expect(key).not.toContain("hgr_secret")
    expect(keyOf("bearer hgr_secret", noAddress)).toBe(key)
    expect(keyOf("Bearer hgr_other", noAddress)).not.toBe(key)
    expect(keyOf("Bearer hgr_secret", noAddress)).toBe(key)
  })

  it("without a bearer token the client address is the key", () => {
    expect(keyOf(undefined, () => "127.0.0.1")).toBe("ip:127.0.0.1")
    expect(keyOf("Basic abc", () => "::1")).toBe("ip:::1")
    // What the auth step does not read as a bearer token is no credential here either.
    for (const malformed of ["Bearer ", "Bearer  hgr_a", "Bearer hgr_a b", "Bearer hgr_é", "Bearerhgr_a"])
      expect(keyOf(malformed, () => "10.0.0.1")).toBe("ip:10.0.0.1")
  })
})

describe("refused credentials", () => {
  // Two requests a second, a burst of 3, at a clock the test moves.
  const at = { now: 0 }
  const make = () => limiter(new Buckets(2, 3), new Buckets(2, 3), () => at.now)
  const made = (i: number) => `Bearer hgr_madeup${i}`

  it("an address whose tokens are refused gets the burst of tries, then 429 whatever token it sends", () => {
    at.now = 0
    const limit = make()
    const from = (address: string) => () => address
    for (let i = 0; i < 3; i++) {
      expect(limit.take(made(i), from("a"))).toBe(0)
      limit.refused(from("a"))
    }
    expect(limit.take(made(3), from("a"))).toBe(1)
    expect(limit.take("Bearer hgr_real", from("a"))).toBe(1)
    // Another address, and requests without a token (their address's own bucket), go on.
    expect(limit.take(made(4), from("b"))).toBe(0)
    expect(limit.take(undefined, from("a"))).toBe(0)
    // A token back at the refusals' rate: one more try.
    at.now = 500
    expect(limit.take(made(5), from("a"))).toBe(0)
    limit.refused(from("a"))
    expect(limit.take(made(6), from("a"))).toBe(1)
  })

  it("while no token was refused, a request with one never asks for its address", () => {
    at.now = 0
    const limit = make()
    const noAddress = () => {
      throw new Error("the address was asked for")
    }
    for (let i = 0; i < 3; i++) expect(limit.take(made(i), noAddress)).toBe(0)
    expect(limit.take(made(0), noAddress)).toBe(0)
  })
})

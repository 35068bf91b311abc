import { describe, expect, it } from "vitest"
import { hashToken, isKeyToken, newToken, sameHash } from "./KeyTokens.ts"

describe("key tokens", () => {
  it("a fresh token has the key shape, and no two are alike", () => {
    const [a, b] = [newToken(), newToken()]
    expect(isKeyToken(a)).toBe(true)
    expect(a).not.toBe(b)
    expect(isKeyToken(`${a}x`)).toBe(false)
  })

  it("the stored form is SHA-256 in lower-case hex (FIPS 180-2's vector for abc)", () => {
    expect(hashToken("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
  })

  it("tokens hashed in turn, and the same one again, each get their own hash", () => {
    const tokens = [newToken(), newToken(), newToken()]
    const first = tokens.map(hashToken)
    expect(new Set(first).size).toBe(3)
    // The last hash is kept for the next ask of the same token: asked again, in any order.
    for (const i of [2, 2, 0, 1, 1, 2, 0]) expect(hashToken(tokens[i]!)).toBe(first[i])
    expect(hashToken("")).toBe("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    expect(sameHash(first[0]!, hashToken(tokens[0]!))).toBe(true)
    expect(sameHash(first[0]!, first[1]!)).toBe(false)
    // Differing only in the last character, or one a prefix of the other.
    expect(sameHash(first[0]!, `${first[0]!.slice(0, -1)}${first[0]!.endsWith("0") ? "1" : "0"}`)).toBe(false)
    expect(sameHash(first[0]!, first[0]!.slice(0, -1))).toBe(false)
  })
})

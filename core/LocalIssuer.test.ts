import { mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit } from "effect"
import { decodeJwt, decodeProtectedHeader, jwtVerify } from "jose"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { loadKey, localIssuerName, mint } from "./LocalIssuer.ts"

let dir: string
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "hangar-issuer-"))
})
afterAll(() => rm(dir, { recursive: true, force: true }))

describe("local issuer key", () => {
  it("is created once, mode 0600, and every concurrent loader gets the same key", async () => {
    const file = join(dir, "nested", "issuer.key")
    const keys = await Promise.all(Array.from({ length: 8 }, () => Effect.runPromise(loadKey(file))))
    const kids = new Set(keys.map((k) => k.kid))
    expect(kids.size).toBe(1)
    expect((await stat(file)).mode & 0o777).toBe(0o600)
    expect(await readFile(file, "utf8")).toMatch(/^-----BEGIN PRIVATE KEY-----/)
    const again = await Effect.runPromise(loadKey(file))
    expect(again.kid).toBe(keys[0]!.kid)
  })

  it("refuses a file that is not an Ed25519 key", async () => {
    const file = join(dir, "bad.key")
    await writeFile(file, "not a key", { mode: 0o600 })
    const exit = await Effect.runPromiseExit(loadKey(file))
    expect(Exit.isFailure(exit)).toBe(true)
    expect(String(exit)).toContain("IssuerKeyError")
  })

  it("mints a token with issuer, audience, subject, e-mail and expiry that verifies with the public key", async () => {
    const key = await Effect.runPromise(loadKey(join(dir, "mint.key")))
    const token = await Effect.runPromise(
      mint(key, { email: "Ana@Example.com", audience: "hangar", ttlSeconds: 60 }),
    )
    expect(decodeProtectedHeader(token)).toMatchObject({ alg: "EdDSA", kid: key.kid })
    const { payload } = await jwtVerify(token, key.publicKey, { issuer: localIssuerName, audience: "hangar" })
    expect(payload).toMatchObject({ email: "ana@example.com", sub: "ana@example.com", email_verified: true })
    const claims = decodeJwt(token)
    expect(claims.exp! - claims.iat!).toBe(60)
  })
})

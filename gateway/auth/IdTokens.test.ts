/**
 * ID token verification against a configured OIDC issuer: a local HTTP server plays the issuer
 * (discovery document and JWKS), the verifier fetches its keys like it would a real one's.
 */
import http from "node:http"
import type { AddressInfo } from "node:net"
import { Effect, Either, Layer } from "effect"
import { exportJWK, generateKeyPair, type JWTPayload, SignJWT } from "jose"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { IssuerSettings } from "../../core/LocalIssuer.ts"
import { IdTokens, layer } from "./IdTokens.ts"

let server: http.Server
let issuer: string
let sign: (claims: JWTPayload, options?: { iss?: string; aud?: string; exp?: string }) => Promise<string>
let jwksHits = 0

beforeAll(async () => {
  const { privateKey, publicKey } = await generateKeyPair("RS256")
  const jwk = { ...(await exportJWK(publicKey)), kid: "k1", alg: "RS256", use: "sig" }
  server = http.createServer((req, res) => {
    res.setHeader("content-type", "application/json")
    if (req.url === "/.well-known/openid-configuration") {
      res.end(JSON.stringify({ issuer, jwks_uri: `${issuer}/jwks` }))
    } else if (req.url === "/jwks") {
      jwksHits++
      res.end(JSON.stringify({ keys: [jwk] }))
    } else {
      res.statusCode = 404
      res.end("{}")
    }
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  issuer = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  sign = (claims, options = {}) =>
    new SignJWT(claims)
      .setProtectedHeader({ alg: "RS256", kid: "k1" })
      .setIssuer(options.iss ?? issuer)
      .setAudience(options.aud ?? "client-1")
      .setIssuedAt()
      .setExpirationTime(options.exp ?? "5m")
      .sign(privateKey)
})

afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())))

const verify = (token: string, settings: Partial<typeof IssuerSettings.defaults> = {}) =>
  Effect.runPromise(
    Effect.flatMap(IdTokens, (v) => Effect.either(v.verify(token))).pipe(
      Effect.provide(
        layer.pipe(Layer.provide(IssuerSettings.layer({ issuer, audience: "client-1", ...settings }))),
      ),
    ),
  )

describe("a configured OIDC issuer", () => {
  it("remembers a verified token only until its own expiry", async () => {
    const token = await sign({ email: "b@example.com", email_verified: true }, { exp: "2s" })
    const exp = JSON.parse(Buffer.from(token.split(".")[1]!, "base64url").toString()).exp as number
    const [first, again, after] = await Effect.runPromise(
      Effect.gen(function* () {
        const v = yield* IdTokens
        const first = yield* Effect.either(v.verify(token))
        const again = yield* Effect.either(v.verify(token))
        // Past the token's `exp` (whole seconds), the remembered verification no longer counts.
        yield* Effect.promise(
          () => new Promise((r) => setTimeout(r, Math.max(0, exp * 1000 - Date.now()) + 50)),
        )
        const after = yield* Effect.either(v.verify(token))
        return [first, again, after] as const
      }).pipe(
        Effect.provide(layer.pipe(Layer.provide(IssuerSettings.layer({ issuer, audience: "client-1" })))),
      ),
    )
    expect(first).toEqual(Either.right({ email: "b@example.com" }))
    expect(again).toEqual(first)
    expect(Either.isLeft(after) && after.left.code).toBe("unauthenticated")
  })

  it("accepts its token through discovery, lower-casing the e-mail", async () => {
    const result = await verify(await sign({ email: "Ana@Example.com", email_verified: true }))
    expect(result).toEqual(Either.right({ email: "ana@example.com" }))
  })

  it("accepts its token through an explicit JWKS URL", async () => {
    const before = jwksHits
    const result = await verify(await sign({ email: "ana@example.com" }), { jwksUrl: `${issuer}/jwks` })
    expect(Either.isRight(result)).toBe(true)
    expect(jwksHits).toBe(before + 1)
  })

  const refused: ReadonlyArray<[string, () => Promise<string>]> = [
    ["another issuer", () => sign({ email: "a@example.com" }, { iss: "https://evil.example" })],
    ["another audience", () => sign({ email: "a@example.com" }, { aud: "client-2" })],
    ["expired", () => sign({ email: "a@example.com" }, { exp: "-2m" })],
    ["no e-mail", () => sign({ sub: "123" })],
    ["an unverified e-mail", () => sign({ email: "a@example.com", email_verified: false })],
    [
      "a changed payload",
      async () => {
        const [h, , s] = (await sign({ email: "a@example.com" })).split(".")
        return `${h}.${Buffer.from(JSON.stringify({ email: "b@example.com", iss: issuer, aud: "client-1", exp: 9e9 })).toString("base64url")}.${s}`
      },
    ],
    ["garbage", async () => "not.a.jwt"],
  ]
  for (const [name, make] of refused) {
    it(`refuses ${name} with 401 unauthenticated`, async () => {
      const result = await verify(await make())
      expect(Either.isLeft(result) && result.left.code).toBe("unauthenticated")
    })
  }

  it("an issuer that cannot be reached is 500 internal, not the caller's fault", async () => {
    const token = await sign({ email: "a@example.com" })
    const result = await verify(token, { jwksUrl: "http://127.0.0.1:9/jwks" })
    expect(Either.isLeft(result) && result.left.code).toBe("internal")
  })
})

/**
 * A small OIDC provider for the console's sign-in tests: discovery, JWKS, an authorization
 * endpoint that consents at once for `email` (redirecting back with a code), and a token endpoint
 * that checks the code, the client, the redirect and the PKCE verifier (S256) before it answers an
 * ES256-signed ID token with the nonce it was given. What it was asked is kept for assertions.
 */
import { createHash, randomBytes } from "node:crypto"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { exportJWK, generateKeyPair, SignJWT } from "jose"

interface Grant {
  readonly clientId: string
  readonly redirectUri: string
  readonly challenge: string
  readonly nonce: string
  readonly email: string
}

/** The running fake. */
export interface OidcFake {
  readonly url: string
  /** Who the next authorization signs in. */
  email: string
  /** When set, the ID token carries this nonce instead of the one asked for. */
  nonceOverride: string | undefined
  /** Each authorization request's parameters. */
  readonly authorizations: Array<Record<string, string>>
  /** Each token request's form fields, and whether it was granted. */
  readonly tokenRequests: Array<{ readonly form: Record<string, string>; readonly granted: boolean }>
  readonly close: () => Promise<void>
}

/** Starts the fake on a free loopback port. */
export const startOidcFake = async (): Promise<OidcFake> => {
  const { privateKey, publicKey } = await generateKeyPair("ES256")
  const jwk = { ...(await exportJWK(publicKey)), kid: "k1", alg: "ES256", use: "sig" }
  const grants = new Map<string, Grant>()
  let url = ""
  const fake: OidcFake = {
    url: "",
    email: "",
    nonceOverride: undefined,
    authorizations: [],
    tokenRequests: [],
    close: () => new Promise((resolve) => server.close(() => resolve())),
  }
  const send = (res: import("node:http").ServerResponse, status: number, body: unknown) => {
    res.writeHead(status, { "content-type": "application/json" })
    res.end(JSON.stringify(body))
  }
  const server = createServer((req, res) => {
    const at = new URL(req.url ?? "/", url)
    if (at.pathname === "/.well-known/openid-configuration")
      return send(res, 200, {
        issuer: url,
        authorization_endpoint: `${url}/authorize`,
        token_endpoint: `${url}/token`,
        jwks_uri: `${url}/jwks`,
        response_types_supported: ["code"],
        code_challenge_methods_supported: ["S256"],
      })
    if (at.pathname === "/jwks") return send(res, 200, { keys: [jwk] })
    if (at.pathname === "/authorize") {
      const q = Object.fromEntries(at.searchParams)
      fake.authorizations.push(q)
      if (
        q.response_type !== "code" ||
        q.code_challenge_method !== "S256" ||
        !q.code_challenge ||
        !q.redirect_uri
      )
        return send(res, 400, { error: "invalid_request" })
      const code = randomBytes(16).toString("hex")
      grants.set(code, {
        clientId: q.client_id ?? "",
        redirectUri: q.redirect_uri,
        challenge: q.code_challenge,
        nonce: q.nonce ?? "",
        email: fake.email,
      })
      const back = new URL(q.redirect_uri)
      back.searchParams.set("code", code)
      back.searchParams.set("state", q.state ?? "")
      res.writeHead(302, { location: back.href })
      return res.end()
    }
    if (at.pathname === "/token" && req.method === "POST") {
      let body = ""
      req.setEncoding("utf8")
      req.on("data", (c: string) => {
        body += c
      })
      req.on("end", async () => {
        const form = Object.fromEntries(new URLSearchParams(body))
        const grant = grants.get(form.code ?? "")
        grants.delete(form.code ?? "")
        const verified =
          grant !== undefined &&
          form.grant_type === "authorization_code" &&
          form.client_id === grant.clientId &&
          form.redirect_uri === grant.redirectUri &&
          createHash("sha256")
            .update(form.code_verifier ?? "")
            .digest("base64url") === grant.challenge
        fake.tokenRequests.push({ form, granted: verified })
        if (!verified || grant === undefined) return send(res, 400, { error: "invalid_grant" })
        const idToken = await new SignJWT({
          email: grant.email,
          email_verified: true,
          nonce: fake.nonceOverride ?? grant.nonce,
        })
          .setProtectedHeader({ alg: "ES256", kid: "k1" })
          .setIssuer(url)
          .setAudience(grant.clientId)
          .setSubject(grant.email)
          .setIssuedAt()
          .setExpirationTime("5m")
          .sign(privateKey)
        send(res, 200, { access_token: "unused", token_type: "Bearer", expires_in: 300, id_token: idToken })
      })
      return
    }
    send(res, 404, { error: "not_found" })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()))
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  ;(fake as { url: string }).url = url
  return fake
}

/**
 * The console's sign-in through an OIDC issuer (authorization code with PKCE), in a real browser
 * against the stack configured with `HANGAR_OIDC_ISSUER` pointing at a small fake provider
 * (`test/fakes/OidcFake.ts`) that checks the PKCE verifier before it issues an ID token.
 */
import { createHash, randomBytes } from "node:crypto"
import { Effect } from "effect"
import type { Page } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Accounts } from "../core/Accounts.ts"
import { SESSION_COOKIE } from "../core/ConsoleSessions.ts"
import { type OidcFake, startOidcFake } from "./fakes/OidcFake.ts"
import { launchBrowser, type TestBrowser } from "./harness/Browser.ts"
import { hangar } from "./harness/Cli.ts"
import { closeStack, type Stack, startStack } from "./harness/Stack.ts"

// On a loaded machine (2 cores, other suites beside) a browser and a CLI start slowly: each test
// gets 2 minutes.
let stack: Stack
let oidc: OidcFake
let browser: TestBrowser
let page: Page
const CLIENT_ID = "hangar-console"

beforeAll(async () => {
  oidc = await startOidcFake()
  stack = await startStack({ noHost: true, settings: { OIDC_ISSUER: oidc.url, OIDC_AUDIENCE: CLIENT_ID } })
  browser = await launchBrowser()
  page = await browser.page()
}, 300_000)

afterAll(async () => {
  await browser?.close()
  await closeStack(stack)
  await oidc?.close()
}, 300_000)

const cookie = async () => (await browser.context.cookies(stack.url)).find((c) => c.name === SESSION_COOKIE)

describe("OIDC sign-in", { timeout: 120_000 }, () => {
  it("goes to the issuer with PKCE (S256) and a nonce, and comes back signed in", async () => {
    const email = `oidc-${randomBytes(4).toString("hex")}@example.com`
    await stack.run(Effect.flatMap(Accounts, (a) => a.createAccount("oidc-lab", email)))
    oidc.email = email
    await page.goto(`${stack.url}/runs`)
    await page.click("#oidc-sign-in")
    await page.waitForSelector(`.email:text("${email}")`)
    await page.waitForSelector("h1:text('Runs')")
    expect((await cookie())?.httpOnly).toBe(true)

    const asked = oidc.authorizations.at(-1)!
    expect(asked).toMatchObject({
      response_type: "code",
      client_id: CLIENT_ID,
      redirect_uri: `${stack.url}/console/oidc/callback`,
      code_challenge_method: "S256",
    })
    expect(asked.scope?.split(" ")).toEqual(expect.arrayContaining(["openid", "email"]))
    const token = oidc.tokenRequests.at(-1)!
    expect(token.granted).toBe(true)
    // The verifier went only to the token endpoint; the browser saw just its hash.
    expect(createHash("sha256").update(token.form.code_verifier!).digest("base64url")).toBe(
      asked.code_challenge,
    )
    expect(asked.code_verifier).toBeUndefined()
  })

  it("refuses a callback replayed, one started by another browser, and an ID token with another nonce", async () => {
    // Replayed in the same browser: its state was used.
    const callback = `${stack.url}/console/oidc/callback?code=whatever&state=${oidc.authorizations.at(-1)!.state}`
    await page.context().clearCookies({ name: SESSION_COOKIE })
    await page.goto(callback)
    await page.waitForSelector("text=did not work")
    expect(new URL(page.url()).search).toBe("?problem=oidc")
    expect(await cookie()).toBeUndefined()

    // Started elsewhere (an attacker's own sign-in, its callback sent to this browser): the
    // issuer's part is done, but this browser never started that state.
    const start = await fetch(`${stack.url}/console/oidc/start`, { redirect: "manual" })
    const authorize = await fetch(start.headers.get("location")!, { redirect: "manual" })
    const elsewhere = authorize.headers.get("location")!
    expect(elsewhere.startsWith(`${stack.url}/console/oidc/callback?`)).toBe(true)
    await browser.context.clearCookies()
    await page.goto(elsewhere)
    await page.waitForURL(`${stack.url}/sign-in?problem=oidc`)
    expect(await cookie()).toBeUndefined()

    oidc.nonceOverride = "not-the-nonce"
    try {
      await page.click("#oidc-sign-in")
      await page.waitForURL(`${stack.url}/sign-in?problem=oidc`)
      expect(oidc.tokenRequests.at(-1)!.granted).toBe(true)
      expect(await cookie()).toBeUndefined()
    } finally {
      oidc.nonceOverride = undefined
    }
  })

  it("makes no console links while an issuer signs people in", async () => {
    const ran = await hangar(["admin", "console-link", "--email", "someone@example.com"], {
      env: Object.fromEntries(Object.entries(stack.env).map(([k, v]) => [`HANGAR_${k}`, v])),
    })
    expect(ran.status).toBe(4)
    expect(ran.stderr).toContain("console links are for local mode")
    expect(ran.stdout).toBe("")
  })
})

/**
 * The web console in a real browser (Debian's Chromium through playwright-core) against the whole
 * stack (real NATS, real gateway, real host agent): sign-in links, the session cookie and its CSRF
 * token, the CLI login approval page with the real `hangar login`, a run followed live from queued
 * to succeeded and its output downloaded, keys, and what a member sees. One stack and one browser
 * for the file. Screenshots of each main page go to a temporary folder, removed with the file's
 * end; `HANGAR_TEST_CONSOLE_SHOTS=<folder>` keeps them there for people to see.
 */
import { createHash, randomBytes } from "node:crypto"
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Scope } from "effect"
import type { Page } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Accounts } from "../core/Accounts.ts"
import * as ConsoleSessions from "../core/ConsoleSessions.ts"
import { personToken } from "../gateway/auth/testing.ts"
import * as OpenAiFake from "./fakes/OpenAiFake.ts"
import * as PaymentFake from "./fakes/PaymentFake.ts"
import { launchBrowser, type TestBrowser } from "./harness/Browser.ts"
import { configHome, hangar } from "./harness/Cli.ts"
import {
  call,
  closeStack,
  createAccount,
  expectStatus,
  getRun,
  publish,
  publishProvider,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
} from "./harness/Stack.ts"

// On a loaded machine (2 cores, other suites beside) a run may take a while to be placed: each
// test gets 4 minutes.
let stack: Stack
let acct: TestAccount
let browser: TestBrowser
let page: Page
let openai: OpenAiFake.OpenAiFake
let payments: PaymentFake.PaymentFake
const scope = Effect.runSync(Scope.make())
const VENDOR_KEY = `sk-console-${randomBytes(8).toString("hex")}`
const keptShots = process.env.HANGAR_TEST_CONSOLE_SHOTS
if (keptShots !== undefined) mkdirSync(keptShots, { recursive: true })
const shots = keptShots ?? mkdtempSync(join(tmpdir(), "hangar-console-shots-"))

/** What the pages logged as errors (a CSP violation, a script failure). */
const pageErrors: Array<string> = []

/** The stack's variables as `hangar admin` reads them. */
const adminEnv = (extra: Record<string, string> = {}) => ({
  ...Object.fromEntries(Object.entries(stack.env).map(([k, v]) => [`HANGAR_${k}`, v])),
  ...extra,
})

/** A sign-in link made through the real `hangar admin console-link`. */
const linkByCli = async (email: string, extra: Record<string, string> = {}): Promise<string> => {
  const ran = await hangar(["admin", "console-link", "--email", email], { env: adminEnv(extra) })
  expect(ran.status, ran.stderr).toBe(0)
  return JSON.parse(ran.stdout).url as string
}

/** A sign-in link made in this process, as the command makes it (quicker). */
const link = (email: string, validMs = 600_000): Promise<string> =>
  stack.run(
    Effect.flatMap(ConsoleSessions.make, (s) => s.createLink(email, validMs)).pipe(
      Effect.map((secret) => `${stack.url}/console/sign-in?link=${secret}`),
    ),
  )

/** Signs the browser in as `email` (a fresh cookie jar first). */
const signIn = async (email: string) => {
  await browser.context.clearCookies()
  await page.goto(await link(email))
  await page.waitForSelector(`.email:text("${email}")`)
}

/**
 * The layout shift a page recorded, summed as the browser's Cumulative Layout Shift is (0 is none;
 * 0.1 is the usual bound of "good"): what live data moved must stay far below anything visible.
 */
const totalShift = (shifts: unknown): number => (shifts as Array<number>).reduce((a, b) => a + b, 0)

const shot = (name: string) => page.screenshot({ path: join(shots, `${name}.png`), fullPage: true })

const sessionCookie = async () =>
  (await browser.context.cookies(stack.url)).find((c) => c.name === ConsoleSessions.SESSION_COOKIE)

beforeAll(async () => {
  openai = await Effect.runPromise(
    OpenAiFake.make({ keys: [VENDOR_KEY], models: ["gpt-5"] }).pipe(Scope.extend(scope)),
  )
  payments = await Effect.runPromise(PaymentFake.make().pipe(Scope.extend(scope)))
  stack = await startStack({
    logFlushMs: 300,
    relay: true,
    settings: {
      OPENAI_BASE_URL: openai.url,
      PAYMENTS_BASE_URL: payments.url,
      PAYMENTS_SECRET_KEY: payments.secretKey,
      PAYMENTS_WEBHOOK_SECRET: payments.webhookSecret,
    },
  })
  acct = await createAccount(stack, { name: "acme" })
  browser = await launchBrowser()
  page = await browser.page()
  page.on("console", (m) => {
    if (
      m.type() === "error" &&
      !/Failed to load resource: the server responded with a status of 4\d\d/.test(m.text())
    )
      pageErrors.push(`${page.url()}: ${m.text()}`)
  })
  page.on("pageerror", (e) => pageErrors.push(`${page.url()}: ${e.message}`))
  if (keptShots !== undefined) console.log(`console screenshots: ${shots}`)
}, 300_000)

afterAll(async () => {
  await browser?.close()
  await closeStack(stack)
  await Effect.runPromise(Scope.close(scope, Exit.void))
  if (keptShots === undefined) rmSync(shots, { recursive: true, force: true })
}, 300_000)

describe("sign-in", { timeout: 240_000 }, () => {
  it("a console link signs in once, sets an HttpOnly SameSite=Lax cookie, and lands on the runs", async () => {
    const url = await linkByCli(acct.ownerEmail)
    expect(url.startsWith(`${stack.url}/console/sign-in?link=`)).toBe(true)
    const answer = await page.goto(url)
    expect(answer?.status()).toBe(200)
    expect(new URL(page.url()).pathname).toBe("/")
    await page.waitForSelector(`.email:text("${acct.ownerEmail}")`)
    await page.waitForSelector("h1:text('Runs')")
    const cookie = await sessionCookie()
    expect(cookie).toMatchObject({ httpOnly: true, sameSite: "Lax", secure: false, path: "/" })
    // The page's script cannot read it.
    expect(await page.evaluate("document.cookie")).not.toContain(ConsoleSessions.SESSION_COOKIE)
    // The same link again: used.
    await browser.context.clearCookies()
    await page.goto(url)
    await page.waitForSelector("h1:text('Sign in to Hangar')")
    expect(new URL(page.url()).search).toBe("?problem=used")
    await page.waitForSelector("text=already used")
    await shot("sign-in")
  })

  it("a link opened twice at once signs in once", async () => {
    const secret = new URL(await link(acct.ownerEmail)).searchParams.get("link")!
    const uses = await stack.run(
      Effect.flatMap(ConsoleSessions.make, (s) =>
        Effect.all([s.useLink(secret, 60_000), s.useLink(secret, 60_000), s.useLink(secret, 60_000)], {
          concurrency: "unbounded",
        }),
      ),
    )
    expect(uses.filter((u) => typeof u !== "string")).toHaveLength(1)
    expect(uses.filter((u) => u === "used")).toHaveLength(2)
  })

  it("a link past its lifetime (HANGAR_CONSOLE_LINK_MS) and an unknown one sign nobody in", async () => {
    await browser.context.clearCookies()
    await page.goto(await linkByCli(acct.ownerEmail, { HANGAR_CONSOLE_LINK_MS: "0" }))
    await page.waitForSelector("text=has expired")
    expect(await sessionCookie()).toBeUndefined()
    await page.goto(`${stack.url}/console/sign-in?link=${randomBytes(32).toString("base64url")}`)
    await page.waitForSelector("text=not known here")
    expect(await sessionCookie()).toBeUndefined()
  })

  it("serves the page with a strict CSP and no cache, and hashed assets cached for a year", async () => {
    const res = await fetch(`${stack.url}/runs`)
    expect(res.status).toBe(200)
    expect(res.headers.get("cache-control")).toBe("no-cache")
    const csp = res.headers.get("content-security-policy") ?? ""
    expect(csp).toContain("script-src 'self'")
    expect(csp).not.toContain("unsafe-inline")
    expect(csp).not.toContain("unsafe-eval")
    const html = await res.text()
    expect(html).not.toMatch(/<script>/)
    const script = /src="(\/assets\/app-[A-Z0-9]+\.js)"/.exec(html)?.[1]
    expect(script).toBeDefined()
    const asset = await fetch(`${stack.url}${script}`)
    expect(asset.status).toBe(200)
    expect(asset.headers.get("cache-control")).toBe("public, max-age=31536000, immutable")
    expect(asset.headers.get("content-type")).toContain("javascript")
    expect((await fetch(`${stack.url}/assets/app-NOPE.js`)).status).toBe(404)
  })

  it("a forged cookie, an expired session and a signed-out one land on sign-in", async () => {
    await signIn(acct.ownerEmail)
    const { value } = (await sessionCookie())!
    // Expired: its stored expiry moved into the past.
    await stack.run(
      Effect.gen(function* () {
        const s = yield* ConsoleSessions.make
        const key = ConsoleSessions.sessionKey(value)
        const found = yield* s.kv.get(key)
        if (found._tag === "None") throw new Error("session not stored")
        yield* s.kv.put(key, { ...found.value.value, expires_at_ms: Date.now() - 1 })
      }),
    )
    await page.goto(`${stack.url}/runs`)
    await page.waitForSelector("h1:text('Sign in to Hangar')")
    // Forged: a well-formed id that no session has.
    await browser.context.addCookies([
      {
        name: ConsoleSessions.SESSION_COOKIE,
        value: randomBytes(32).toString("base64url"),
        url: stack.url,
      },
    ])
    await page.goto(`${stack.url}/keys`)
    await page.waitForSelector("h1:text('Sign in to Hangar')")
    const forged = await call(stack, "GET", "/v1/me", {
      cookie: `${ConsoleSessions.SESSION_COOKIE}=${randomBytes(32).toString("base64url")}`,
    })
    expect(forged.status).toBe(401)
    expect(forged.body.code).toBe("unauthenticated")
    // Signed out: the cookie's session is gone on the server too.
    await signIn(acct.ownerEmail)
    const before = (await sessionCookie())!.value
    await page.click("button:text('Sign out')")
    await page.waitForSelector("h1:text('Sign in to Hangar')")
    const after = await call(stack, "GET", "/v1/me", {
      cookie: `${ConsoleSessions.SESSION_COOKIE}=${before}`,
    })
    expect(after.status).toBe(401)
  })

  it("a request with the cookie that changes something needs the session's CSRF token", async () => {
    await signIn(acct.ownerEmail)
    // Run in the page (plain script: this project's typings have no DOM).
    const tried = (await page.evaluate(`(async () => {
      const post = (headers) =>
        fetch("/v1/keys", {
          method: "POST",
          headers: { "content-type": "application/json", "service-account": ${JSON.stringify(acct.id)}, ...headers },
          body: JSON.stringify({ name: "csrf-probe", scope: "admin" }),
        }).then(async (r) => ({ status: r.status, body: await r.json() }))
      const session = await (await fetch("/console/session")).json()
      return {
        none: await post({}),
        wrong: await post({ "x-csrf-token": "A".repeat(43) }),
        right: await post({ "x-csrf-token": session.csrf }),
      }
    })()`)) as Record<"none" | "wrong" | "right", { status: number; body: Record<string, unknown> }>
    expect(tried.none.status).toBe(403)
    expect(tried.none.body).toMatchObject({ code: "csrf_token", error: expect.any(String) })
    expect(tried.wrong.status).toBe(403)
    expect(tried.wrong.body.code).toBe("csrf_token")
    expect(tried.right.status).toBe(201)
    // A GET needs none.
    const { value } = (await sessionCookie())!
    const me = await call(stack, "GET", "/v1/me", { cookie: `${ConsoleSessions.SESSION_COOKIE}=${value}` })
    expect(me.status).toBe(200)
    expect(me.body.email).toBe(acct.ownerEmail)
  })
})

describe("CLI login approval", { timeout: 240_000 }, () => {
  it("the page a `hangar login` URL opens shows the machine and the code; approving finishes the CLI", async () => {
    await signIn(acct.ownerEmail)
    const home = configHome()
    let started: (v: { id: string; code: string; url: string }) => void = () => {}
    const login = new Promise<{ id: string; code: string; url: string }>((r) => {
      started = r
    })
    const ran = hangar(["login", "--json", "--name", "laptop-7"], {
      env: { SERVICE_API: stack.url, XDG_CONFIG_HOME: home },
      onStdout: (chunk) => {
        const first = chunk.split("\n")[0]
        if (first) started(JSON.parse(first))
      },
    })
    const { url, code } = await login
    expect(url.startsWith(`${stack.url}/cli-logins/`)).toBe(true)
    await page.goto(url)
    await page.waitForSelector("#login-machine:text('laptop-7')")
    expect(await page.textContent("#login-code")).toBe(code)
    await shot("cli-login")
    await page.click("#approve")
    await page.waitForSelector("#approved")
    const done = await ran
    expect(done.status, done.stderr).toBe(0)
    const saved = JSON.parse(readFileSync(join(home, "hangar", "credentials.json"), "utf8"))[stack.url]
    expect(saved).toMatchObject({ account: acct.id, name: "laptop-7", key: expect.stringMatching(/^hgr_/) })
    await shot("cli-login-approved")

    // Refused: nothing approved; the login stays pending until it expires.
    const other = expectStatus(
      await call(stack, "POST", "/v1/cli-logins", {}, { name: "stranger-box", key_hash: "a".repeat(64) }),
      201,
      "POST /v1/cli-logins",
    )
    await page.goto(other.url)
    await page.waitForSelector("#login-machine:text('stranger-box')")
    await page.click("#refuse")
    await page.waitForSelector("text=Refused: nothing was approved")
    expect((await call(stack, "GET", `/v1/cli-logins/${other.id}`, {})).body.state).toBe("pending")
  })
})

describe("runs", { timeout: 240_000 }, () => {
  it("a run page follows the run from queued to succeeded without a reload; its output downloads whole", async () => {
    await signIn(acct.ownerEmail)
    const fn = await publish(stack, acct, { name: "console-fn", output_manifest: [{ path: "answer.txt" }] })
    // No host: the run waits in the queue, where the page first finds it.
    await stack.stopHost()
    const run = await startRun(stack, acct, fn.function, { prompt: "answer" })
    await page.goto(`${stack.url}/runs/${run.id}`)
    await page.waitForSelector(".page-head [data-state='queued']")
    // Every state the page's badge shows, recorded in the page; and a mark a reload would lose.
    await page.evaluate(`(() => {
      const seen = []
      window.seen = seen
      const badge = () => document.querySelector(".page-head [data-state]")?.getAttribute("data-state") ?? ""
      seen.push(badge())
      // Layout shifts not caused by input (a click, a key): live data must not move the page.
      window.shifts = []
      new PerformanceObserver((list) => {
        for (const e of list.getEntries()) if (!e.hadRecentInput) window.shifts.push(e.value)
      }).observe({ type: "layout-shift" })
      new MutationObserver(() => {
        const now = badge()
        if (seen[seen.length - 1] !== now) seen.push(now)
      }).observe(document.body, { subtree: true, childList: true, attributes: true })
    })()`)
    await shot("run-queued")
    await stack.startHost()
    await page.waitForSelector(".page-head [data-state='running']", { timeout: 180_000 })
    const wrote = expectStatus(
      await call(stack, "POST", `/v1/runs/${run.id}/commands`, acct.admin, {
        kind: "bash",
        arguments: { command: "echo forty-two > out/answer.txt; echo wrote it" },
      }),
      201,
      "bash",
    )
    await page.waitForSelector(`[data-command='${wrote.id}'] [data-state='succeeded']`)
    await page.click(`[data-command='${wrote.id}'] summary`)
    await page.waitForSelector(`[data-command='${wrote.id}'] pre:text('wrote it')`)
    expectStatus(
      await call(stack, "POST", `/v1/runs/${run.id}/commands`, acct.admin, {
        kind: "finish",
        arguments: { state: "succeeded" },
      }),
      201,
      "finish",
    )
    await page.waitForSelector(".page-head [data-state='succeeded']", { timeout: 120_000 })
    const seen = await page.evaluate("window.seen")
    expect(seen).toEqual(["queued", "running", "succeeded"])
    expect(totalShift(await page.evaluate("window.shifts"))).toBeLessThan(0.001)
    await page.waitForSelector("#download-output")
    // The log follows to its closing line.
    await page.waitForSelector(".log .log-kind:text('end')")
    await shot("run-succeeded")

    const [download] = await Promise.all([page.waitForEvent("download"), page.click("#download-output")])
    const file = await download.path()
    const sha = createHash("sha256").update(readFileSync(file)).digest("hex")
    const ended = await getRun(stack, acct, run.id)
    expect(sha).toBe(ended.output.sha256)

    // The list shows it, with the filters in the address.
    await page.goto(`${stack.url}/runs?state=succeeded`)
    await page.waitForSelector(`[data-run='${run.id}'] [data-state='succeeded']`)
    await page.goto(`${stack.url}/runs?state=failed`)
    await page.waitForSelector("text=No runs match these filters")
    await page.goto(`${stack.url}/runs`)
    await page.waitForSelector(`[data-run='${run.id}']`)
    await shot("runs")
    await page.setViewportSize({ width: 390, height: 844 })
    await shot("runs-phone")
    await page.goto(`${stack.url}/runs/${run.id}`)
    await page.waitForSelector(".page-head [data-state='succeeded']")
    await shot("run-phone")
    await page.setViewportSize({ width: 1280, height: 800 })
  })
})

describe("terminal", { timeout: 240_000 }, () => {
  it("a browser terminal on a running run runs what is typed, end to end encrypted", async () => {
    await signIn(acct.ownerEmail)
    const fn = await publish(stack, acct, { name: "console-shell", output_manifest: [{ path: "x.txt" }] })
    const run = await startRun(stack, acct, fn.function, { prompt: "shell" })
    await page.goto(`${stack.url}/runs/${run.id}`)
    await page.waitForSelector(".page-head [data-state='running']", { timeout: 180_000 })
    // A page load: the terminal's page has its own CSP (inline styles for xterm.js).
    await page.click("#open-terminal")
    await page.waitForURL(`${stack.url}/runs/${run.id}/terminal`)
    await page.waitForSelector("#terminal-status:text('connected')")
    await page.click("#terminal")
    await page.keyboard.type("echo answer=$((6*7)); stty size\n")
    await page.waitForSelector(".xterm-rows:has-text('answer=42')")
    await shot("terminal")
    await page.keyboard.type("exit 3\n")
    await page.waitForSelector("#terminal-status:text('the shell exited with status 3')")

    // The list follows the run too: its row turns failed in place, and nothing on the page moves.
    await page.goto(`${stack.url}/runs`)
    await page.waitForSelector(`[data-run='${run.id}'] [data-state='running']`)
    await page.evaluate(`(() => {
      window.shifts = []
      new PerformanceObserver((list) => {
        for (const e of list.getEntries()) if (!e.hadRecentInput) window.shifts.push(e.value)
      }).observe({ type: "layout-shift" })
      window.unreloaded = true
    })()`)
    expectStatus(
      await call(stack, "POST", `/v1/runs/${run.id}/commands`, acct.admin, {
        kind: "finish",
        arguments: { state: "failed", detail: "done looking" },
      }),
      201,
      "finish",
    )
    await page.waitForSelector(`[data-run='${run.id}'] [data-state='failed']`)
    expect(await page.evaluate("window.unreloaded")).toBe(true)
    expect(totalShift(await page.evaluate("window.shifts"))).toBeLessThan(0.001)
    await page.goto(`${stack.url}/runs/${run.id}`)
    await page.waitForSelector(".failure:has-text('no_submission')")
    await page.waitForSelector(".failure:has-text('done looking')")
    await shot("run-failed")
  })
})

describe("keys and members", { timeout: 240_000 }, () => {
  it("an owner creates a key (its token shown once, and it works) and revokes it", async () => {
    await signIn(acct.ownerEmail)
    await page.goto(`${stack.url}/keys`)
    // By keyboard alone: type the name, Enter submits.
    await page.focus("#key-name")
    await page.keyboard.type("from-console")
    await page.keyboard.press("Enter")
    const token = await page.inputValue("#new-token")
    expect(token).toMatch(/^hgr_/)
    await shot("keys")
    const works = await call(stack, "GET", "/v1/functions", { authorization: `Bearer ${token}` })
    expect(works.status).toBe(200)
    page.once("dialog", (d) => void d.accept())
    await page.click("[data-key='from-console'] button:text('Revoke')")
    await page.waitForSelector("[data-key='from-console'] td:nth-child(4):not(:text('—'))")
    const revoked = await call(stack, "GET", "/v1/functions", { authorization: `Bearer ${token}` })
    expect(revoked.status).toBe(401)
    // Once done, the token is not shown again.
    await page.click("button:text('Done')")
    expect(await page.$("#new-token")).toBeNull()
  })

  it("a member sees no owner-only controls, and forcing the call gets owners_only; the switcher changes account", async () => {
    const member = `member-${randomBytes(4).toString("hex")}@example.com`
    expectStatus(
      await call(stack, "POST", "/v1/invites", acct.owner, { email: member, role: "member" }),
      201,
      "invite",
    )
    const memberToken = await personToken(stack.env.OIDC_KEY_FILE!, member)
    expectStatus(
      await call(stack, "POST", `/v1/invites/${acct.id}/accept`, { authorization: `Bearer ${memberToken}` }),
      200,
      "accept",
    )
    // The member also owns an account of their own: the switcher shows both.
    const own = await stack.run(Effect.flatMap(Accounts, (a) => a.createAccount("own-lab", member)))
    await signIn(member)
    await page.selectOption("#account", acct.id)
    await page.goto(`${stack.url}/members`)
    await page.waitForSelector(`td:text("${member}")`)
    expect(await page.$("a:text('Keys')")).toBeNull()
    expect(await page.$("button:text('Invite')")).toBeNull()
    expect(await page.$("button:text('Remove')")).toBeNull()
    await shot("members-as-member")
    const forced = await page.evaluate(`(async () => {
      const session = await (await fetch("/console/session")).json()
      const r = await fetch("/v1/keys", {
        method: "POST",
        headers: {
          "content-type": "application/json",
          "service-account": ${JSON.stringify(acct.id)},
          "x-csrf-token": session.csrf,
        },
        body: JSON.stringify({ name: "sneaky", scope: "admin" }),
      })
      return { status: r.status, body: await r.json() }
    })()`)
    expect(forced).toMatchObject({ status: 403, body: { code: "owners_only" } })
    // In the account they own, the owner's controls are there.
    await page.selectOption("#account", own.account.id)
    await page.waitForSelector("nav a:text('Keys')")
    await page.click("nav a:text('Members')")
    await page.waitForSelector("button:text('Invite')")
    // The owner sees the controls.
    await signIn(acct.ownerEmail)
    await page.goto(`${stack.url}/members`)
    await page.waitForSelector("button:text('Invite')")
    await page.waitForSelector(`td:text("${member}")`)
    // An invite made and cancelled from the page.
    const invited = `invited-${randomBytes(4).toString("hex")}@example.com`
    await page.fill("input[type=email]", invited)
    await page.click("button:text('Invite')")
    await page.waitForSelector(`li:has-text("${invited}")`)
    await shot("members")
    const invites = expectStatus(await call(stack, "GET", "/v1/invites", acct.owner), 200, "invites")
    expect(invites.invites.map((i: { email: string }) => i.email)).toContain(invited)
    await page.click(`li:has-text("${invited}") button:text('Cancel')`)
    await page.waitForSelector(`li:has-text("${invited}")`, { state: "detached" })
  })
})

describe("functions, providers and usage", { timeout: 240_000 }, () => {
  it("show the versions with their definitions, the providers without their keys, the balance and ledger", async () => {
    await signIn(acct.ownerEmail)
    await publishProvider(
      stack,
      acct,
      "main",
      { provider: "openai", model: "gpt-5", compact_at_tokens: 200_000 },
      VENDOR_KEY,
    )
    await page.goto(`${stack.url}/providers`)
    await page.waitForSelector("text=openai gpt-5")
    expect(await page.content()).not.toContain(VENDOR_KEY)
    await shot("providers")

    await page.goto(`${stack.url}/functions`)
    await page.click("a:text('console-fn')")
    await page.waitForSelector("details[open] pre:has-text('answer.txt')")
    await shot("function")

    await page.goto(`${stack.url}/usage`)
    await page.waitForSelector("#balance")
    // The runs above were billed: compute entries, each linking to its run.
    await page.waitForSelector("td:text('compute')")
    await page.waitForSelector("td a[href^='/runs/run_']")
    await shot("usage")
  })
})

describe("credit", { timeout: 240_000 }, () => {
  it("an owner buys credit through the processor's page, and the purchase shows once it is confirmed", async () => {
    await signIn(acct.ownerEmail)
    await page.goto(`${stack.url}/usage`)
    await page.fill("#credit-amount", "25")
    await page.click("#buy-credit")
    await page.waitForURL((u) => u.href.startsWith(payments.url))
    const session = [...payments.sessions.values()].at(-1)!
    expect(session.amount_total).toBe(2500)
    expect(session.success_url).toBe(`${stack.url}/credit?checkout=success`)
    expect((await payments.complete(`${stack.url}/v1/credit/callback`, session.id)).status).toBe(200)
    // The account actor writes the entry; read until it is there, then see it on the page.
    for (;;) {
      const usage = expectStatus(await call(stack, "GET", "/v1/usage", acct.owner), 200, "usage")
      if (usage.entries.some((e: { kind: string }) => e.kind === "purchase")) break
      await new Promise((r) => setTimeout(r, 100))
    }
    await page.goto(session.success_url)
    await page.waitForSelector("#checkout-done")
    await page.waitForSelector("td:text('purchase')")
    await shot("usage-after-purchase")
  })
})

describe("pages", { timeout: 240_000 }, () => {
  it("broke no Content-Security-Policy rule and threw nothing", () => {
    expect(pageErrors).toEqual([])
  })
})

/**
 * The console's runs list past one page, in a real browser: 50 runs a page, newest first, "Older"
 * shows the rest from where the page ended, "Newest" goes back, and a filter keeps to its runs
 * across pages. The runs stay queued (no host agent), so 52 of them cost no machine.
 */
import { Effect } from "effect"
import type { Page } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as ConsoleSessions from "../core/ConsoleSessions.ts"
import { launchBrowser, type TestBrowser } from "./harness/Browser.ts"
import {
  advertiseBase,
  closeStack,
  createAccount,
  publish,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
} from "./harness/Stack.ts"

let stack: Stack
let acct: TestAccount
let browser: TestBrowser
let page: Page
/** Run ids, oldest first. */
const runs: Array<string> = []
const others: Array<string> = []

beforeAll(async () => {
  stack = await startStack({ noHost: true, queueTimeoutMs: 3_600_000 })
  await advertiseBase(stack, "host_console_paging")
  // Queued runs hold their size's memory against the account's limit: room for all of them.
  acct = await createAccount(stack, { name: "paging", creditUsd: 100, memoryMib: 256 * 1024 })
  const fn = await publish(stack, acct, { name: "many" })
  const other = await publish(stack, acct, { name: "other" })
  for (let i = 0; i < 52; i++) runs.push((await startRun(stack, acct, fn.function)).id)
  for (let i = 0; i < 2; i++) others.push((await startRun(stack, acct, other.function)).id)
  browser = await launchBrowser()
  page = await browser.page()
  const secret = await stack.run(
    Effect.flatMap(ConsoleSessions.make, (s) => s.createLink(acct.ownerEmail, 600_000)),
  )
  await page.goto(`${stack.url}/console/sign-in?link=${secret}`)
  await page.waitForSelector(`.email:text("${acct.ownerEmail}")`)
}, 300_000)

afterAll(async () => {
  await browser?.close()
  await closeStack(stack)
}, 120_000)

/** The run ids the list shows, top to bottom, once they are `want` (or what it shows after 30 s). */
const shows = async (want: ReadonlyArray<string>) => {
  const rows = page.locator("tbody tr")
  const ids = () => rows.evaluateAll((all) => all.map((row) => row.getAttribute("data-run")))
  await expect.poll(ids, { timeout: 30_000 }).toEqual(want)
}

describe("the runs list", { timeout: 240_000 }, () => {
  it("shows 50 runs a page, newest first; Older shows the rest, Newest goes back", async () => {
    const newestFirst = [...runs, ...others].reverse()
    await page.goto(`${stack.url}/runs`)
    await shows(newestFirst.slice(0, 50))
    await page.click("nav.paging button:text('Older')")
    await shows(newestFirst.slice(50))
    // The last page offers no older one.
    expect(await page.$("nav.paging button:text('Older')")).toBeNull()
    await page.click("nav.paging button:text('Newest')")
    await shows(newestFirst.slice(0, 50))
  })

  it("a function filter, chosen on the page, keeps to that function's runs across pages", async () => {
    await page.goto(`${stack.url}/runs`)
    await shows([...runs, ...others].reverse().slice(0, 50))
    await page.selectOption("select:has(option:text('All functions'))", { label: "many" })
    const newestFirst = [...runs].reverse()
    await shows(newestFirst.slice(0, 50))
    await page.click("nav.paging button:text('Older')")
    await shows(newestFirst.slice(50))
    expect(new URL(page.url()).searchParams.get("function")).toMatch(/^fnc_/)
  })
})

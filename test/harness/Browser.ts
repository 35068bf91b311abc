/**
 * A real browser for the console's tests: Debian's Chromium (`/usr/bin/chromium`, installed by the
 * bootstrap) driven by playwright-core, which never downloads a browser of its own. Each launch
 * gets a fresh profile folder in a temporary folder, removed when it closes, and nothing of the
 * network but what the page asks for (no first-run, sync, component updates or QUIC).
 */
import { existsSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { type BrowserContext, chromium, type Page } from "playwright-core"

/** Where Debian puts Chromium. */
export const chromiumPath = process.env.HANGAR_CHROMIUM ?? "/usr/bin/chromium"

/** Whether Chromium is installed here. */
export const hasChromium = (): boolean => existsSync(chromiumPath)

/** A running browser: its one context (one cookie jar), and how to end it. */
export interface TestBrowser {
  readonly context: BrowserContext
  /** A new tab. */
  readonly page: () => Promise<Page>
  /** Closes the browser and removes its profile. */
  readonly close: () => Promise<void>
}

/** Starts Chromium headless with a fresh profile. */
export const launchBrowser = async (options: { readonly width?: number; readonly height?: number } = {}) => {
  const profile = await mkdtemp(join(tmpdir(), "hangar-chromium-"))
  try {
    const context = await chromium.launchPersistentContext(profile, {
      executablePath: chromiumPath,
      headless: true,
      chromiumSandbox: false,
      acceptDownloads: true,
      viewport: { width: options.width ?? 1280, height: options.height ?? 800 },
      args: [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
      ],
      timeout: 120_000,
    })
    context.setDefaultTimeout(60_000)
    return {
      context,
      page: () => context.newPage(),
      close: async () => {
        await context.close().catch(() => undefined)
        await rm(profile, { recursive: true, force: true })
      },
    } satisfies TestBrowser
  } catch (e) {
    await rm(profile, { recursive: true, force: true })
    throw e
  }
}

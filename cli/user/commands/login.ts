/**
 * `login`: the spec's CLI login. The CLI makes a key token and keeps it; the API gets only its
 * SHA-256 and the machine's name, and answers a code and an approval page. A person opens the page
 * (the CLI opens a browser only on a desktop session: `DISPLAY` or `WAYLAND_DISPLAY` set), checks
 * that it shows the same code, and approves; the CLI polls until then or until the login expires
 * (10 minutes), and saves the token for this API address (`Credentials.ts`). The token is never
 * printed.
 */
import { spawn } from "node:child_process"
import { hostname } from "node:os"
import { hashToken, newToken } from "../../../core/KeyTokens.ts"
import { type Command, text } from "../Command.ts"
import * as Credentials from "../Credentials.ts"
import * as Print from "../Print.ts"

interface Started {
  readonly id: string
  readonly code: string
  readonly url: string
  readonly expires_at: number
}
interface LoginState {
  readonly id: string
  readonly state: "pending" | "approved" | "expired"
  readonly expires_at: number
  readonly account?: string
  readonly key?: string
}

const POLL_MS = 2000

const openBrowser = (url: string, env: NodeJS.ProcessEnv) => {
  if (!env.DISPLAY && !env.WAYLAND_DISPLAY) return
  try {
    const child = spawn("xdg-open", [url], { stdio: "ignore", detached: true })
    child.on("error", () => undefined)
    child.unref()
  } catch {
    // No opener: the URL is printed anyway.
  }
}

export const login: Command = {
  options: { name: { type: "string" } },
  positionals: [0, 0],
  run: async ({ api, out, values, env }) => {
    const name = (text(values, "name") ?? hostname()).slice(0, 40) || "cli"
    const token = newToken()
    const started = await api.call<Started>(
      "POST",
      "/v1/cli-logins",
      { name, key_hash: hashToken(token) },
      { anonymous: true },
    )
    if (out.json) Print.line(JSON.stringify(started))
    Print.note(
      `To approve this machine (${name}), open:\n\n  ${started.url}\n\nand check that the page shows the code ${Print.bold(out, started.code)}.\nWaiting for approval (until ${Print.when(new Date(started.expires_at * 1000).toISOString())})…`,
    )
    openBrowser(started.url, env)
    for (;;) {
      const now = await api.call<LoginState>(
        "GET",
        `/v1/cli-logins/${encodeURIComponent(started.id)}`,
        undefined,
        {
          anonymous: true,
        },
      )
      if (now.state === "expired")
        throw new Error("the login expired before it was approved; run `hangar login` again")
      if (now.state === "approved" && now.account && now.key) {
        const file = Credentials.save(
          api.base,
          { key: token, account: now.account, key_id: now.key, name },
          env,
        )
        if (out.json) return Print.line(JSON.stringify(now))
        return Print.note(`Signed in to ${now.account} as key ${now.key} (${name}); saved in ${file}`)
      }
      await new Promise((r) => setTimeout(r, POLL_MS))
    }
  },
}

/** The console's session cookie and redirects, shared by its link and OIDC sign-ins. */
import { type ConsoleSettings, SESSION_COOKIE } from "../../core/ConsoleSessions.ts"
import { empty, type Reply } from "../Response.ts"

type Settings = typeof ConsoleSettings.Tag.Service

/** Whether the cookie must be `Secure`: always, except for a console served over plain HTTP on loopback. */
export const secureCookie = (consoleUrl: string): boolean => {
  try {
    const url = new URL(consoleUrl)
    const loopback = ["127.0.0.1", "localhost", "[::1]"].includes(url.hostname)
    return !(url.protocol === "http:" && loopback)
  } catch {
    return true
  }
}

const cookie = (value: string, maxAgeSeconds: number, secure: boolean) =>
  `${SESSION_COOKIE}=${value}; Path=/; HttpOnly; SameSite=Lax; Max-Age=${maxAgeSeconds}${secure ? "; Secure" : ""}`

/** The `Set-Cookie` of a new session. */
export const sessionCookie = (sessionId: string, settings: Settings) =>
  cookie(sessionId, Math.floor(settings.sessionMs / 1000), secureCookie(settings.consoleUrl))

/** The `Set-Cookie` that removes the session cookie. */
export const clearedCookie = (settings: Settings) => cookie("", 0, secureCookie(settings.consoleUrl))

/** A `303` to `location`, never cached, telling the next page nothing of this one's address. */
export const redirect = (location: string, headers: Record<string, string> = {}): Reply =>
  empty({
    status: 303,
    headers: { location, "cache-control": "no-store", "referrer-policy": "no-referrer", ...headers },
  })

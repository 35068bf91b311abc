import { Redacted } from "effect"
import { describe, expect, it } from "vitest"
import { clearedCookie, secureCookie, sessionCookie } from "./Cookies.ts"

const settings = (consoleUrl: string) => ({
  consoleUrl,
  linkMs: 600_000,
  sessionMs: 3_600_000,
  oidcClientSecret: Redacted.make(""),
})

describe("the session cookie", () => {
  it("is Secure except for a plain-HTTP console on a loopback host", () => {
    expect(secureCookie("http://127.0.0.1:8080")).toBe(false)
    expect(secureCookie("http://localhost:8080")).toBe(false)
    expect(secureCookie("http://[::1]:8080")).toBe(false)
    expect(secureCookie("https://127.0.0.1:8443")).toBe(true)
    expect(secureCookie("https://console.example.com")).toBe(true)
    expect(secureCookie("http://console.example.com")).toBe(true)
    expect(secureCookie("http://10.0.0.5:8080")).toBe(true)
    expect(secureCookie("not a url")).toBe(true)
  })

  it("is HttpOnly, SameSite=Lax, for the whole site, as long as the session", () => {
    expect(sessionCookie("abc", settings("https://console.example.com"))).toBe(
      "hangar_session=abc; Path=/; HttpOnly; SameSite=Lax; Max-Age=3600; Secure",
    )
    expect(sessionCookie("abc", settings("http://127.0.0.1:8080"))).toBe(
      "hangar_session=abc; Path=/; HttpOnly; SameSite=Lax; Max-Age=3600",
    )
    expect(clearedCookie(settings("https://console.example.com"))).toBe(
      "hangar_session=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0; Secure",
    )
  })
})

import { describe, expect, it } from "vitest"
import { routes } from "../main.ts"
import { keyRoutePrefixes, peopleOnlyForKeys } from "./Access.ts"

describe("where keys may go", () => {
  it("the prefixes named to a refused key are exactly those of the gateway's key routes", () => {
    const keyRoutes = routes.flatMap((r) =>
      "access" in r && (r.access === "member" || r.access === "member (admin keys)") ? [r.path] : [],
    )
    expect(keyRoutes.length).toBeGreaterThan(10)
    for (const path of keyRoutes) {
      expect(
        keyRoutePrefixes.some((p) => path === p || path.startsWith(`${p}/`)),
        path,
      ).toBe(true)
    }
    for (const prefix of keyRoutePrefixes)
      expect(
        keyRoutes.some((path) => path === prefix || path.startsWith(`${prefix}/`)),
        prefix,
      ).toBe(true)
    expect(peopleOnlyForKeys).toContain("/v1/functions, ")
    expect(peopleOnlyForKeys).toMatch(/ and \/v1\/webhooks\/public-key$/)
  })
})

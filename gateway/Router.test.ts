import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { empty } from "./Response.ts"
import type { Params } from "./Router.ts"
import { make, route } from "./Router.ts"

const ok = () => Effect.succeed(empty())

describe("route table", () => {
  const router = make([
    route({ method: "GET", path: "/v1/runs", handler: ok }),
    route({ method: "POST", path: "/v1/runs", handler: ok }),
    route({ method: "GET", path: "/v1/runs/:id", handler: ok }),
    route({ method: "GET", path: "/v1/runs/:id/commands/:cid", handler: ok }),
    route({ method: "POST", path: "/v1/runs/:id/commands", handler: ok }),
    route({ method: "GET", path: "/v1/runs/wait/all", handler: ok }),
  ])

  it("matches literal paths and names parameters", () => {
    expect(router.match("GET", "/v1/runs")).toMatchObject({ _tag: "Found", params: {} })
    expect(router.match("GET", "/v1/runs/run_1/commands/cmd_2")).toMatchObject({
      _tag: "Found",
      route: { path: "/v1/runs/:id/commands/:cid" },
      params: { id: "run_1", cid: "cmd_2" },
    })
  })

  it("prefers a literal segment and falls back to a parameter", () => {
    expect(router.match("GET", "/v1/runs/wait/all")).toMatchObject({ route: { path: "/v1/runs/wait/all" } })
    expect(router.match("GET", "/v1/runs/wait")).toMatchObject({
      route: { path: "/v1/runs/:id" },
      params: { id: "wait" },
    })
    expect(router.match("POST", "/v1/runs/wait/commands")).toMatchObject({ params: { id: "wait" } })
  })

  it("percent-decodes parameters; a malformed escape is not found", () => {
    expect(router.match("GET", "/v1/runs/a%2Fb")).toMatchObject({ params: { id: "a/b" } })
    expect(router.match("GET", "/v1/runs/%E0%A4")).toEqual({ _tag: "NotFound" })
  })

  it("unknown paths, empty segments and trailing slashes are not found", () => {
    for (const path of ["/v1/run", "/v1/runs/", "/v1//runs", "/v1/runs/x/commands/y/z", "", "/"]) {
      expect(router.match("GET", path)).toEqual({ _tag: "NotFound" })
    }
  })

  it("a path served for other methods only lists them", () => {
    expect(router.match("DELETE", "/v1/runs")).toEqual({ _tag: "MethodNotAllowed", allow: ["GET", "POST"] })
    expect(router.match("GET", "/v1/runs/x/commands")).toEqual({ _tag: "MethodNotAllowed", allow: ["POST"] })
  })

  it("refuses duplicate routes, conflicting parameter names and malformed patterns", () => {
    expect(() =>
      make([
        route({ method: "GET", path: "/a", handler: ok }),
        route({ method: "GET", path: "/a", handler: ok }),
      ]),
    ).toThrow(/duplicate/)
    expect(() =>
      make([
        route({ method: "GET", path: "/a/:x", handler: ok }),
        route({ method: "PUT", path: "/a/:y", handler: ok }),
      ]),
    ).toThrow(/conflicts/)
    for (const path of ["a", "/a/", "/a//b", "/a/:"]) {
      expect(() => make([route({ method: "GET", path, handler: ok })])).toThrow(/bad route/)
    }
  })

  it("derives parameter types from the pattern", () => {
    const params: Params<"/v1/runs/:id/commands/:cid"> = { id: "run_1", cid: "cmd_1" }
    const one: Params<"/v1/runs/:id"> = { id: "run_1" }
    // @ts-expect-error a pattern's parameters are exactly its `:names`
    const missing: string = one.cid
    expect([params.id, params.cid, one.id, missing]).toEqual(["run_1", "cmd_1", "run_1", undefined])
  })
})

import { Effect, Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { decodeBody, decodeBodyEither, decodeJsonBody, formatPath } from "./Decode.ts"
import { ApiError, ErrorBody, errorStatus } from "./Errors.ts"

describe("error codes", () => {
  it.each([
    ["invalid_request", 400],
    ["invalid_signature", 400],
    ["account_required", 400],
    ["unauthenticated", 401],
    ["no_credit", 402],
    ["key_scope", 403],
    ["people_only", 403],
    ["not_a_member", 403],
    ["owners_only", 403],
    ["suspended", 403],
    ["csrf_token", 403],
    ["not_found", 404],
    ["method_not_allowed", 405],
    ["conflict", 409],
    ["run_ended", 409],
    ["payload_too_large", 413],
    ["memory_limit", 429],
    ["rate_limited", 429],
    ["internal", 500],
    ["vendor_unavailable", 502],
    ["purchases_closed", 503],
  ] as const)("%s is %i", (code, status) => {
    expect(errorStatus[code]).toBe(status)
    expect(ApiError.of(code, "x").status).toBe(status)
  })

  it("has no code beyond the table", () => {
    expect(Object.keys(errorStatus)).toHaveLength(21)
  })

  it("makes the body from the code and message", () => {
    const e = ApiError.notFound("run")
    expect(e.body).toEqual({ error: "run not found", code: "not_found" })
    expect(e.status).toBe(404)
    expect(Schema.is(ErrorBody)(e.body)).toBe(true)
  })

  it("has a constructor per code with that code", () => {
    const made = [
      ApiError.invalidRequest("x"),
      ApiError.invalidSignature(),
      ApiError.accountRequired(),
      ApiError.unauthenticated(),
      ApiError.noCredit(),
      ApiError.keyScope(),
      ApiError.peopleOnly(),
      ApiError.notAMember(),
      ApiError.ownersOnly(),
      ApiError.suspended(),
      ApiError.csrfToken(),
      ApiError.notFound(),
      ApiError.methodNotAllowed("PUT"),
      ApiError.conflict(),
      ApiError.runEnded(),
      ApiError.payloadTooLarge(1024),
      ApiError.memoryLimit(),
      ApiError.rateLimited(),
      ApiError.internal(),
      ApiError.vendorUnavailable(),
      ApiError.purchasesClosed(),
    ]
    expect(new Set(made.map((e) => e.code))).toEqual(new Set(Object.keys(errorStatus)))
  })

  it("round-trips through its schema (it crosses the bus)", () => {
    const e = ApiError.conflict()
    const encoded = Schema.encodeSync(ApiError)(e)
    expect(encoded).toEqual({ _tag: "ApiError", code: "conflict", message: e.message })
    const back = Schema.decodeUnknownSync(ApiError)(encoded)
    expect(back).toBeInstanceOf(ApiError)
    expect(back.status).toBe(409)
  })

  it("fails an Effect as a typed error", async () => {
    const exit = await Effect.runPromise(Effect.either(ApiError.suspended()))
    expect(Either.isLeft(exit) && exit.left.status).toBe(403)
  })
})

describe("decodeBody", () => {
  const S = Schema.Struct({ a: Schema.Array(Schema.Struct({ b: Schema.String })) })

  it("formats paths as callers write them", () => {
    expect(formatPath(["custom_tools", 0, "name"])).toBe("custom_tools[0].name")
    expect(formatPath([3])).toBe("[3]")
    expect(formatPath([])).toBe("")
  })

  it("fails with invalid_request naming the field", async () => {
    const e = await Effect.runPromise(Effect.flip(decodeBody(S)({ a: [{ b: "x" }, { b: 1 }] })))
    expect(e.code).toBe("invalid_request")
    expect(e.message).toBe("a[1].b: must be a string")
  })

  it("refuses unknown fields, naming them", () => {
    const r = decodeBodyEither(S)({ a: [{ b: "x", c: 1 }] })
    expect(Either.isLeft(r) && r.left.message).toBe("a[0].c: unknown field")
  })

  it("refuses text that is not JSON", async () => {
    const e = await Effect.runPromise(Effect.flip(decodeJsonBody(S)("{a:")))
    expect(e.message).toBe("body: not valid JSON")
    expect(await Effect.runPromise(decodeJsonBody(S)('{"a":[]}'))).toEqual({ a: [] })
  })
})

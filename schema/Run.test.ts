import { Either } from "effect"
import { describe, expect, it } from "vitest"
import { decodeBodyEither } from "./Decode.ts"
import { StartRunRequest } from "./Run.ts"

const decode = decodeBodyEither(StartRunRequest)
const upload = `file_${"0".repeat(26)}`

describe("StartRunRequest", () => {
  it.each([
    ["prompt of 131072 characters", { prompt: "p".repeat(131072) }, null],
    ["prompt of 131073 characters", { prompt: "p".repeat(131073) }, "prompt: at most 131072 characters"],
    // Characters, not bytes: 131072 three-byte characters are 384 KiB and still accepted.
    ["prompt of 131072 3-byte characters", { prompt: "€".repeat(131072) }, null],
    [
      "prompt of 131073 3-byte characters",
      { prompt: "€".repeat(131073) },
      "prompt: at most 131072 characters",
    ],
    ["empty prompt", { prompt: "" }, null],
    ["no prompt", {}, "prompt: is required"],
    ["prompt not a string", { prompt: 5 }, "prompt: must be a string"],
    ["an input upload", { prompt: "p", input: upload }, null],
    ["input of another kind", { prompt: "p", input: `run_${"0".repeat(26)}` }, "input: must be a file_ id"],
    ["version 0", { prompt: "p", version: 0 }, null],
    ["version 7", { prompt: "p", version: 7 }, null],
    ["version -1", { prompt: "p", version: -1 }, "version: must be an integer of at least 0"],
    ["version 1.5", { prompt: "p", version: 1.5 }, "version: must be an integer of at least 0"],
    ["https webhook", { prompt: "p", webhook: "https://hooks.example.com/x?y=1" }, null],
    [
      "http webhook",
      { prompt: "p", webhook: "http://hooks.example.com/x" },
      "webhook: must be an https:// URL",
    ],
    ["relative webhook", { prompt: "p", webhook: "/x" }, "webhook: must be an absolute https:// URL"],
    ["external_reference of 256 bytes", { prompt: "p", external_reference: "r".repeat(256) }, null],
    [
      "external_reference of 257 bytes",
      { prompt: "p", external_reference: "r".repeat(257) },
      "external_reference: at most 256 bytes",
    ],
    [
      "external_reference of 86 3-byte characters",
      { prompt: "p", external_reference: "€".repeat(86) },
      "external_reference: at most 256 bytes",
    ],
    ["external_reference of 85 3-byte characters", { prompt: "p", external_reference: "€".repeat(85) }, null],
    ["an unknown field", { prompt: "p", webhook_url: "https://x.example" }, "webhook_url: unknown field"],
  ] as const)("%s", (_label, body, expected) => {
    const r = decode(body)
    if (expected === null) expect(Either.isRight(r)).toBe(true)
    else {
      expect(Either.isLeft(r)).toBe(true)
      if (Either.isLeft(r)) {
        expect(r.left.code).toBe("invalid_request")
        expect(r.left.message.startsWith(expected)).toBe(true)
      }
    }
  })

  it("fills version 0 (the latest) when it is left out", () => {
    expect(decode({ prompt: "p" })).toEqual(Either.right({ prompt: "p", version: 0 }))
  })
})

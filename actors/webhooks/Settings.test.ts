/** Webhook settings from the environment: the comma list of delays, the switches, the defaults. */
import { ConfigProvider, Effect } from "effect"
import { describe, expect, it } from "vitest"
import { WebhookSettings } from "./Settings.ts"

const read = (vars: Record<string, string>) =>
  Effect.runSync(
    WebhookSettings.Tag.pipe(
      Effect.provide(WebhookSettings.layerFromEnv),
      Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(vars)))),
    ),
  )

describe("WebhookSettings", () => {
  it("defaults: at once, 1 minute, 10 minutes; 10 s to answer; public targets only", () => {
    expect(read({})).toEqual({
      attemptDelaysMs: [0, 60_000, 600_000],
      answerTimeoutMs: 10_000,
      caFile: "",
      allowPrivateTargets: false,
    })
  })

  it("reads HANGAR_WEBHOOK_* variables", () => {
    expect(
      read({
        HANGAR_WEBHOOK_ATTEMPT_DELAYS_MS: "0,250,500",
        HANGAR_WEBHOOK_ANSWER_TIMEOUT_MS: "1500",
        HANGAR_WEBHOOK_CA_FILE: "/tmp/ca.pem",
        HANGAR_WEBHOOK_ALLOW_PRIVATE: "true",
      }),
    ).toEqual({
      attemptDelaysMs: [0, 250, 500],
      answerTimeoutMs: 1500,
      caFile: "/tmp/ca.pem",
      allowPrivateTargets: true,
    })
  })

  it("a malformed delay list fails naming the variable", () => {
    expect(() => read({ HANGAR_WEBHOOK_ATTEMPT_DELAYS_MS: "0,soon" })).toThrow(
      /HANGAR_WEBHOOK_ATTEMPT_DELAYS_MS/,
    )
    expect(() => read({ HANGAR_WEBHOOK_ATTEMPT_DELAYS_MS: "0,-5" })).toThrow(
      /HANGAR_WEBHOOK_ATTEMPT_DELAYS_MS/,
    )
  })
})

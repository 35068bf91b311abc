import { ConfigProvider, Effect, type Layer, Redacted } from "effect"
import { describe, expect, it } from "vitest"
import { defineSettings, env } from "./Config.ts"

const Example = defineSettings(
  "test/ExampleSettings",
  { port: 8080, host: "127.0.0.1", token: Redacted.make("default-token"), debug: false },
  (d) => ({
    port: env.integer("EXAMPLE_PORT", d.port),
    token: env.redacted("EXAMPLE_TOKEN", "default-token"),
    debug: env.boolean("EXAMPLE_DEBUG", d.debug),
  }),
)

const read = (layer: Layer.Layer<"test/ExampleSettings">, vars: Record<string, string> = {}) =>
  Effect.runSync(
    Example.Tag.pipe(
      Effect.provide(layer),
      Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(vars)))),
    ),
  )

describe("defineSettings", () => {
  it("layer(partial) overrides defaults", () => {
    expect(read(Example.layer({ port: 1 }))).toMatchObject({ port: 1, host: "127.0.0.1" })
  })

  it("layerFromEnv reads HANGAR_* variables and keeps defaults for the rest", () => {
    const s = read(Example.layerFromEnv, { HANGAR_EXAMPLE_PORT: "9090", HANGAR_EXAMPLE_TOKEN: "tok-123" })
    expect(s.port).toBe(9090)
    expect(s.host).toBe("127.0.0.1")
    expect(Redacted.value(s.token)).toBe("tok-123")
    expect(String(s.token)).not.toContain("tok-123")
  })

  it("a malformed variable fails naming it", () => {
    expect(() => read(Example.layerFromEnv, { HANGAR_EXAMPLE_PORT: "eighty" })).toThrow(/HANGAR_EXAMPLE_PORT/)
  })

  it("a negative count is refused naming the variable; 0 is taken", () => {
    expect(() => read(Example.layerFromEnv, { HANGAR_EXAMPLE_PORT: "-1" })).toThrow(
      /HANGAR_EXAMPLE_PORT.*must be a whole number, 0 or more/,
    )
    expect(read(Example.layerFromEnv, { HANGAR_EXAMPLE_PORT: "0" }).port).toBe(0)
  })
})

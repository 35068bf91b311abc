import { existsSync } from "node:fs"
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { Nats } from "../../core/Nats.ts"
import { alive, layerWithNats, NatsServer, startNatsServer } from "./NatsServer.ts"
import { uniqueName, uniquePrefix } from "./names.ts"

describe("startNatsServer", () => {
  it("starts a server with a temp store and removes both on stop (stop is idempotent)", async () => {
    const server = await startNatsServer()
    expect(server.url).toMatch(/^nats:\/\/127\.0\.0\.1:\d+$/)
    expect(existsSync(server.storeDir)).toBe(true)
    expect(alive(server.pid)).toBe(true)
    await Promise.all([server.stop(), server.stop()])
    expect(alive(server.pid)).toBe(false)
    expect(existsSync(server.storeDir)).toBe(false)
  })
})

layer(layerWithNats)("NatsServer layer", (it) => {
  it.effect("provides the server and a connection to it", () =>
    Effect.gen(function* () {
      const server = yield* NatsServer
      const { connection } = yield* Nats
      expect(connection.getServer()).toBe(`127.0.0.1:${server.port}`)
      expect(connection.info?.jetstream).toBe(true)
    }),
  )
})

describe("names", () => {
  it("are unique and valid as bucket, stream and subject token", () => {
    const names = new Set(Array.from({ length: 1000 }, () => uniqueName("kv")))
    expect(names.size).toBe(1000)
    for (const n of names) expect(n).toMatch(/^kv_[0-9a-z]{10}$/)
    expect(uniqueName("a.b c")).toMatch(/^a_b_c_[0-9a-z]{10}$/)
    expect(uniquePrefix()).toMatch(/^t[0-9a-z]{11}$/)
  })
})

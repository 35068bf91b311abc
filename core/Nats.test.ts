/**
 * The first connection: refused credentials end a process at once with a reason that names the
 * settings and never their values; no server answering fails a command at once and keeps a role
 * waiting (said in its log) until one answers.
 */

import { TimeoutError } from "@nats-io/transport-node"
import { Context, Effect, Exit, Fiber, Layer, Logger, Redacted } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { hangar } from "../test/harness/Cli.ts"
import { type StartedNatsServer, startNatsServer } from "../test/harness/NatsServer.ts"
import * as Nats from "./Nats.ts"

const token = "tok-2b1c7e9d"
const wrong = "wrong-5f0a33c1"

const connectWith = (settings: Partial<Nats.NatsSettingsShape>) =>
  Effect.scoped(
    Layer.build(Nats.layer.pipe(Layer.provide(Nats.NatsSettings.layer(settings)))).pipe(
      Effect.flatMap((context) => Effect.promise(() => Context.get(context, Nats.Nats).connection.flush())),
    ),
  )

describe("connecting to NATS", () => {
  let server: StartedNatsServer
  beforeAll(async () => {
    server = await startNatsServer({ extraConfig: `authorization { token: "${token}" }` })
  })
  afterAll(() => server?.stop())

  it("refused credentials fail at once, naming the settings and not the token, even for a role that waits", async () => {
    for (const settings of [
      { token: Redacted.make(wrong) },
      { token: Redacted.make(wrong), waitForServers: true },
      {},
    ]) {
      const exit = await Effect.runPromiseExit(connectWith({ servers: server.url, ...settings }))
      expect(Exit.isFailure(exit)).toBe(true)
      const text = JSON.stringify(exit)
      expect(text).toContain("refused this process's credentials")
      expect(text).toContain("HANGAR_NATS_TOKEN")
      expect(text).not.toContain(wrong)
      expect(text).not.toContain(token)
    }
    // The right token connects.
    await Effect.runPromise(connectWith({ servers: server.url, token: Redacted.make(token) }))
  })

  it("a role started with the wrong token exits 1 with that reason on stderr", async () => {
    const ran = await hangar(["serve", "actors"], {
      env: { HANGAR_NATS_URL: server.url, HANGAR_NATS_TOKEN: wrong },
      timeoutMs: 60_000,
    })
    expect(ran.status).toBe(1)
    expect(ran.stderr).toMatch(/^hangar: the NATS servers .* refused this process's credentials/m)
    expect(ran.stderr + ran.stdout).not.toContain(wrong)
  })

  it("with no server answering, a command fails at once and a role waits, says so, and connects once one is back", async () => {
    const lone = await startNatsServer()
    try {
      await lone.kill()
      const failed = await Effect.runPromiseExit(connectWith({ servers: lone.url }))
      expect(JSON.stringify(failed)).toContain(`no NATS server answers at ${lone.url}`)

      const warnings: Array<string> = []
      const logger = Logger.replace(
        Logger.defaultLogger,
        Logger.make(({ logLevel, message }) => {
          if (logLevel._tag === "Warning") warnings.push(String(message))
        }),
      )
      const waiting = Effect.runFork(
        connectWith({ servers: lone.url, waitForServers: true }).pipe(Effect.provide(logger)),
      )
      while (warnings.length === 0) await new Promise((r) => setTimeout(r, 50))
      expect(warnings[0]).toContain(`no NATS server answers at ${lone.url}`)
      expect(warnings[0]).toContain("waiting for one")
      // Still waiting after a few more tries.
      await new Promise((r) => setTimeout(r, 2_500))
      expect(waiting.unsafePoll()).toBeNull()
      await lone.restart()
      expect(Exit.isSuccess(await Effect.runPromise(Fiber.await(waiting)))).toBe(true)
    } finally {
      await lone.stop()
    }
  })

  it("a server list shown in messages leaves out any user and password in its URLs", () => {
    expect(Nats.shownServers("nats://ops:s3cret@10.0.0.1:4222,nats://10.0.0.2:4222")).toBe(
      "nats://10.0.0.1:4222,nats://10.0.0.2:4222",
    )
  })

  it("a request that timed out or found no responder makes the store unsettled; another failure does not", async () => {
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const context = yield* Layer.build(
            Nats.layer.pipe(
              Layer.provide(Nats.NatsSettings.layer({ servers: server.url, token: Redacted.make(token) })),
            ),
          )
          const nats = Context.get(context, Nats.Nats)
          expect(nats.settled()).toBe(true)
          yield* Effect.flip(Nats.attempt("refused", () => Promise.reject(new Error("bad request"))))
          expect(nats.settled()).toBe(true)
          // Thrown by the client for a request the server did not answer in time.
          yield* Effect.flip(Nats.attempt("read", () => Promise.reject(new TimeoutError())))
          expect(nats.settled()).toBe(false)
        }),
      ),
    )
  })
})

/**
 * Test helpers for the actor runtime: workers with their own NATS connection in their own scope
 * (so a test can close or "kill" one), and polling for a condition on stored state.
 */
import { Context, Duration, Effect, Exit, Layer, Logger, LogLevel, Option, Scope } from "effect"
import type { AnyActor } from "../../../schema/actors/Actor.ts"
import { uniquePrefix } from "../../../test/harness/names.ts"
import * as Nats from "../../Nats.ts"
import * as Storage from "../../Storage.ts"
import * as Mailbox from "../Mailbox.ts"
import { ActorSettings, type ActorSettingsShape } from "../Settings.ts"
import * as Worker from "../Worker.ts"

/** The layers a test needs to send and read: connection, storage under `prefix`, settings, mailbox. */
export const clientLayer = (url: string, prefix: string, settings: Partial<ActorSettingsShape> = {}) =>
  Mailbox.layer.pipe(
    Layer.provideMerge(Storage.layerPrefix(prefix)),
    Layer.provideMerge(ActorSettings.layer(settings)),
    Layer.provideMerge(Nats.layerUrl(url, "test-client")),
  )

/** Settings that make lease expiry and retries quick enough for tests. */
export const fast: Partial<ActorSettingsShape> = {
  leaseMs: 1_500,
  renewMs: 300,
  retryBaseMs: 50,
  retryMaxMs: 200,
}

/** Runs `body` with a client (fast settings) for a fresh storage prefix on the server at `url`. */
export const withClient = <A, E>(
  url: string,
  body: (prefix: string) => Effect.Effect<A, E, Layer.Layer.Success<ReturnType<typeof clientLayer>>>,
) => {
  const prefix = uniquePrefix()
  return body(prefix).pipe(Effect.provide(clientLayer(url, prefix, fast)))
}

/** A started worker with its own connection; `stop` closes it gracefully. */
export interface TestWorker {
  readonly worker: Worker.WorkerService
  readonly stop: Effect.Effect<void>
}

/** Starts a worker in its own scope. */
export const startWorker = (
  url: string,
  prefix: string,
  actors: ReadonlyArray<AnyActor>,
  settings: Partial<ActorSettingsShape> = {},
  faults?: Worker.WorkerFaults["Type"],
  logLevel: LogLevel.LogLevel = LogLevel.Warning,
) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const base = Worker.layer(actors).pipe(
      Layer.provide(Storage.layerPrefix(prefix)),
      Layer.provide(ActorSettings.layer(settings)),
      Layer.provide(Nats.layerUrl(url, "test-worker")),
    )
    const withFaults = faults ? base.pipe(Layer.provide(Layer.succeed(Worker.WorkerFaults, faults))) : base
    // Per-message info logs would drown a test's output; warnings and errors still show.
    const layer = withFaults.pipe(Layer.provide(Logger.minimumLogLevel(logLevel)))
    const context = yield* Layer.buildWithScope(layer, scope).pipe(Effect.orDie)
    const worker = Context.get(context, Worker.Worker)
    return { worker, stop: Scope.close(scope, Exit.void) } satisfies TestWorker
  })

/** Re-runs `check` until it returns some value; dies after `timeout` (a test that cannot finish). */
export const eventually = <A, E, R>(
  check: Effect.Effect<Option.Option<A>, E, R>,
  timeout: Duration.DurationInput = "20 seconds",
  what = "condition",
) =>
  Effect.gen(function* () {
    const deadline = Date.now() + Duration.toMillis(Duration.decode(timeout))
    while (true) {
      const result = yield* check
      if (Option.isSome(result)) return result.value
      if (Date.now() > deadline) return yield* Effect.dieMessage(`timed out waiting for ${what}`)
      yield* Effect.sleep("50 millis")
    }
  })

/**
 * A real nats-server per test file: port -1, a temporary store directory removed on release, the
 * store encrypted with a random key.
 *
 * Two forms: `layer` / `scoped` for `@effect/vitest` (`layer(NatsServer.layer)(...)`), and
 * `startNatsServer()` for plain `beforeAll/afterAll`. Tests sharing one server keep apart by
 * creating their storage under a unique prefix (`test/harness/names.ts`).
 */
import { randomBytes } from "node:crypto"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Context, Effect, Exit, Layer, ManagedRuntime, Redacted, Scope } from "effect"
import * as Keyring from "../../core/Keyring.ts"
import * as MasterKey from "../../core/MasterKey.ts"
import * as Nats from "../../core/Nats.ts"
import * as SealStream from "../../core/SealStream.ts"
import * as Storage from "../../core/Storage.ts"
import * as WrappedKeyStore from "../../core/WrappedKeyStore.ts"
import * as NatsProcess from "../../deploy/NatsProcess.ts"
import { uniquePrefix } from "./names.ts"
import { freePort } from "./Ports.ts"

/** The running test server. */
export class NatsServer extends Context.Tag("test/NatsServer")<NatsServer, NatsProcess.NatsProcess>() {}

/** Options for a test server; `syncAlways` defaults to false (tests do not need power-cut safety). */
export type TestServerOptions = Omit<NatsProcess.NatsProcessOptions, "storeDir" | "port">

/** A fresh random store key (test servers are encrypted at rest as deployed). */
const testStoreKey = () => Redacted.make(randomBytes(32).toString("hex"))

/** A temporary store folder, removed when the scope closes. */
const tempStore = Effect.acquireRelease(
  Effect.promise(() => mkdtemp(join(tmpdir(), "hangar-nats-test-"))),
  (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true })),
)

/** Starts a server on a free port with a temp store dir; both go away when the scope closes. */
export const scoped = (
  options: TestServerOptions = {},
): Effect.Effect<NatsProcess.NatsProcess, NatsProcess.NatsProcessError, Scope.Scope> =>
  Effect.gen(function* () {
    const storeDir = yield* tempStore
    return yield* NatsProcess.start({
      syncAlways: false,
      storeKey: testStoreKey(),
      ...options,
      storeDir,
      port: -1,
      removeOnCrash: [storeDir],
    })
  })

/** The server as a layer (dies if it cannot start: a test file without its server cannot run). */
export const layer: Layer.Layer<NatsServer> = Layer.scoped(NatsServer, scoped()).pipe(Layer.orDie)

/** A layer with options, e.g. `layerWith({ syncAlways: true })`. */
export const layerWith = (options: TestServerOptions): Layer.Layer<NatsServer> =>
  Layer.scoped(NatsServer, scoped(options)).pipe(Layer.orDie)

/**
 * A started server for plain vitest hooks; `stop()` is idempotent. `kill()` ends it outright
 * (SIGKILL, as a crash would) and `restart()` starts a new server on the same store, port and key
 * (clients reconnect to it); `pid` is the current server's.
 */
export interface StartedNatsServer extends NatsProcess.NatsProcess {
  readonly stop: () => Promise<void>
  readonly kill: () => Promise<void>
  readonly restart: () => Promise<void>
}

/** Starts a server for `beforeAll`; call `stop()` in `afterAll`. */
export const startNatsServer = async (options: TestServerOptions = {}): Promise<StartedNatsServer> => {
  const scope = Effect.runSync(Scope.make())
  const storeKey = options.storeKey ?? testStoreKey()
  const launch = (storeDir: string, port: number) =>
    NatsProcess.start({ syncAlways: false, ...options, storeKey, storeDir, port, removeOnCrash: [storeDir] })
  const exit = await Effect.runPromiseExit(
    Scope.extend(
      // A port outside the ephemeral range, so it is still free when a killed server restarts on it.
      Effect.flatMap(tempStore, (dir) =>
        Effect.flatMap(Effect.promise(freePort), (port) => launch(dir, port)),
      ),
      scope,
    ),
  )
  if (Exit.isFailure(exit)) {
    await Effect.runPromise(Scope.close(scope, exit))
    return Effect.runPromise(Effect.failCause(exit.cause))
  }
  const first = exit.value
  let current = first
  let stopped: Promise<void> | undefined
  const stop = () => {
    stopped ??= Effect.runPromise(Scope.close(scope, Exit.void))
    return stopped
  }
  const kill = async () => {
    process.kill(current.pid, "SIGKILL")
    const deadline = Date.now() + 10_000
    while (alive(current.pid)) {
      if (Date.now() > deadline) throw new Error(`nats-server ${current.pid} still runs 10 s after SIGKILL`)
      await new Promise((r) => setTimeout(r, 10))
    }
  }
  // Each life's release (stop, then its config folder) runs with the scope's, last life first.
  const restart = async () => {
    current = await Effect.runPromise(Scope.extend(launch(first.storeDir, first.port), scope))
  }
  return {
    url: first.url,
    port: first.port,
    storeDir: first.storeDir,
    get pid() {
      return current.pid
    },
    stop,
    kill,
    restart,
  }
}

/** Whether process `pid` runs (or is a zombie not yet reaped). */
export const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/** A connection to the file's server. */
export const layerNats: Layer.Layer<Nats.Nats, never, NatsServer> = Layer.unwrapEffect(
  Effect.map(NatsServer, (server) => Nats.layerUrl(server.url, "hangar-test")),
).pipe(Layer.orDie)

/** A server for the file plus a connection to it (provides both). */
export const layerWithNats: Layer.Layer<NatsServer | Nats.Nats> = layerNats.pipe(Layer.provideMerge(layer))

/** The whole storage map under a fresh unique prefix (many tests can share one server). */
export const layerStorage = (
  prefix: string = uniquePrefix(),
): Layer.Layer<Storage.Storage, never, Nats.Nats> => Storage.layerPrefix(prefix).pipe(Layer.orDie)

/** Server, connection and a uniquely prefixed storage: the usual environment of a test file. */
export const layerAll = (prefix?: string): Layer.Layer<NatsServer | Nats.Nats | Storage.Storage> =>
  layerStorage(prefix).pipe(Layer.provideMerge(layerWithNats))

/** Storage on a fresh nats-server plus `SealStream` with an in-memory master key. */
export const storageRuntime = () =>
  ManagedRuntime.make(
    Layer.merge(
      layerAll(),
      SealStream.layer.pipe(
        Layer.provide(Keyring.layer),
        Layer.provide(Layer.merge(MasterKey.layerMemory(), WrappedKeyStore.layerMemory)),
      ),
    ),
  )

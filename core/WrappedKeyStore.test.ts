// One contract suite run against the in-memory store and the KV store on a real nats-server.
import { randomBytes } from "node:crypto"
import { describe, expect, layer, type Vitest } from "@effect/vitest"
import { Kvm } from "@nats-io/kv"
import type { Scope } from "effect"
import { Context, Effect, Layer, Option } from "effect"
import * as NatsServer from "../test/harness/NatsServer.ts"
import { uniqueName } from "../test/harness/names.ts"
import * as Keyring from "./Keyring.ts"
import * as MasterKey from "./MasterKey.ts"
import * as Nats from "./Nats.ts"
import * as WrappedKeyStore from "./WrappedKeyStore.ts"

const ACC = "acc_0000000000000000000000000a"

// `open()` gives another handle on the same stored keys (for KV: another connection, as another
// process would have).
interface Backend {
  readonly open: () => Effect.Effect<
    WrappedKeyStore.WrappedKeyStoreService,
    unknown,
    Scope.Scope | NatsServer.NatsServer
  >
}

const memoryBackend: Effect.Effect<Backend> = Effect.sync(() => {
  const store = WrappedKeyStore.makeMemory()
  return { open: () => Effect.succeed(store) }
})

const connection = Effect.gen(function* () {
  const server = yield* NatsServer.NatsServer
  const context = yield* Layer.build(Nats.layerUrl(server.url))
  return Context.get(context, Nats.Nats)
})

const kvBackend: Effect.Effect<Backend, unknown, Scope.Scope | NatsServer.NatsServer> = Effect.gen(
  function* () {
    const bucket = uniqueName("secrets")
    const nats = yield* connection
    yield* Effect.promise(() => new Kvm(nats.js).create(bucket))
    return {
      open: () =>
        Effect.flatMap(connection, (conn) =>
          WrappedKeyStore.makeKv(bucket).pipe(Effect.provideService(Nats.Nats, conn)),
        ),
    }
  },
)

const contract = (
  name: string,
  it: Vitest.MethodsNonLive<NatsServer.NatsServer>,
  backend: Effect.Effect<Backend, unknown, Scope.Scope | NatsServer.NatsServer>,
) =>
  describe(name, () => {
    it.scoped("get of an absent key is none; create stores once and never overwrites", () =>
      Effect.gen(function* () {
        const store = yield* (yield* backend).open()
        expect(Option.isNone(yield* store.get(ACC))).toBe(true)
        const first = randomBytes(61)
        expect(yield* store.create(ACC, first)).toBe(true)
        expect(Buffer.from(Option.getOrThrow(yield* store.get(ACC))).equals(first)).toBe(true)
        expect(yield* store.create(ACC, randomBytes(61))).toBe(false)
        expect(Buffer.from(Option.getOrThrow(yield* store.get(ACC))).equals(first)).toBe(true)
      }),
    )

    it.scoped("concurrent creates through separate handles: exactly one wins and is what all read", () =>
      Effect.gen(function* () {
        const b = yield* backend
        const stores = yield* Effect.all(Array.from({ length: 6 }, () => b.open()))
        const values = stores.map(() => randomBytes(61))
        const wins = yield* Effect.all(
          stores.map((s, i) => s.create(ACC, values[i]!)),
          { concurrency: "unbounded" },
        )
        expect(wins.filter((w) => w)).toHaveLength(1)
        const winner = values[wins.indexOf(true)]!
        for (const s of stores)
          expect(Buffer.from(Option.getOrThrow(yield* s.get(ACC))).equals(winner)).toBe(true)
      }),
    )

    it.scoped("keyrings over separate handles, first use at once, end with one data key", () =>
      Effect.gen(function* () {
        const b = yield* backend
        const master = yield* MasterKey.MasterKey.pipe(Effect.provide(MasterKey.layerMemory()))
        const keyrings = yield* Effect.all(
          Array.from({ length: 6 }, () =>
            Effect.flatMap(b.open(), (store) =>
              Keyring.make.pipe(
                Effect.provideService(MasterKey.MasterKey, master),
                Effect.provideService(WrappedKeyStore.WrappedKeyStore, store),
              ),
            ),
          ),
        )
        const keys = yield* Effect.all(
          keyrings.map((k) => k.dataKey(ACC)),
          { concurrency: "unbounded" },
        )
        for (const k of keys) expect(k.equals(keys[0]!)).toBe(true)
      }),
    )
  })

layer(NatsServer.layer)("WrappedKeyStore", (it) => {
  contract("memory", it, memoryBackend)
  contract("kv", it, kvBackend)

  it.scoped("refuses an account id that is not a single KV key token", () =>
    Effect.gen(function* () {
      const store = yield* (yield* kvBackend).open()
      for (const bad of ["acc.x", "acc x", "acc*", ">", ""]) {
        expect((yield* Effect.flip(store.get(bad)))._tag).toBe("KeyStoreFailed")
        expect((yield* Effect.flip(store.create(bad, randomBytes(8))))._tag).toBe("KeyStoreFailed")
        // Not the bus's fault: a retry would fail the same way.
        expect(Nats.isNatsError(yield* Effect.flip(store.get(bad)))).toBe(false)
      }
    }),
  )

  it.scoped(
    "a store NATS does not answer fails with the reason, as the bus's failure (retried until taken)",
    () =>
      Effect.gen(function* () {
        const bucket = uniqueName("secrets")
        const conn = yield* connection
        yield* Effect.promise(() => new Kvm(conn.js).create(bucket))
        const store = yield* WrappedKeyStore.makeKv(bucket).pipe(Effect.provideService(Nats.Nats, conn))
        yield* Effect.promise(() => conn.connection.close())
        for (const error of [
          yield* Effect.flip(store.get(ACC)),
          yield* Effect.flip(store.create(ACC, randomBytes(8))),
        ]) {
          expect(error._tag).toBe("KeyStoreFailed")
          expect(error.message).toContain(bucket)
          expect(`${error}`).toContain(bucket)
          expect(Nats.isNatsError(error)).toBe(true)
        }
      }),
  )
})

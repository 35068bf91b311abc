import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Layer, Option } from "effect"
import * as Keyring from "./Keyring.ts"
import * as MasterKey from "./MasterKey.ts"
import * as WrappedKeyStore from "./WrappedKeyStore.ts"

const ACC = "acc_0000000000000000000000000a"
const OTHER = "acc_0000000000000000000000000b"

// A keyring built on given services: two of them over one store and one master key stand for two
// processes of one deployment.
const keyringOver = (master: MasterKey.MasterKeyService, store: WrappedKeyStore.WrappedKeyStoreService) =>
  Keyring.make.pipe(
    Effect.provideService(MasterKey.MasterKey, master),
    Effect.provideService(WrappedKeyStore.WrappedKeyStore, store),
  )

// A new random master key on each use.
const memoryMaster = Effect.suspend(() => MasterKey.MasterKey.pipe(Effect.provide(MasterKey.layerMemory())))

describe("Keyring", () => {
  it.effect("gives a 32-byte key, the same on every call and after a restart; accounts differ", () =>
    Effect.gen(function* () {
      const master = yield* memoryMaster
      const store = WrappedKeyStore.makeMemory()
      const keyring = yield* keyringOver(master, store)
      const a1 = yield* keyring.dataKey(ACC)
      const a2 = yield* keyring.dataKey(ACC)
      const b = yield* keyring.dataKey(OTHER)
      expect(a1.symmetricKeySize).toBe(32)
      expect(a1.equals(a2)).toBe(true)
      expect(a1.equals(b)).toBe(false)
      expect(String(a1)).not.toMatch(/[0-9a-f]{16}/)
      // A fresh keyring (empty cache) over the same store: the stored, wrapped key comes back.
      const restarted = yield* keyringOver(master, store)
      expect((yield* restarted.dataKey(ACC)).equals(a1)).toBe(true)
      // What is stored is wrapped, not the key.
      const stored = Option.getOrThrow(yield* store.get(ACC))
      expect(Buffer.from(stored).includes(a1.export())).toBe(false)
    }),
  )

  it.effect("concurrent first use from two keyrings ends with one key", () =>
    Effect.gen(function* () {
      const master = yield* memoryMaster
      const inner = WrappedKeyStore.makeMemory()
      // Hold both creators until both have read "absent", so both really race to create.
      const bothRead = yield* Deferred.make<void>()
      let reads = 0
      let creates = 0
      const wins: Array<boolean> = []
      const racing: WrappedKeyStore.WrappedKeyStoreService = {
        get: (account) =>
          inner.get(account).pipe(
            Effect.tap(() =>
              Effect.sync(() => {
                reads += 1
              }),
            ),
          ),
        create: (account, wrapped) =>
          Effect.gen(function* () {
            creates += 1
            if (creates === 2) yield* Deferred.succeed(bothRead, undefined)
            yield* Deferred.await(bothRead)
            const won = yield* inner.create(account, wrapped)
            wins.push(won)
            return won
          }),
      }
      const first = yield* keyringOver(master, racing)
      const second = yield* keyringOver(master, racing)
      const [k1, k2] = yield* Effect.all([first.dataKey(ACC), second.dataKey(ACC)], {
        concurrency: "unbounded",
      })
      expect(k1.equals(k2)).toBe(true)
      expect(wins.sort()).toEqual([false, true])
      expect(reads).toBe(3) // two first reads, one re-read by the loser
      // Both keep agreeing after the race, from their caches and from the store.
      expect((yield* first.dataKey(ACC)).equals(k2)).toBe(true)
      const third = yield* keyringOver(master, inner)
      expect((yield* third.dataKey(ACC)).equals(k1)).toBe(true)
    }),
  )

  it.effect("many concurrent first uses in one keyring agree", () =>
    Effect.gen(function* () {
      const keyring = yield* Keyring.Keyring.pipe(
        Effect.provide(
          Keyring.layer.pipe(
            Layer.provide(Layer.merge(MasterKey.layerMemory(), WrappedKeyStore.layerMemory)),
          ),
        ),
      )
      const keys = yield* Effect.all(
        Array.from({ length: 16 }, () => keyring.dataKey(ACC)),
        { concurrency: "unbounded" },
      )
      for (const k of keys) expect(k.equals(keys[0]!)).toBe(true)
    }),
  )

  it.effect(
    "a wrapped key moved to another account, or under another master key, fails with DecryptFailed",
    () =>
      Effect.gen(function* () {
        const master = yield* memoryMaster
        const store = WrappedKeyStore.makeMemory()
        const keyring = yield* keyringOver(master, store)
        yield* keyring.dataKey(ACC)
        const wrapped = Option.getOrThrow(yield* store.get(ACC))
        expect(yield* store.create(OTHER, wrapped)).toBe(true)
        const fresh = yield* keyringOver(master, store)
        expect((yield* Effect.flip(fresh.dataKey(OTHER)))._tag).toBe("DecryptFailed")
        const otherMaster = yield* keyringOver(yield* memoryMaster, store)
        expect((yield* Effect.flip(otherMaster.dataKey(ACC)))._tag).toBe("DecryptFailed")
      }),
  )
})

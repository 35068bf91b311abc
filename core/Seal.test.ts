import { randomBytes } from "node:crypto"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import * as Keyring from "./Keyring.ts"
import * as MasterKey from "./MasterKey.ts"
import { Seal, layer as sealLayer } from "./Seal.ts"
import * as WrappedKeyStore from "./WrappedKeyStore.ts"

const TestLayer = sealLayer.pipe(
  Layer.provide(Keyring.layer),
  Layer.provide(Layer.merge(MasterKey.layerMemory(), WrappedKeyStore.layerMemory)),
)

const ACC = "acc_0000000000000000000000000a"
const AAD = "secret:sec_0000000000000000000000000a"
const secret = Buffer.from("sk-live-very-secret-model-key")

describe("Seal", () => {
  it.effect("round-trips empty, small and large values; two seals of one value differ", () =>
    Effect.gen(function* () {
      const seal = yield* Seal
      for (const plain of [new Uint8Array(0), Uint8Array.of(7), secret, randomBytes(200_000)]) {
        const sealed = yield* seal.seal(ACC, AAD, plain)
        expect(sealed.byteLength).toBe(plain.byteLength + 29)
        expect(sealed[0]).toBe(1)
        expect(Buffer.from(yield* seal.open(ACC, AAD, sealed)).equals(plain)).toBe(true)
      }
      const a = yield* seal.seal(ACC, AAD, secret)
      const b = yield* seal.seal(ACC, AAD, secret)
      expect(Buffer.from(a).equals(b)).toBe(false)
      expect(Buffer.from(a).includes(secret)).toBe(false)
    }).pipe(Effect.provide(TestLayer)),
  )

  it.effect(
    "another account, another aad, any flipped bit, truncation, garbage and an unknown version fail",
    () =>
      Effect.gen(function* () {
        const seal = yield* Seal
        const sealed = yield* seal.seal(ACC, AAD, secret)
        const attempts = [
          seal.open("acc_0000000000000000000000000b", AAD, sealed),
          seal.open(ACC, "secret:sec_0000000000000000000000000b", sealed),
          seal.open(ACC, "model-key:sec_0000000000000000000000000a", sealed),
          seal.open(ACC, AAD, sealed.subarray(0, sealed.byteLength - 1)),
          seal.open(ACC, AAD, sealed.subarray(0, 28)),
          seal.open(ACC, AAD, new Uint8Array(0)),
          seal.open(ACC, AAD, randomBytes(64)),
        ]
        for (let bit = 0; bit < sealed.byteLength * 8; bit++) {
          const bad = Uint8Array.from(sealed)
          bad[bit >> 3]! ^= 1 << (bit & 7)
          attempts.push(seal.open(ACC, AAD, bad))
        }
        for (const attempt of attempts) {
          const error = yield* Effect.flip(attempt)
          expect(error._tag).toBe("DecryptFailed")
          expect(error.message).not.toContain("very-secret")
        }
        const unknownVersion = Uint8Array.from(sealed)
        unknownVersion[0] = 2
        const error = yield* Effect.flip(seal.open(ACC, AAD, unknownVersion))
        expect(error._tag === "DecryptFailed" && error.reason).toBe("unknown version 2")
      }).pipe(Effect.provide(TestLayer)),
  )

  it.effect("a value sealed for one account with the same aad does not open as another's", () =>
    Effect.gen(function* () {
      const seal = yield* Seal
      const forB = yield* seal.seal("acc_0000000000000000000000000b", AAD, secret)
      expect((yield* Effect.flip(seal.open(ACC, AAD, forB)))._tag).toBe("DecryptFailed")
    }).pipe(Effect.provide(TestLayer)),
  )
})

/**
 * The persisted conversation on a real nats-server: items round-trip sealed, a large item (a
 * screenshot) is cut into parts that each fit a NATS message, the stored bytes are not readable,
 * another account cannot open them, and a run's conversation is removed whole.
 */
import { randomBytes } from "node:crypto"
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import * as Keyring from "../../core/Keyring.ts"
import * as MasterKey from "../../core/MasterKey.ts"
import { Seal, layer as sealLayer } from "../../core/Seal.ts"
import { Storage } from "../../core/Storage.ts"
import type { Item } from "../../core/vendors/Chat.ts"
import * as WrappedKeyStore from "../../core/WrappedKeyStore.ts"
import type { AccountId } from "../../schema/Ids.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { layerAll } from "../../test/harness/NatsServer.ts"
import * as Store from "./Store.ts"

const ACC = "acc_0000000000000000000000000a" as AccountId
const SealLayer = sealLayer.pipe(
  Layer.provide(Keyring.layer),
  Layer.provide(Layer.merge(MasterKey.layerMemory(), WrappedKeyStore.layerMemory)),
)
let serial = 0
const runId = () => `run_00000000000000000000000${(serial++).toString().padStart(3, "0")}`

layer(Layer.merge(layerAll(), SealLayer))("agent Store", (it) => {
  it.effect("items round-trip sealed; a 1.5 MB image item takes several parts; removal leaves nothing", () =>
    Effect.gen(function* () {
      const { names } = yield* Storage
      const seal = yield* Seal
      const views = yield* Store.open(names.kv.agents.name)
      const run = runId()
      const prompt: Item = { role: "user", content: [{ type: "text", text: "the secret prompt" }] }
      const image = randomBytes(1_100_000).toString("base64")
      const shot: Item = {
        role: "tool",
        call_id: "c1",
        name: "screenshot",
        content: [{ type: "image", media_type: "image/png", data: image }],
        is_error: false,
      }
      const assistant: Item = {
        role: "assistant",
        text: "ok",
        tool_calls: [{ id: "c1", name: "screenshot", arguments: {} }],
        vendor: { provider: "openai", data: { reasoning: ["opaque"] } },
      }
      expect(yield* Store.writeItem(views, seal, ACC, run, 0, prompt)).toBe(1)
      expect(yield* Store.writeItem(views, seal, ACC, run, 1, assistant)).toBe(1)
      const parts = yield* Store.writeItem(views, seal, ACC, run, 2, shot)
      expect(parts).toBeGreaterThan(2)
      expect(yield* Store.readItem(views, seal, ACC, run, 0, 1)).toEqual(prompt)
      expect(yield* Store.readItem(views, seal, ACC, run, 1, 1)).toEqual(assistant)
      expect(yield* Store.readItem(views, seal, ACC, run, 2, parts)).toEqual(shot)

      // Sealed: the stored bytes do not show the prompt, and another account cannot open them.
      const stored = Option.getOrThrow(yield* views.parts.get(kvKeys.agentItem(run, 0, 0))).value.data
      expect(Buffer.from(stored).includes(Buffer.from("the secret prompt"))).toBe(false)
      const other = yield* Effect.flip(
        Store.readItem(views, seal, "acc_0000000000000000000000000b", run, 0, 1),
      )
      expect(other._tag).toBe("DecryptFailed")
      // An item read at another index does not open either (the index is bound to the seal).
      yield* views.parts.put(kvKeys.agentItem(run, 5, 0), { data: stored })
      expect((yield* Effect.flip(Store.readItem(views, seal, ACC, run, 5, 1)))._tag).toBe("DecryptFailed")

      yield* views.heads.put(kvKeys.agentHead(run), {
        account: ACC,
        count: 3,
        base: 0,
        parts: [1, 1, parts],
        turn: 1,
        usage: Store.emptyUsage,
        context_tokens: 0,
        reminded: false,
        done: false,
      })
      yield* Store.removeConversation(views, run)
      expect(yield* views.parts.keys(kvKeys.agentItemsOf(run))).toEqual([])
      expect(Option.isNone(yield* views.heads.get(kvKeys.agentHead(run)))).toBe(true)
    }),
  )
})

describe("agent Store parts", () => {
  it("a part stays under a NATS message as base64 JSON", () => {
    expect(Math.ceil((Store.partBytes * 4) / 3) + 64).toBeLessThan(1024 * 1024)
  })
})

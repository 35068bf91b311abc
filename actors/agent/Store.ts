/**
 * What the agent loops keep in KV `agents` (keys in `schema/Subjects.ts`):
 *
 * | key                  | value        | written by                                               |
 * |----------------------|--------------|----------------------------------------------------------|
 * | `r.<run>`            | `AgentRun`   | the run actor: created at `Ready` (a run with a provider), deleted when the run ends |
 * | `l.<run>`            | `AgentLease` | the worker running the loop: claimed and renewed by compare-and-set |
 * | `c.<run>`            | `Head`       | the loop, by compare-and-set on the revision it last wrote (its fence) |
 * | `i.<run>.<n>.<part>` | `ItemPart`   | the loop: item `n` of the conversation, sealed, in parts |
 *
 * The conversation is append-only: item `n` is written once (its parts first, then the head that
 * counts it), so a turn costs one item write and one head write however long the conversation
 * is. An item is sealed for the run's account with associated data `agent:<run>:<n>` (it holds the
 * prompt and tool outputs) and cut into parts of at most `partBytes`, because a screenshot can be
 * larger than a NATS message. Compaction moves `base` past the items it replaces.
 */
import { Effect, Option, Schema } from "effect"
import type { KeyringError } from "../../core/Keyring.ts"
import * as Kv from "../../core/Kv.ts"
import type { NatsError } from "../../core/Nats.ts"
import type { DecryptFailed, SealService } from "../../core/Seal.ts"
import { Item } from "../../core/vendors/Chat.ts"
import { Count } from "../../schema/Common.ts"
import { AccountId, RunId } from "../../schema/Ids.ts"
import { emptyModelUsage, RunUsage } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"

/** A run whose agent should be working. */
export const AgentRun = Schema.Struct({ run: RunId, account: AccountId })
export type AgentRun = typeof AgentRun.Type

/** Who runs a loop, until when (the owner's clock plus the lease time). */
export const AgentLease = Schema.Struct({ owner: Schema.String, expiresAt: Schema.Number })
export type AgentLease = typeof AgentLease.Type

/** Model usage so far. */
export const ModelUsage = RunUsage.fields.model
export type ModelUsage = typeof ModelUsage.Type

/** The head of a conversation: how many items, where it starts, and the loop's bookkeeping. */
export const Head = Schema.Struct({
  account: AccountId,
  /** Items `0 … count − 1` exist. */
  count: Count,
  /** The first item sent to the model (a compaction item after compaction). */
  base: Count,
  /** Parts of each item from `base` on (index `n − base`). */
  parts: Schema.Array(Count),
  /** Model replies so far (numbers the tool calls' commands). */
  turn: Count,
  usage: ModelUsage,
  /** The conversation's size after the last reply as the vendor counted it. */
  context_tokens: Count,
  /** The loop reminded the model once to call `submit_result`. */
  reminded: Schema.Boolean,
  /** The loop has nothing more to do (the run was ended or is ending). */
  done: Schema.Boolean,
})
export type Head = typeof Head.Type

/** One part of a sealed item. */
export const ItemPart = Schema.Struct({ data: Schema.Uint8ArrayFromBase64 })

/** Largest part of a sealed item (as base64 in JSON it stays well under a 1 MiB NATS message). */
export const partBytes = 512 * 1024

export const emptyUsage: ModelUsage = emptyModelUsage

const aadOf = (run: string, n: number) => `agent:${run}:${n}`
const encoder = new TextEncoder()
const decoder = new TextDecoder()
const encodeItem = Schema.encodeSync(Item)
const decodeItem = Schema.decodeUnknown(Item)

/** Errors of the store. */
export type StoreError = NatsError | Kv.KvValueInvalid | KeyringError | DecryptFailed

/** The typed views of the bucket. */
export const open = (bucket: string) =>
  Effect.all({
    runs: Kv.make(bucket, AgentRun),
    leases: Kv.make(bucket, AgentLease),
    heads: Kv.make(bucket, Head),
    parts: Kv.make(bucket, ItemPart),
  })
export type Views = Effect.Effect.Success<ReturnType<typeof open>>

/** Seals item `n` and writes its parts (idempotent: a rewrite replaces the same keys); answers the part count. */
export const writeItem = (
  views: Views,
  seal: SealService,
  account: string,
  run: string,
  n: number,
  item: Item,
) =>
  Effect.gen(function* () {
    const plain = encoder.encode(JSON.stringify(encodeItem(item)))
    const sealed = yield* seal.seal(account, aadOf(run, n), plain)
    const count = Math.max(1, Math.ceil(sealed.byteLength / partBytes))
    yield* Effect.forEach(
      Array.from({ length: count }, (_, i) => i),
      (i) =>
        views.parts.put(kvKeys.agentItem(run, n, i), {
          data: sealed.subarray(i * partBytes, (i + 1) * partBytes),
        }),
      { concurrency: 4, discard: true },
    )
    return count
  })

/** Reads and opens item `n` written in `parts` parts. */
export const readItem = (
  views: Views,
  seal: SealService,
  account: string,
  run: string,
  n: number,
  parts: number,
) =>
  Effect.gen(function* () {
    const chunks = yield* Effect.forEach(
      Array.from({ length: parts }, (_, i) => i),
      (i) =>
        Effect.flatMap(views.parts.get(kvKeys.agentItem(run, n, i)), (found) =>
          Option.isSome(found)
            ? Effect.succeed(found.value.value.data)
            : Effect.dieMessage(`agent item ${run}.${n}.${i} is missing`),
        ),
      { concurrency: 4 },
    )
    const sealed = new Uint8Array(chunks.reduce((sum, c) => sum + c.byteLength, 0))
    let at = 0
    for (const c of chunks) {
      sealed.set(c, at)
      at += c.byteLength
    }
    const plain = yield* seal.open(account, aadOf(run, n), sealed)
    return yield* decodeItem(JSON.parse(decoder.decode(plain))).pipe(Effect.orDie)
  })

/** Removes everything the bucket holds for `run` but its `r.` record (best effort by the caller). */
export const removeConversation = (views: Views, run: string) =>
  Effect.gen(function* () {
    const keys = yield* views.parts.keys(kvKeys.agentItemsOf(run))
    yield* Effect.forEach(keys, (k) => views.parts.delete(k), { concurrency: 8, discard: true })
    yield* views.heads.delete(kvKeys.agentHead(run))
  })

/**
 * Upload records (`POST /v1/files`): what was announced (size, SHA-256), for which account, and
 * whether the file has arrived. The gateway writes them; the `put` command and run start read
 * them before opening the object in the `files` store, whose name and sealed object id are the
 * upload id (`file_<id>`).
 *
 * KV bucket `uploads`, key `<file_id>`, kept 30 days after the last write like the objects.
 * `pending` → `complete` is the only transition, written compare-and-set once the object is
 * stored whole with the announced size and hash; an upload that failed or was cut off leaves the
 * record `pending` and no object.
 */
import { Context, Effect, Layer, Option, Schema } from "effect"
import { Sha256Hex, Timestamp } from "../schema/Common.ts"
import { AccountId, UploadId } from "../schema/Ids.ts"
import * as Kv from "./Kv.ts"
import type { Nats, NatsError } from "./Nats.ts"
import { Storage } from "./Storage.ts"

/** Whether the file has been stored (`complete`) or not yet (`pending`). */
export const UploadState = Schema.Literal("pending", "complete")
export type UploadState = typeof UploadState.Type

/** One upload as stored; `expires_at` is when its `PUT` link stops working. */
export const UploadRecord = Schema.Struct({
  id: UploadId,
  account: AccountId,
  bytes: Schema.Number,
  sha256: Sha256Hex,
  state: UploadState,
  created_at: Timestamp,
  expires_at: Timestamp,
})
export type UploadRecord = typeof UploadRecord.Type

/** A read or write of the `uploads` bucket failed (bus down, bad record). */
export type UploadsError = NatsError | Kv.KvValueInvalid

/** The upload store. */
export interface UploadsService {
  /** Stores a new `pending` record; its id is fresh, so an existing key is a programming error. */
  readonly create: (record: UploadRecord) => Effect.Effect<void, UploadsError | Kv.StateConflict>
  /** The record with its revision, or none. */
  readonly get: (id: string) => Effect.Effect<Option.Option<Kv.KvEntry<UploadRecord>>, UploadsError>
  /**
   * The record if it exists, belongs to `account` and is `complete`: what a reader of an upload
   * (the `put` command, run start) accepts. Another account's upload reads as absent.
   */
  readonly completed: (
    account: string,
    id: string,
  ) => Effect.Effect<Option.Option<UploadRecord>, UploadsError>
  /**
   * Marks the record `complete` if it is still at `revision`; `false` when another writer changed
   * it first (another `PUT` of the same upload finished before).
   */
  readonly complete: (record: UploadRecord, revision: number) => Effect.Effect<boolean, UploadsError>
}

/** The upload store as a service. */
export class Uploads extends Context.Tag("hangar/Uploads")<Uploads, UploadsService>() {}

const isUploadId = Schema.is(UploadId)

/** Builds the store over the storage's `uploads` bucket. */
export const make: Effect.Effect<UploadsService, NatsError, Nats | Storage> = Effect.gen(function* () {
  const { names } = yield* Storage
  const kv = yield* Kv.make(names.kv.uploads.name, UploadRecord)

  // A malformed id is never a KV key: it reads as absent instead of failing the subject check.
  const get: UploadsService["get"] = (id) => (isUploadId(id) ? kv.get(id) : Effect.succeedNone)

  return {
    create: (record) => Effect.asVoid(kv.create(record.id, record)),
    get,
    completed: (account, id) =>
      Effect.map(
        get(id),
        Option.flatMap((e) =>
          e.value.account === account && e.value.state === "complete" ? Option.some(e.value) : Option.none(),
        ),
      ),
    complete: (record, revision) =>
      kv.update(record.id, { ...record, state: "complete" }, revision).pipe(
        Effect.as(true),
        Effect.catchTag("StateConflict", () => Effect.succeed(false)),
      ),
  }
})

/** The store as a layer (needs NATS and the storage map). */
export const layer: Layer.Layer<Uploads, NatsError, Nats | Storage> = Layer.effect(Uploads, make)

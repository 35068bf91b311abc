/** Uploads (spec "Upload", `POST /v1/files`): ask for a signed link, then `PUT` the file to it. */
import { Schema } from "effect"
import { IntBetween, Sha256Hex } from "./Common.ts"
import { UploadId } from "./Ids.ts"
import { uploadMaxBytes } from "./Limits.ts"

/** `POST /v1/files`: the exact size (0 to 5 GB) and SHA-256 of the file to come. */
export const UploadRequest = Schema.Struct({
  bytes: IntBetween(0, uploadMaxBytes),
  sha256: Sha256Hex,
}).annotations({ identifier: "UploadRequest" })
export type UploadRequest = typeof UploadRequest.Type

/** Where and how to send the file: `method` to `url` with exactly `headers`. */
export const UploadResponse = Schema.Struct({
  id: UploadId,
  url: Schema.String,
  method: Schema.Literal("PUT"),
  headers: Schema.Record({ key: Schema.String, value: Schema.String }),
}).annotations({ identifier: "UploadResponse" })
export type UploadResponse = typeof UploadResponse.Type

/** Machine bases (spec "Bases listing item", `GET /v1/bases`). */
import { Schema } from "effect"
import { Count, Sha256Hex } from "./Common.ts"
import { BaseName } from "./Ids.ts"

/** A base: its name (never reused), the SHA-256 and size of its image. */
export const BaseInfo = Schema.Struct({ name: BaseName, sha256: Sha256Hex, bytes: Count }).annotations({
  identifier: "BaseInfo",
})
export type BaseInfo = typeof BaseInfo.Type

/** `GET /v1/bases`. */
export const BaseList = Schema.Struct({ bases: Schema.Array(BaseInfo) }).annotations({
  identifier: "BaseList",
})
export type BaseList = typeof BaseList.Type

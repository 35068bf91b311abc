/**
 * The bases listing: what a host puts in its record (the finished bases on its disk) and what
 * `GET /v1/bases` returns (the union over live hosts, newest first; `listBases` in `schema/Host.ts`
 * so the gateway can use it without importing the host agent).
 */
import { Effect, Schema } from "effect"
import { BaseInfo } from "../../schema/Base.ts"
import * as Bases from "./Bases.ts"

export { listBases } from "../../schema/Host.ts"

const isBaseInfo = Schema.is(BaseInfo)

/**
 * The listing items of the finished bases in `dir`. A base whose `base.json` does not make a valid
 * item (say a hand-made folder with another name) is left out with a warning rather than refused
 * by every reader of the host record.
 */
export const onDisk = (dir: string): Effect.Effect<ReadonlyArray<BaseInfo>> =>
  Effect.gen(function* () {
    const items: Array<BaseInfo> = []
    for (const { name, sha256, bytes } of yield* Bases.list(dir)) {
      const item = { name, sha256, bytes }
      if (isBaseInfo(item)) items.push(item)
      else
        yield* Effect.logWarning("base left out of the listing: invalid name or digest").pipe(
          Effect.annotateLogs({ base: name, dir }),
        )
    }
    return items
  })

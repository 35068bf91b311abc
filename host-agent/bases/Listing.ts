/**
 * The bases listing: what a host puts in its record (the finished bases on its disk) and what
 * `GET /v1/bases` returns (the union over live hosts, newest first; `listBases` in `schema/Host.ts`
 * so the gateway can use it without importing the host agent).
 */
import { Effect, Schema } from "effect"
import { BaseInfo } from "../../schema/Base.ts"
import { BaseName } from "../../schema/Ids.ts"
import * as Bases from "./Bases.ts"

export { listBases } from "../../schema/Host.ts"

const isBaseInfo = Schema.is(BaseInfo)

/**
 * The listing items of the finished bases in `dir` built from one of `recipes` (the ones this host
 * offers; others, such as the slim test base in a shared cache, are not listed). A base whose
 * `base.json` does not make a valid item (say a hand-made folder with another name) is left out
 * with a warning rather than refused by every reader of the host record.
 */
export const onDisk = (dir: string, recipes: ReadonlyArray<string>): Effect.Effect<ReadonlyArray<BaseInfo>> =>
  Effect.gen(function* () {
    const items: Array<BaseInfo> = []
    const offered = yield* Bases.served(recipes)
    for (const base of yield* Bases.list(dir)) {
      if (!offered(base)) continue
      const { name, sha256, bytes } = base
      const item = { name, sha256, bytes }
      if (isBaseInfo(item)) items.push(item)
      else
        yield* Effect.logWarning("base left out of the listing: invalid name or digest").pipe(
          Effect.annotateLogs({ base: name, dir }),
        )
    }
    return items
  })

const isBaseName = Schema.is(BaseName)

/** The names of the bases of `recipes` being built in `dir` now (by this host or another process). */
export const buildingIn = (
  dir: string,
  recipes: ReadonlyArray<string>,
): Effect.Effect<ReadonlyArray<BaseName>> =>
  Effect.map(Bases.building(dir), (builds) =>
    builds.flatMap((b) => (recipes.includes(b.recipe) && isBaseName(b.name) ? [b.name] : [])),
  )

/**
 * `GET /v1/bases` and the newest-base default of publishing: the bases on the disks of live hosts,
 * read from their records in KV `hosts` (`listBases` of `schema/Host.ts`: one item per name,
 * newest first). A record that does not decode is left out with a warning rather than hiding every
 * other host's bases.
 */
import { Clock, Context, Effect, Layer, Option } from "effect"
import * as Kv from "../../core/Kv.ts"
import type { Nats, NatsError } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import type { BaseInfo } from "../../schema/Base.ts"
import { BaseList } from "../../schema/Base.ts"
import { ApiError } from "../../schema/Errors.ts"
import { buildingBases, HostRecord, isLive, listBases } from "../../schema/Host.ts"
import type { BaseName } from "../../schema/Ids.ts"
import { authRoute } from "../auth/Route.ts"
import { documented } from "../openapi/OpenApi.ts"
import { json } from "../Response.ts"

/** The bases listing as a service. */
export class BaseListing extends Context.Tag("gateway/BaseListing")<
  BaseListing,
  {
    /** The bases of the live hosts, newest first. */
    readonly list: Effect.Effect<ReadonlyArray<BaseInfo>, ApiError>
    /** The bases live hosts are building and none has yet, newest first (not in `list`). */
    readonly building: Effect.Effect<ReadonlyArray<BaseName>, ApiError>
  }
>() {}

/** Builds the listing over the storage map's `hosts` bucket. */
export const make: Effect.Effect<Context.Tag.Service<BaseListing>, NatsError, Nats | Storage> = Effect.gen(
  function* () {
    const { names } = yield* Storage
    const hosts = yield* Kv.make(names.kv.hosts.name, HostRecord)
    const live = Effect.gen(function* () {
      const keys = yield* hosts.keys()
      const records = yield* Effect.forEach(
        keys,
        (key) =>
          hosts
            .get(key)
            .pipe(
              Effect.catchTag("KvValueInvalid", (e) =>
                Effect.as(
                  Effect.logWarning("host record left out of the bases listing").pipe(
                    Effect.annotateLogs({ host: key, reason: e.message }),
                  ),
                  Option.none(),
                ),
              ),
            ),
        { concurrency: 16 },
      )
      const now = yield* Clock.currentTimeMillis
      return records.flatMap((o) => (Option.isSome(o) && isLive(o.value.value, now) ? [o.value.value] : []))
    }).pipe(
      Effect.catchTag("NatsError", (e) =>
        Effect.zipRight(Effect.logError("bases listing failed", e), Effect.fail(ApiError.internal())),
      ),
    )
    return { list: Effect.map(live, listBases), building: Effect.map(live, buildingBases) }
  },
)

/** The listing as a layer. */
export const layer: Layer.Layer<BaseListing, NatsError, Nats | Storage> = Layer.effect(BaseListing, make)

/** `GET /v1/bases`. */
export const routes = [
  documented(
    authRoute({
      method: "GET",
      path: "/v1/bases",
      access: "member",
      handler: () =>
        Effect.map(
          Effect.flatMap(BaseListing, (b) => b.list),
          (bases) => json({ bases }),
        ),
    }),
    { summary: "The bases functions may use, newest first.", response: { status: 200, schema: BaseList } },
  ),
]

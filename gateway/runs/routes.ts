/**
 * The runs route group: `POST /v1/functions/{id}/runs` (`Start.ts`), `GET /v1/runs`,
 * `GET /v1/runs/{id}`, `GET /v1/runs/{id}/log`. Reads come from KV `runs` (the run actor's
 * projection); links in answers (`output.url`, log parts) are signed on each read and last 15
 * minutes. A run key reads only runs of the functions it may start, and must name `function` when
 * listing (400 naming `function`; a function outside its list is 403 `key_scope`).
 *
 * Decision (the spec is silent): an ended run's log is answered whole. Its last part (the machine's
 * `end` line) is stored as the machine goes, just after the run is seen ended; the log route waits
 * for it, up to `logWaitMs` after the end (a host that died never writes it; later reads answer at
 * once with what there is).
 */
import { Clock, Effect, Layer, Option } from "effect"
import { mailboxLayer } from "../../core/actors/AccountClient.ts"
import { Links } from "../../core/Links.ts"
import { decodeBody } from "../../schema/Decode.ts"
import { ApiError } from "../../schema/Errors.ts"
import { endedRunStates, ListRunsQuery, Run, RunList, RunLog, type StoredRun } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { authRoute } from "../auth/Route.ts"
import { documented } from "../openapi/OpenApi.ts"
import { json } from "../Response.ts"
import {
  isRunKey,
  linkBase,
  listRuns,
  mayUse,
  orInternal,
  RunRouteSettings,
  RunStore,
  readRun,
  showRun,
  storeLayer,
} from "./Runs.ts"
import { startRoute } from "./Start.ts"

const decodeQuery = decodeBody(ListRunsQuery)

/** The group's routes. */
export const routes = [
  startRoute,
  documented(
    authRoute({
      method: "GET",
      path: "/v1/runs",
      access: "member",
      handler: ({ principal, query, headers }) =>
        Effect.gen(function* () {
          const settings = yield* RunRouteSettings.Tag
          const q = yield* decodeQuery(query)
          if (isRunKey(principal)) {
            if (q.function === undefined) {
              return yield* Effect.fail(ApiError.invalidRequest("function: is required with a run-scope key"))
            }
            if (!mayUse(principal, q.function)) return yield* Effect.fail(ApiError.keyScope())
          }
          const page = yield* listRuns(principal, q, settings.pageSize)
          const base = yield* linkBase(headers)
          const runs = yield* Effect.forEach(page.runs, (r) => showRun(r, base))
          return json(page.next === undefined ? { runs } : { runs, next: page.next })
        }),
    }),
    {
      summary: "The account's runs, newest first, 50 a page; pass `next` as `before` for the next page.",
      response: { status: 200, schema: RunList },
    },
  ),
  documented(
    authRoute({
      method: "GET",
      path: "/v1/runs/:id",
      access: "member",
      handler: ({ principal, params, headers }) =>
        Effect.gen(function* () {
          const run = yield* readRun(principal, params.id)
          return json(yield* showRun(run, yield* linkBase(headers)))
        }),
    }),
    { summary: "A run; `output.url` is signed afresh on each read.", response: { status: 200, schema: Run } },
  ),
  documented(
    authRoute({
      method: "GET",
      path: "/v1/runs/:id/log",
      access: "member",
      handler: ({ principal, params, headers }) =>
        Effect.gen(function* () {
          const run = yield* wholeLog(yield* readRun(principal, params.id))
          const links = yield* Links
          const base = yield* linkBase(headers)
          const parts = Array.from({ length: run.log_parts }, (_, i) =>
            links.download({
              store: "logs",
              object: kvKeys.logPart(run.id, i + 1),
              account: run.account,
              filename: `${run.id}.${i + 1}.ndjson`,
              base,
            }),
          )
          return json({ parts })
        }),
    }),
    {
      summary:
        "Links to the run's log parts (JSON lines), in order; a run that just ended is answered once its last part is stored (at most 15 s after its end).",
      response: { status: 200, schema: RunLog },
    },
  ),
]

/**
 * `run` once its log is whole, if a host took it and it ended within `logWaitMs` (at most that long
 * after its end).
 */
const wholeLog = (run: StoredRun) =>
  Effect.gen(function* () {
    // A run no host took (it ended queued) has no machine to write a log.
    if (
      !endedRunStates.has(run.state) ||
      run.log_complete === true ||
      run.host === undefined ||
      run.ended_at === undefined
    )
      return run
    const { logWaitMs } = yield* RunRouteSettings.Tag
    const left = Date.parse(run.ended_at) + logWaitMs - (yield* Clock.currentTimeMillis)
    if (!(left > 0)) return run
    const store = yield* RunStore
    const whole = yield* orInternal(
      store.awaitValueUpTo(kvKeys.run(run.account, run.id), (r) => r.log_complete === true, left),
      "run read",
    )
    return Option.getOrElse(whole, () => run)
  })

/**
 * The group's services (the run store, a mailbox client), given NATS and the storage map. The
 * routes also use `Functions`, `Providers` (definitions group), `Uploads` (uploads group), `Links`
 * and `LinkSettings` (gateway main) and `RunRouteSettings`.
 */
export const layer = Layer.mergeAll(storeLayer, mailboxLayer)

/** The group's services with their settings from `HANGAR_*` variables. */
export const layerFromEnv = Layer.merge(layer, RunRouteSettings.layerFromEnv)

/**
 * What the run routes share: the read side of KV `runs` (written only by the run actor, key
 * `<account>.<run>`), who may see which run, the API view of a stored run (links signed afresh on
 * every read), the listing, and the routes' settings.
 *
 * Listing (`GET /v1/runs`): run ids are time-ordered (`core/Ids.ts`), so "newest first" is the key
 * order reversed. The route lists the account's keys (`<account>.*`), keeps those older than
 * `before`, and reads values newest first in batches until it has a page (50) plus one more match
 * (which says a `next` page exists; `next` is the last run of the page). Filters (`function`,
 * `state`, a run key's functions) are applied to the values. Cost: one key listing of the
 * account's runs of the last 30 days (retention) and, per page, the values read until it is full;
 * an index per function would be the next step if accounts keep very many runs.
 *
 * A function's last run (`GET /v1/functions`): the run actor keeps `<account>.last.<function>`
 * pointing at the function's newest run (`LastRun`), so the listing reads two keys per function.
 */
import { Context, Effect, Layer, Option, Schema } from "effect"
import { defineSettings, env } from "../../core/Config.ts"
import * as Kv from "../../core/Kv.ts"
import { LinkSettings, Links } from "../../core/Links.ts"
import type { Nats } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import { ApiError } from "../../schema/Errors.ts"
import { RunId } from "../../schema/Ids.ts"
import {
  apiRun,
  endedRunStates,
  LastRun,
  type Run,
  type RunStateFilter,
  StoredRun,
} from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import type { AccountKey, AccountPerson } from "../auth/Access.ts"
import { orInternal, publicBase } from "../uploads/Create.ts"

export { orInternal }

/**
 * Run route settings: `askTimeoutMs` (`HANGAR_RUN_ASK_TIMEOUT_MS`), how long a start waits for the
 * account actor (`MayStart`) and then the run actor (`Create`) to answer; `pageSize`: runs per page
 * of `GET /v1/runs` (the contract's 50; tests may lower it); `logWaitMs`
 * (`HANGAR_RUN_LOG_WAIT_MS`): how long after a run's end `GET /v1/runs/{id}/log` waits for its last
 * part (written as the machine goes: at most the host's end grace, 10 s, and a store write).
 */
export const RunRouteSettings = defineSettings(
  "gateway/RunRouteSettings",
  { askTimeoutMs: 10_000, pageSize: 50, logWaitMs: 15_000 },
  (d) => ({
    askTimeoutMs: env.integer("RUN_ASK_TIMEOUT_MS", d.askTimeoutMs),
    logWaitMs: env.integer("RUN_LOG_WAIT_MS", d.logWaitMs),
  }),
)

/** The `runs` bucket, read side. */
export class RunStore extends Context.Tag("gateway/runs/RunStore")<RunStore, Kv.Kv<StoredRun>>() {}

/** Opens the typed view of the storage's `runs` bucket. */
export const storeLayer: Layer.Layer<RunStore, unknown, Nats | Storage> = Layer.effect(
  RunStore,
  Effect.flatMap(Storage, ({ names }) => Kv.make(names.kv.runs.name, StoredRun)),
)

/** The newest run of each of `functions` the account has (absent: none kept), as the API shows it. */
export const lastRuns = (account: string, functions: ReadonlyArray<string>, base: string) =>
  Effect.gen(function* () {
    const runs = yield* RunStore
    const { names } = yield* Storage
    const pointers = yield* Kv.make(names.kv.runs.name, LastRun)
    const found = yield* Effect.forEach(
      functions,
      (fn) =>
        Effect.gen(function* () {
          const pointer = yield* pointers.get(kvKeys.lastRun(account, fn))
          if (Option.isNone(pointer)) return undefined
          const run = yield* runs.get(kvKeys.run(account, pointer.value.value.run))
          return Option.isNone(run) ? undefined : yield* showRun(run.value.value, base)
        }),
      { concurrency: 16 },
    )
    return new Map(functions.flatMap((fn, i) => (found[i] === undefined ? [] : [[fn, found[i]] as const])))
  })

/** Whoever calls a run route. */
export type Member = AccountPerson | AccountKey

/** Whether the caller may start, read and command runs of function `fn` (run keys: their list, `*` = all). */
export const mayUse = (principal: Member, fn: string): boolean =>
  principal._tag !== "AccountKey" ||
  principal.key.scope === "admin" ||
  principal.key.functions.some((f) => f === "*" || f === fn)

/** Whether the caller is a run-scope key. */
export const isRunKey = (principal: Member): boolean =>
  principal._tag === "AccountKey" && principal.key.scope === "run"

/** The base of links handed to this request's caller (`HANGAR_PUBLIC_URL`, else its `Host`). */
export const linkBase = (headers: Readonly<Record<string, string | undefined>>) =>
  Effect.map(LinkSettings.Tag, (s) => publicBase(s.publicUrl, headers.host))

/** The run as the API shows it, `output.url` a fresh link (valid `linkValidMs`). */
export const showRun = (stored: StoredRun, base: string) =>
  Effect.map(Links, (links): Run => {
    if (stored.output === undefined) return apiRun(stored, "")
    const url = links.download({
      store: "outputs",
      object: stored.output.object,
      account: stored.account,
      filename: `${stored.id}.tar.gz`,
      base,
    })
    return apiRun(stored, url)
  })

/**
 * The caller's run `id`: 404 when absent or another account's (the key names the account, so
 * another account's run is never even read), 403 `key_scope` when a run key may not use its function.
 */
export const readRun = (principal: Member, id: string) =>
  Effect.gen(function* () {
    // An id that is not a run id (it may hold `.` or `*`) cannot become a KV key: no such run.
    if (!isRunId(id)) return yield* Effect.fail(ApiError.notFound("run"))
    const store = yield* RunStore
    const found = yield* orInternal(store.get(kvKeys.run(principal.account.id, id)), "run read")
    if (Option.isNone(found)) return yield* Effect.fail(ApiError.notFound("run"))
    const run = found.value.value
    if (!mayUse(principal, run.function)) return yield* Effect.fail(ApiError.keyScope())
    return run
  })

const isRunId = Schema.is(RunId)

/**
 * What the command routes need of a run, none of which changes once the run exists: its id, its
 * account, its function, and whether it had ended when read (an ended run stays ended).
 */
export interface RunIdentity {
  readonly id: string
  readonly account: string
  readonly function: string
  readonly ended: boolean
}

// Each command route used to read the run's record; a caller driving a run sends a command and
// waits for it, two reads per command for facts that never change. So the gateway keeps what it
// read for a minute (entries per `runs` view, the oldest dropped beyond `IDENTITY_MAX`). A kept
// run that has since ended or been removed (retention) is answered by what comes next: the run
// actor refuses a command with `ended`/`unknown`, and a removed run's command records are gone too.
const IDENTITY_TTL_MS = 60_000
const IDENTITY_MAX = 10_000
const identities = new WeakMap<Kv.Kv<StoredRun>, Map<string, { identity: RunIdentity; until: number }>>()

const identitiesOf = (store: Kv.Kv<StoredRun>) => {
  let kept = identities.get(store)
  if (kept === undefined) {
    kept = new Map()
    identities.set(store, kept)
  }
  return kept
}

/** `readRun` for the command routes: the run's identity, from memory when read within the minute. */
export const runIdentity = (principal: Member, id: string): Effect.Effect<RunIdentity, ApiError, RunStore> =>
  Effect.flatMap(RunStore, (store) => {
    const kept = identitiesOf(store)
    const key = kvKeys.run(principal.account.id, id)
    const found = kept.get(key)
    if (found !== undefined && found.until > Date.now())
      return mayUse(principal, found.identity.function)
        ? Effect.succeed(found.identity)
        : Effect.fail(ApiError.keyScope())
    return Effect.map(readRun(principal, id), (run) => {
      const identity: RunIdentity = {
        id: run.id,
        account: run.account,
        function: run.function,
        ended: endedRunStates.has(run.state),
      }
      kept.delete(key)
      if (kept.size >= IDENTITY_MAX) kept.delete(kept.keys().next().value as string)
      kept.set(key, { identity, until: Date.now() + IDENTITY_TTL_MS })
      return identity
    })
  })

const matches = (run: StoredRun, state: RunStateFilter | undefined): boolean =>
  state === undefined ||
  (state === "active" ? run.state === "queued" || run.state === "running" : run.state === state)

// Values read at once while filling a page.
const BATCH = 64

/** One page of the account's runs, newest first. */
export const listRuns = (
  principal: Member,
  filter: {
    readonly function?: string | undefined
    readonly state?: RunStateFilter | undefined
    readonly before?: string | undefined
  },
  pageSize: number,
) =>
  Effect.gen(function* () {
    const store = yield* RunStore
    const account = principal.account.id
    const prefix = `${account}.`
    const keys = yield* orInternal(store.keys(kvKeys.runsOf(account)), "run listing")
    const ids = keys
      .map((k) => k.slice(prefix.length))
      .filter((id) => filter.before === undefined || id < filter.before)
      .sort()
      .reverse()
    const page: Array<StoredRun> = []
    let more = false
    for (let at = 0; at < ids.length && !more; at += BATCH) {
      const batch = yield* Effect.forEach(
        ids.slice(at, at + BATCH),
        (id) => orInternal(store.get(kvKeys.run(account, id)), "run read"),
        { concurrency: 16 },
      )
      for (const entry of batch) {
        // A run purged between the listing and the read is skipped.
        if (Option.isNone(entry)) continue
        const run = entry.value.value
        if (filter.function !== undefined && run.function !== filter.function) continue
        if (!mayUse(principal, run.function) || !matches(run, filter.state)) continue
        if (page.length === pageSize) {
          more = true
          break
        }
        page.push(run)
      }
    }
    return { runs: page, next: more ? page[page.length - 1]?.id : undefined }
  })

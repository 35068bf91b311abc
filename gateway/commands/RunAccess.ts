/**
 * Who may reach a run's commands (spec "Endpoints": "key able to start the function, or member"):
 * a member person or an admin key of the run's account, or a run key whose `functions` list names
 * the run's function (or `*`). A run of another account, or an id that is not a run id, is
 * `404 not_found` — the same answer as a run that does not exist, so ids of other accounts cannot
 * be probed; a run key outside its list gets `403 key_scope`.
 *
 * The run is read from KV `runs` (`<account>.<run>`, the run actor's projection), so the check
 * costs one KV read and does not wait for the actor. As in the runs group's `readRun`, the id is
 * checked to be a run id first (an id holding `.` or `*` cannot become a KV key); unlike it, this
 * needs no store service, so these routes' handlers need only NATS and storage.
 */
import { Effect, Option, Schema } from "effect"
import * as Kv from "../../core/Kv.ts"
import type { Nats, NatsError } from "../../core/Nats.ts"
import { Storage } from "../../core/Storage.ts"
import { ApiError } from "../../schema/Errors.ts"
import { RunId } from "../../schema/Ids.ts"
import { StoredRun } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { type Member, mayUse } from "../runs/Runs.ts"

const isRunId = Schema.is(RunId)

/** The run's current stored record, or none (absent, or not a run id). */
export const readRun = (
  account: string,
  id: string,
): Effect.Effect<Option.Option<StoredRun>, Kv.KvValueInvalid | NatsError, Nats | Storage> =>
  Effect.gen(function* () {
    if (!isRunId(id)) return Option.none()
    const { names } = yield* Storage
    const runs = yield* Kv.make(names.kv.runs.name, StoredRun)
    return Option.map(yield* runs.get(kvKeys.run(account, id)), (e) => e.value)
  })

/**
 * The run `id` of the principal's account, when the principal may reach it; else
 * `404 not_found` or `403 key_scope`. Storage failures are left to the server (500).
 */
export const runFor = (principal: Member, id: string) =>
  Effect.gen(function* () {
    const found = yield* readRun(principal.account.id, id)
    if (Option.isNone(found)) return yield* Effect.fail(ApiError.notFound("run"))
    if (!mayUse(principal, found.value.function)) return yield* Effect.fail(ApiError.keyScope())
    return found.value
  })

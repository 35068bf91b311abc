/**
 * The commands API (spec "Commands", "Command output read", command rules):
 *
 *   POST /v1/runs/{id}/commands?wait=            201 record; asks the run actor `AddCommand`; with
 *                                                `wait` (beyond the spec), the record once it ended or after `wait` s
 *   GET  /v1/runs/{id}/commands/{cid}?wait=      the record; with `wait`, once it ended or after `wait` s
 *   GET  /v1/runs/{id}/commands?since=N&wait=    records changed after N, the run's state, next `sequence`
 *   GET  /v1/runs/{id}/commands/{cid}/output?after=&wait=   a ≤ 512 KiB window of its output
 *   POST /v1/runs/{id}/commands/{cid}/cancel     200 record, once it ended (or after ~10 s)
 *
 * Access is "key able to start the function, or member" (`readRun` of `../runs/Runs.ts`): the
 * `member` label, then a run key only for runs of the functions it names (403 `key_scope`); a run
 * of another account, or an id that is no run id, is 404. Creating is refused with 409 `run_ended`
 * once the run has ended. The routes on one command take the run's unchanging facts from
 * `runIdentity` (kept for a minute); the list reads the run afresh.
 *
 * Decisions:
 * - `since` and `sequence` count changes with the `commands` bucket's revisions: a record's
 *   revision is its last write, so a list read returns each command changed after N once, at its
 *   latest, ordered by that change; `sequence` is the revision of the last one returned (N when
 *   none) and is what to send next time. A command changing state comes back in a later read. One
 *   read holds about 4 MiB of records (always at least one); the run's `state` is read after the
 *   records, so it is never older than them.
 * - Waits are events, never sleep loops: the record's stored writes as the run's follower brings
 *   them (one command: `Records.ts`, no read for a command created here), a KV watch of the run's
 *   records from revision N+1 and of the run's state (the list), an ordered consumer on the
 *   command's output subject one past the last message read (output). The server interrupts the
 *   request's fiber when the client goes away, which ends the wait.
 * - Output `done` is also true once the record has ended and everything stored was read, so a
 *   command that never ran (cancelled while queued, or not `bash`) answers done instead of
 *   waiting forever for a marker no one will write. The host stores every chunk of a `bash`
 *   command's output before its record's end (the marker follows without being waited for), so
 *   this does not cut a finished command short; `output_bytes` then comes from the record.
 * - Cancel answers 200 with the record (DESIGN.md): at once when it has already ended, else after
 *   asking the run actor, when the record ends, or at the latest after `cancelWaitMs`.
 */
import { Clock, Duration, Effect, Layer, Option } from "effect"
import { mailboxLayer } from "../../core/actors/AccountClient.ts"
import { Mailbox } from "../../core/actors/Mailbox.ts"
import { awaitOutputAfter, readOutputAt } from "../../core/CommandOutput.ts"
import { Run } from "../../schema/actors/Run.ts"
import {
  CommandList,
  CommandOutput,
  CommandOutputQuery,
  type CommandRecord,
  CommandRecord as CommandRecordSchema,
  CreateCommandQuery,
  CreateCommandRequest,
  GetCommandQuery,
  ListCommandsQuery,
} from "../../schema/Command.ts"
import { timestamp } from "../../schema/Common.ts"
import { ApiError } from "../../schema/Errors.ts"
import type { CommandId } from "../../schema/Ids.ts"
import { endedRunStates } from "../../schema/Run.ts"
import { kvKeys } from "../../schema/Subjects.ts"
import { authRoute } from "../auth/Route.ts"
import { attemptTag, idsFresh, newId } from "../Idempotency.ts"
import { documented } from "../openapi/OpenApi.ts"
import { json } from "../Response.ts"
import { RunStore, readRun, runIdentity, storeLayer } from "../runs/Runs.ts"
import { CommandRouteSettings, decodeQuery, upTo } from "./LongPoll.ts"
import * as Records from "./Records.ts"

// The command, or 404 (an id that is not a command of this run, whatever else it is).
const commandOf = (run: string, cid: string) =>
  Effect.gen(function* () {
    const seq = yield* Records.sequenceOf(run, cid)
    if (Option.isNone(seq)) return yield* Effect.fail(ApiError.notFound("command"))
    const record = yield* Records.get(run, seq.value)
    if (Option.isNone(record) || record.value.id !== cid)
      return yield* Effect.fail(ApiError.notFound("command"))
    return { record: record.value, seq: seq.value }
  })

// The record at `seq` now (it exists: records are never deleted while the run is kept).
const current = (run: string, seq: number, fallback: CommandRecord) =>
  Effect.map(
    Records.get(run, seq),
    Option.getOrElse(() => fallback),
  )

// What the output read answers; `done` also once the record ended and all stored was read, and
// then the byte count is the result's (the marker may not be stored yet; every chunk is).
const outputAnswer = (output: CommandOutput, record: CommandRecord): CommandOutput => {
  if (!Records.isEnded(record)) return output
  const counted =
    record.result !== undefined && "output_bytes" in record.result ? record.result.output_bytes : 0
  return {
    ...output,
    output_bytes: Math.max(output.output_bytes, counted),
    done: output.done || output.next >= output.stored_bytes,
  }
}

// A command without output (every kind but `bash`): empty, done once it ended.
const noOutput = (after: number, record: CommandRecord): CommandOutput => ({
  output: "",
  next: after,
  output_bytes: 0,
  stored_bytes: 0,
  done: Records.isEnded(record),
})

/** The command routes. */
export const routes = [
  documented(
    authRoute({
      method: "POST",
      path: "/v1/runs/:id/commands",
      access: "member",
      body: CreateCommandRequest,
      handler: ({ principal, params, body, query }) =>
        Effect.gen(function* () {
          // Refused before anything is asked: a bad `wait` creates no command.
          const { wait = 0 } = yield* decodeQuery(CreateCommandQuery, query)
          const settings = yield* CommandRouteSettings.Tag
          const run = yield* runIdentity(principal, params.id)
          // Final: no need to ask the actor.
          if (run.ended) return yield* Effect.fail(ApiError.runEnded())
          const id = (yield* newId("cmd")) as CommandId
          const mailbox = yield* Mailbox
          const created_at = timestamp(yield* Clock.currentTimeMillis)
          const fresh = yield* idsFresh
          // The run's records are followed before the ask, so this command's writes all come to
          // the waits on it (with `wait` here, or a `GET …?wait=` after): they need not read it.
          yield* Records.follow(run.id)
          const reply = yield* mailbox
            .ask(
              Run,
              run.id,
              {
                _tag: "AddCommand",
                id,
                kind: body.kind,
                arguments: body.arguments,
                source: "caller",
                created_at,
                fresh,
              },
              { timeout: Duration.millis(settings.askTimeoutMs), msgId: `add:${id}:${attemptTag()}` },
            )
            .pipe(
              // The actor may have stored it and only its answer was late (a worker restarting):
              // the stored command is the answer, never a 500 for a command that exists.
              Effect.catchTag("AskTimeout", (e) =>
                Effect.flatMap(Effect.either(commandOf(run.id, id)), (found) =>
                  found._tag === "Right" ? Effect.succeed({ command: found.right.record }) : Effect.fail(e),
                ),
              ),
            )
          if ("command" in reply) {
            const created = reply.command
            Records.remember(run.id, created.id, created.sequence)
            if (wait === 0 || Records.isEnded(created)) return json(created, { status: 201 })
            // With `wait`: the record once the command has ended, or as it is when the time is up.
            const record = yield* Records.endedOrLatest(run.id, created.sequence, created.id, wait * 1000)
            return json(
              Option.getOrElse(record, () => created),
              { status: 201 },
            )
          }
          if ("ended" in reply) return yield* Effect.fail(ApiError.runEnded())
          return yield* Effect.fail(ApiError.notFound("run"))
        }),
    }),
    {
      summary:
        "Send a command to a run; it starts when the run is ready. With `wait`, answers once it has ended or after `wait` seconds.",
      query: CreateCommandQuery,
      body: CreateCommandRequest,
      response: { status: 201, schema: CommandRecordSchema },
    },
  ),
  documented(
    authRoute({
      method: "GET",
      path: "/v1/runs/:id/commands/:cid",
      access: "member",
      handler: ({ principal, params, query }) =>
        Effect.gen(function* () {
          const { wait = 0 } = yield* decodeQuery(GetCommandQuery, query)
          const run = yield* runIdentity(principal, params.id)
          if (wait === 0) return json((yield* commandOf(run.id, params.cid)).record)
          const seq = yield* Records.sequenceOf(run.id, params.cid)
          if (Option.isNone(seq)) return yield* Effect.fail(ApiError.notFound("command"))
          const record = yield* Records.endedOrLatest(run.id, seq.value, params.cid, wait * 1000)
          if (Option.isNone(record)) return yield* Effect.fail(ApiError.notFound("command"))
          return json(record.value)
        }),
    }),
    {
      summary: "A command; with `wait`, answers when it has ended or after `wait` seconds.",
      query: GetCommandQuery,
      response: { status: 200, schema: CommandRecordSchema },
    },
  ),
  documented(
    authRoute({
      method: "GET",
      path: "/v1/runs/:id/commands",
      access: "member",
      handler: ({ principal, params, query }) =>
        Effect.gen(function* () {
          const settings = yield* CommandRouteSettings.Tag
          const { since = 0, wait = 0 } = yield* decodeQuery(ListCommandsQuery, query)
          const run = yield* readRun(principal, params.id)
          let read = yield* Records.changedAfter(run.id, since, settings.listMaxBytes)
          // An ended run changes no more: its state is answered at once (a caller whose last read
          // showed it running would otherwise wait the whole `wait` for a change that never comes).
          if (read.entries.length === 0 && wait > 0 && !endedRunStates.has(run.state)) {
            yield* upTo(
              Duration.seconds(wait),
              Effect.raceFirst(
                Records.awaitChangeAfter(run.id, since),
                Records.awaitRunStateOtherThan(run.account, run.id, run.state),
              ),
            )
            read = yield* Records.changedAfter(run.id, since, settings.listMaxBytes)
          }
          // After the records: the state is never older than the changes returned.
          const now = Option.map(
            yield* (yield* RunStore).get(kvKeys.run(run.account, run.id)),
            (e) => e.value,
          )
          const list: CommandList = {
            commands: read.entries.map((e) => e.value),
            state: Option.match(now, { onNone: () => run.state, onSome: (r) => r.state }),
            sequence: read.through,
          }
          return json(list)
        }),
    }),
    {
      summary:
        "The run's commands changed after `since` (by change counter), its state, and the `sequence` to send next.",
      query: ListCommandsQuery,
      response: { status: 200, schema: CommandList },
    },
  ),
  documented(
    authRoute({
      method: "GET",
      path: "/v1/runs/:id/commands/:cid/output",
      access: "member",
      handler: ({ principal, params, query }) =>
        Effect.gen(function* () {
          const { after = 0, wait = 0 } = yield* decodeQuery(CommandOutputQuery, query)
          const run = yield* runIdentity(principal, params.id)
          const { record, seq } = yield* commandOf(run.id, params.cid)
          if (record.kind !== "bash") {
            if (wait === 0 || Records.isEnded(record)) return json(noOutput(after, record))
            yield* upTo(Duration.seconds(wait), Records.awaitEnded(run.id, seq))
            return json(noOutput(after, yield* current(run.id, seq, record)))
          }
          const first = yield* readOutputAt(run.account, run.id, record.id, after)
          const answer = outputAnswer(first.output, record)
          if (wait === 0 || answer.done || answer.next > after || Records.isEnded(record)) return json(answer)
          yield* upTo(
            Duration.seconds(wait),
            Effect.raceFirst(
              awaitOutputAfter(run.id, record.id, first.lastSeq),
              Records.awaitEnded(run.id, seq),
            ),
          )
          // The record first: an output read after it cannot miss what came before its end.
          const now = yield* current(run.id, seq, record)
          const again = yield* readOutputAt(run.account, run.id, record.id, after)
          return json(outputAnswer(again.output, now))
        }),
    }),
    {
      summary:
        "A window of a command's output from byte offset `after` (at most 512 KiB, whole UTF-8 characters); with `wait`, waits for more.",
      query: CommandOutputQuery,
      response: { status: 200, schema: CommandOutput },
    },
  ),
  documented(
    authRoute({
      method: "POST",
      path: "/v1/runs/:id/commands/:cid/cancel",
      access: "member",
      handler: ({ principal, params }) =>
        Effect.gen(function* () {
          const settings = yield* CommandRouteSettings.Tag
          const run = yield* runIdentity(principal, params.id)
          const { record, seq } = yield* commandOf(run.id, params.cid)
          if (Records.isEnded(record)) return json(record)
          const mailbox = yield* Mailbox
          const reply = yield* mailbox.ask(
            Run,
            run.id,
            { _tag: "CancelCommand", id: record.id, sequence: seq },
            { timeout: Duration.millis(settings.askTimeoutMs) },
          )
          if ("command" in reply && Records.isEnded(reply.command)) return json(reply.command)
          if ("unknown" in reply) return yield* Effect.fail(ApiError.notFound("run"))
          // The host kills its processes (or the ended run's actor cancels it): wait for the record.
          const ended = yield* upTo(Duration.millis(settings.cancelWaitMs), Records.awaitEnded(run.id, seq))
          return json(
            Option.isSome(ended) && Option.isSome(ended.value)
              ? ended.value.value
              : yield* current(run.id, seq, record),
          )
        }),
    }),
    {
      summary:
        "Cancel a command: its processes are killed and it ends `cancelled`; an ended command is unchanged.",
      response: { status: 200, schema: CommandRecordSchema },
    },
  ),
]

/**
 * The group's services: a mailbox client to ask run actors, the runs bucket (who may reach a run is
 * the runs group's rule, `readRun`), and the settings from `HANGAR_*` variables.
 */
export const layerFromEnv = Layer.mergeAll(mailboxLayer, storeLayer, CommandRouteSettings.layerFromEnv)

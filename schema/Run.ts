/**
 * Runs (spec "Run", "Start a run", `GET /v1/runs`): the record, its states and failure causes,
 * output and usage, and the start request.
 */
import { Schema } from "effect"
import {
  ArrayMax,
  Count,
  Enum,
  ExternalReference,
  HttpsUrl,
  IntAtLeast,
  Sha256Hex,
  StringMaxChars,
  Timestamp,
} from "./Common.ts"
import { Size } from "./Definition.ts"
import { AccountId, Actor, BaseName, FunctionId, RunId, UploadId } from "./Ids.ts"
import { outputFilesMax, promptMaxChars } from "./Limits.ts"

/** A run's state: `queued → running → succeeded | failed`. */
export const RunState = Enum("queued", "running", "succeeded", "failed").annotations({
  identifier: "RunState",
})
export type RunState = typeof RunState.Type

/** The states in which a run has ended (and refuses commands with `run_ended`). */
export const endedRunStates: ReadonlySet<RunState> = new Set<RunState>(["succeeded", "failed"])

/** Why a run failed (spec `failure`). */
export const RunFailure = Enum(
  "input",
  "no_submission",
  "timeout",
  "provider",
  "infrastructure",
  "setup",
  "suspended",
  "credit",
).annotations({ identifier: "RunFailure" })
export type RunFailure = typeof RunFailure.Type

/** One file or folder of a run's output listing. */
export const OutputFile = Schema.Struct({
  path: Schema.String,
  bytes: Count,
  dir: Schema.Boolean,
}).annotations({
  identifier: "OutputFile",
})
export type OutputFile = typeof OutputFile.Type

/** A succeeded run's output: the folder as one `.tar.gz` (`url` made fresh on each read). */
export const RunOutput = Schema.Struct({
  sha256: Sha256Hex,
  bytes: Count,
  file_count: Count,
  url: Schema.String,
  files: ArrayMax(OutputFile, outputFilesMax),
}).annotations({ identifier: "RunOutput" })
export type RunOutput = typeof RunOutput.Type

/** Compute and model usage of a run. */
export const RunUsage = Schema.Struct({
  compute: Schema.Struct({ size: Size, seconds: Count }),
  model: Schema.Struct({
    calls: Count,
    input_tokens: Count,
    cache_read_tokens: Count,
    cache_write_tokens: Count,
    output_tokens: Count,
    web_searches: Count,
  }),
}).annotations({ identifier: "RunUsage" })
export type RunUsage = typeof RunUsage.Type

/** The usage of a run that has not used anything yet. */
/** The value of `kvKeys.lastRun` in KV `runs`: a function's newest run (written by the run actor). */
export const LastRun = Schema.Struct({ run: RunId }).annotations({ identifier: "LastRun" })

/** Model usage before any call. */
export const emptyModelUsage: RunUsage["model"] = {
  calls: 0,
  input_tokens: 0,
  cache_read_tokens: 0,
  cache_write_tokens: 0,
  output_tokens: 0,
  web_searches: 0,
}

export const emptyUsage = (size: Size): RunUsage => ({
  compute: { size, seconds: 0 },
  model: emptyModelUsage,
})

/**
 * A run as `GET /v1/runs/{id}` returns it. Optional fields are absent until they apply:
 * `input`, `webhook`, `external_reference` when sent; `started_at` once running; `ended_at` once
 * ended; `failure` and `detail` only on failed runs; `output` only on succeeded runs; `message`
 * (the agent's final message or the `finish` detail, DESIGN.md) once given.
 */
export const Run = Schema.Struct({
  id: RunId,
  account: AccountId,
  function: FunctionId,
  version: IntAtLeast(1),
  base: BaseName,
  size: Size,
  /** The provider as resolved for the run, `prv_<id>@<n>`, or `none` for a run without an agent. */
  provider: Schema.String,
  prompt: Schema.String,
  input: Schema.optional(UploadId),
  webhook: Schema.optional(Schema.String),
  external_reference: Schema.optional(Schema.String),
  state: RunState,
  created_at: Timestamp,
  started_at: Schema.optional(Timestamp),
  ended_at: Schema.optional(Timestamp),
  created_by: Actor,
  failure: Schema.optional(RunFailure),
  detail: Schema.optional(Schema.String),
  message: Schema.optional(Schema.String),
  output: Schema.optional(RunOutput),
  usage: RunUsage,
}).annotations({ identifier: "Run" })
export type Run = typeof Run.Type

/**
 * `POST /v1/functions/{id}/runs`. `prompt` counts characters (see `Limits.promptMaxChars`);
 * `version` 0 or absent means the latest; `input` is required only when the input manifest names
 * entries, which is checked against the version, not here.
 */
export const StartRunRequest = Schema.Struct({
  prompt: StringMaxChars(promptMaxChars),
  input: Schema.optional(UploadId),
  version: Schema.optionalWith(IntAtLeast(0), { default: () => 0 }),
  webhook: Schema.optional(HttpsUrl),
  external_reference: Schema.optional(ExternalReference),
}).annotations({ identifier: "StartRunRequest" })
export type StartRunRequest = typeof StartRunRequest.Type

/** The `state` filter of `GET /v1/runs`: `active` is queued or running. */
export const RunStateFilter = Enum("active", "succeeded", "failed").annotations({
  identifier: "RunStateFilter",
})
export type RunStateFilter = typeof RunStateFilter.Type

/** The query of `GET /v1/runs` (a run-scope key must give `function`, checked by the route). */
export const ListRunsQuery = Schema.Struct({
  function: Schema.optional(FunctionId),
  state: Schema.optional(RunStateFilter),
  before: Schema.optional(RunId),
}).annotations({ identifier: "ListRunsQuery" })
export type ListRunsQuery = typeof ListRunsQuery.Type

/** `GET /v1/runs`: 50 runs newest first; `next` (pass as `before`) only when more remain. */
export const RunList = Schema.Struct({
  runs: Schema.Array(Run),
  next: Schema.optional(RunId),
}).annotations({ identifier: "RunList" })
export type RunList = typeof RunList.Type

/** `GET /v1/runs/{id}/log`: links to the log's parts, in order. */
export const RunLog = Schema.Struct({ parts: Schema.Array(Schema.String) }).annotations({
  identifier: "RunLog",
})
export type RunLog = typeof RunLog.Type

/**
 * A succeeded run's output as stored: the listing and hash, and the sealed archive's object name in
 * the `outputs` store. `GET /v1/runs/{id}` turns `object` into a fresh 15-minute `url`.
 */
export const StoredOutput = Schema.Struct({
  sha256: Sha256Hex,
  bytes: Count,
  file_count: Count,
  files: ArrayMax(OutputFile, outputFilesMax),
  object: Schema.String,
}).annotations({ identifier: "StoredOutput" })
export type StoredOutput = typeof StoredOutput.Type

/**
 * A run as stored in KV `runs` under `<account>.<run>` (`kvKeys.run`), written only by the run
 * actor: the API's Run with the output's object name instead of a link, plus what the API does not
 * show. `seq` is the run actor's mailbox sequence at the write, so a write never replaces a newer
 * one (a stale owner's late projection loses); `log_parts` counts the log objects `<run>.<n>`
 * (`n` from 1) in the `logs` store, and `log_complete` says the last of them (the machine's `end`)
 * is among them; `memory_mib` and `timeout_minutes` are the resolved size's memory and the
 * version's timeout.
 */
export const StoredRun = Schema.Struct({
  ...Run.fields,
  output: Schema.optional(StoredOutput),
  memory_mib: Count,
  timeout_minutes: IntAtLeast(1),
  log_parts: Count,
  log_complete: Schema.optional(Schema.Boolean),
  /** The host that took the run, once one did. */
  host: Schema.optional(Schema.String),
  seq: Count,
}).annotations({ identifier: "StoredRun" })
export type StoredRun = typeof StoredRun.Type

/** The run as the API shows it: the stored run without what is ours, `output.url` = `outputUrl`. */
export const apiRun = (stored: StoredRun, outputUrl: string): Run => {
  const {
    output,
    memory_mib: _m,
    timeout_minutes: _t,
    log_parts: _l,
    log_complete: _c,
    host: _h,
    seq: _s,
    ...rest
  } = stored
  if (output === undefined) return rest
  const { object: _o, ...shown } = output
  return { ...rest, output: { ...shown, url: outputUrl } }
}

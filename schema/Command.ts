/**
 * Commands sent to a run by the caller or the agent (spec "Command kinds", "Command record",
 * "Command output read"): arguments and result per kind, the record, requests and responses.
 *
 * A result is the kind's result or `{error}`: the command is `succeeded` whenever the machine
 * answered, even when what it answered is an error (a missing file, an edit that did not apply).
 */
import { Schema } from "effect"
import {
  ArrayMax,
  Count,
  Enum,
  IntAtLeast,
  IntBetween,
  NonEmptyString,
  Timestamp,
  utf8Bytes,
} from "./Common.ts"
import { envNamePattern } from "./Definition.ts"
import { CommandId, RunId, UploadId } from "./Ids.ts"
import {
  bashTimeoutDefaultMs,
  bashTimeoutMaxMs,
  commandArgumentsMaxBytes,
  listMaxEntries,
  terminalMaxSide,
  waitMaxSeconds,
} from "./Limits.ts"
import { RunState } from "./Run.ts"

/** The kinds of command. */
export const commandKinds = [
  "bash",
  "read",
  "write",
  "edit",
  "list",
  "put",
  "get",
  "finish",
  "terminal",
] as const
/** A command kind. */
export const CommandKind = Enum(...commandKinds).annotations({ identifier: "CommandKind" })
export type CommandKind = typeof CommandKind.Type

/** A command's state; `running` is ours (the spec leaves states while executing open). */
export const CommandState = Enum("queued", "running", "succeeded", "failed", "cancelled").annotations({
  identifier: "CommandState",
})
export type CommandState = typeof CommandState.Type

/** The states in which a command has ended; cancelling one of these changes nothing. */
export const endedCommandStates: ReadonlySet<CommandState> = new Set<CommandState>([
  "succeeded",
  "failed",
  "cancelled",
])

/** Who sent a command: the API caller, or the run's agent. */
export const CommandSource = Enum("caller", "agent").annotations({ identifier: "CommandSource" })
export type CommandSource = typeof CommandSource.Type

const loneSurrogate = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

/** A string the machine can take: no NUL (nothing in a Unix path, command or variable may hold one) and valid Unicode. */
const machineText = (s: string): string | undefined => {
  if (s.includes("\0")) return "must not contain a NUL character"
  if (loneSurrogate.test(s)) return "must be valid Unicode (a lone surrogate has no UTF-8 form)"
  return undefined
}

/** Linux's limits: a whole path (PATH_MAX, its NUL included) and one name in it (NAME_MAX). */
export const pathMaxBytes = 4095
export const nameMaxBytes = 255

/**
 * A path in the machine; relative paths resolve from `/workspace`. Refused before it reaches the
 * machine when no Linux path could be it: a NUL, a lone surrogate, more than 4,095 bytes, or a
 * name of more than 255 bytes. Other characters (control characters included) are legal in Linux
 * names and are passed on as they are.
 */
const MachinePath = NonEmptyString.pipe(
  Schema.filter((path) => {
    const problem = machineText(path)
    if (problem !== undefined) return problem
    if (utf8Bytes(path) > pathMaxBytes) return `must be at most ${pathMaxBytes} bytes (UTF-8)`
    if (path.split("/").some((name) => utf8Bytes(name) > nameMaxBytes))
      return `each name in it must be at most ${nameMaxBytes} bytes (UTF-8)`
    return true
  }),
)

/** Text a command runs or is given (a bash command, a variable's value): no NUL, valid Unicode. */
const MachineText = Schema.String.pipe(Schema.filter((text) => machineText(text) ?? true))

// Extra variables of a command: names as in a definition's environment.
const CommandEnv = Schema.Record({ key: Schema.String, value: MachineText }).pipe(
  Schema.filter((env) => {
    for (const name of Object.keys(env))
      if (!envNamePattern.test(name)) return { path: [name], message: `must match ${envNamePattern.source}` }
    return true
  }),
)

// ---------------------------------------------------------------------------------------------
// Arguments

/** `bash`: run `command` in its own `bash -c`; `timeout_ms` defaults to 5 minutes, at most 24 hours. */
export const BashArguments = Schema.Struct({
  command: Schema.compose(NonEmptyString, MachineText),
  workdir: Schema.optional(MachinePath),
  timeout_ms: Schema.optionalWith(IntBetween(1, bashTimeoutMaxMs), { default: () => bashTimeoutDefaultMs }),
  env: Schema.optional(CommandEnv),
}).annotations({ identifier: "BashArguments" })
/** `read`: a file's lines from `offset` (counting from 1), `limit` lines; images as `image_url`. */
export const ReadArguments = Schema.Struct({
  file_path: MachinePath,
  offset: Schema.optional(IntAtLeast(1)),
  limit: Schema.optional(IntAtLeast(1)),
}).annotations({ identifier: "ReadArguments" })
/** `write`: replace a file with `content`, making parent folders. */
export const WriteArguments = Schema.Struct({ file_path: MachinePath, content: Schema.String }).annotations({
  identifier: "WriteArguments",
})
/** `edit`: replace each `old_text` (which must occur exactly once) by `new_text`; all or none. */
export const EditArguments = Schema.Struct({
  file_path: MachinePath,
  edits: Schema.Array(Schema.Struct({ old_text: NonEmptyString, new_text: Schema.String })).pipe(
    Schema.minItems(1, { message: () => "at least one edit is required" }),
  ),
}).annotations({ identifier: "EditArguments" })
/** `list`: the files and folders directly inside `path`. */
export const ListArguments = Schema.Struct({ path: MachinePath }).annotations({ identifier: "ListArguments" })
/** `put`: copy an upload to `path`, replacing a file there. */
export const PutArguments = Schema.Struct({ file: UploadId, path: MachinePath }).annotations({
  identifier: "PutArguments",
})
/** `get`: a download link for a file, or a folder as `.tar.gz`. */
export const GetArguments = Schema.Struct({ path: MachinePath }).annotations({ identifier: "GetArguments" })
/** `finish`: end the run as `succeeded` (the output must match the manifest) or `failed`. */
export const FinishArguments = Schema.Struct({
  state: Enum("succeeded", "failed"),
  detail: Schema.optional(Schema.String),
}).annotations({ identifier: "FinishArguments" })
/**
 * `terminal`: open an end-to-end encrypted shell. `public_key` is the caller's ECDH P-256 public
 * key as an uncompressed point (65 bytes, first byte 4) in base64url without padding.
 */
export const TerminalArguments = Schema.Struct({
  rows: IntBetween(1, terminalMaxSide),
  cols: IntBetween(1, terminalMaxSide),
  public_key: Schema.String.pipe(
    Schema.filter((k) => {
      const ok = /^[A-Za-z0-9_-]{87}$/.test(k) && Buffer.from(k, "base64url")[0] === 4
      return ok || "must be an uncompressed P-256 point (65 bytes) in base64url"
    }),
  ),
  env: Schema.optional(CommandEnv),
}).annotations({ identifier: "TerminalArguments" })

// ---------------------------------------------------------------------------------------------
// Results

const ErrorResult = Schema.Struct({ error: Schema.String })

/** `bash`: exit status and the first and last 16 KiB of the output. */
export const BashResult = Schema.Struct({
  exit_code: Schema.Int,
  output: Schema.String,
  output_bytes: Count,
  truncated: Schema.Boolean,
  timed_out: Schema.Boolean,
  oom_killed: Schema.Boolean,
}).annotations({ identifier: "BashResult" })
/** `read`: the text, or a link to an image. */
export const ReadResult = Schema.Union(
  Schema.Struct({ output: Schema.String }),
  Schema.Struct({ image_url: Schema.String }),
  ErrorResult,
).annotations({ identifier: "ReadResult" })
/** `write`: bytes written. */
export const WriteResult = Schema.Union(Schema.Struct({ bytes: Count }), ErrorResult).annotations({
  identifier: "WriteResult",
})
/** `edit`: how many edits applied (all of them, or an error and none). */
export const EditResult = Schema.Union(Schema.Struct({ applied: Count }), ErrorResult).annotations({
  identifier: "EditResult",
})
/** One entry of a `list`: a file with its size, or a folder. */
export const ListEntry = Schema.Struct({
  name: Schema.String,
  type: Enum("file", "folder"),
  size: Schema.optional(Count),
}).annotations({ identifier: "ListEntry" })
export type ListEntry = typeof ListEntry.Type
/** `list`: at most 1000 entries; links are skipped (named in `skipped`), not followed. */
export const ListResult = Schema.Union(
  Schema.Struct({
    entries: ArrayMax(ListEntry, listMaxEntries),
    truncated: Schema.Boolean,
    skipped: Schema.Array(Schema.String),
  }),
  ErrorResult,
).annotations({ identifier: "ListResult" })
/** `put`: bytes written. */
export const PutResult = Schema.Union(Schema.Struct({ bytes: Count }), ErrorResult).annotations({
  identifier: "PutResult",
})
/** `get`: a download link valid 15 minutes. */
export const GetResult = Schema.Union(
  Schema.Struct({ download_url: Schema.String }),
  ErrorResult,
).annotations({
  identifier: "GetResult",
})
/** `finish`: whether the run ends; `problems` when the output does not match the manifest. */
export const FinishResult = Schema.Struct({
  accepted: Schema.Boolean,
  problems: Schema.optional(Schema.Array(Schema.String)),
  /** An image of the machine's root disk, when finishing an agentless run captured one (DESIGN.md). */
  image: Schema.optional(Schema.String),
}).annotations({ identifier: "FinishResult" })
/** `terminal`: where to meet the host, and the host's public key. */
export const TerminalResult = Schema.Union(
  Schema.Struct({ relay_url: Schema.String, route: Schema.String, public_key: Schema.String }),
  ErrorResult,
).annotations({ identifier: "TerminalResult" })

/** Each kind's arguments and result. */
export const commandSchemas = {
  bash: { arguments: BashArguments, result: BashResult },
  read: { arguments: ReadArguments, result: ReadResult },
  write: { arguments: WriteArguments, result: WriteResult },
  edit: { arguments: EditArguments, result: EditResult },
  list: { arguments: ListArguments, result: ListResult },
  put: { arguments: PutArguments, result: PutResult },
  get: { arguments: GetArguments, result: GetResult },
  finish: { arguments: FinishArguments, result: FinishResult },
  terminal: { arguments: TerminalArguments, result: TerminalResult },
} as const

/** The arguments of a kind of command, decoded (defaults filled). */
export type CommandArguments<K extends CommandKind = CommandKind> =
  (typeof commandSchemas)[K]["arguments"]["Type"]
/** The result of a kind of command. */
export type CommandResult<K extends CommandKind = CommandKind> = (typeof commandSchemas)[K]["result"]["Type"]

// ---------------------------------------------------------------------------------------------
// Requests and records

type Schemas = typeof commandSchemas

// The explicit return types keep each member's arguments tied to its kind, so a decoded request or
// record narrows on `kind` (TypeScript would otherwise widen the indexed access to every kind).
const request = <K extends CommandKind>(
  kind: K,
): Schema.Struct<{ kind: Schema.Literal<[K]>; arguments: Schemas[K]["arguments"] }> =>
  Schema.Struct({
    kind: Schema.Literal(kind),
    arguments: commandSchemas[kind].arguments as Schemas[K]["arguments"],
  })

/**
 * `POST /v1/runs/{id}/commands`: `{kind, arguments}` with the kind's arguments; the arguments'
 * JSON is at most 128 KiB (larger files go through `put`). An unknown `kind` names the kinds.
 */
export const CreateCommandRequest = Schema.Struct({
  kind: CommandKind,
  arguments: Schema.Record({ key: Schema.String, value: Schema.Unknown }),
})
  .pipe(
    Schema.filter((r) =>
      utf8Bytes(JSON.stringify(r.arguments)) <= commandArgumentsMaxBytes
        ? true
        : { path: ["arguments"], message: `at most ${commandArgumentsMaxBytes} bytes of JSON` },
    ),
    // Size first, then the kind's own arguments, so a huge body is refused before it is walked.
    Schema.compose(
      Schema.Union(
        request("bash"),
        request("read"),
        request("write"),
        request("edit"),
        request("list"),
        request("put"),
        request("get"),
        request("finish"),
        request("terminal"),
      ),
      { strict: false },
    ),
  )
  .annotations({ identifier: "CreateCommandRequest" })
export type CreateCommandRequest = typeof CreateCommandRequest.Type

const commonRecordFields = {
  id: CommandId,
  run: RunId,
  state: CommandState,
  source: CommandSource,
  sequence: IntAtLeast(1),
  /** Set when the command could not run (`failed`). */
  error: Schema.optional(Schema.String),
  created_at: Timestamp,
  started_at: Schema.optional(Timestamp),
  ended_at: Schema.optional(Timestamp),
}

const record = <K extends CommandKind>(
  kind: K,
): Schema.Struct<
  typeof commonRecordFields & {
    kind: Schema.Literal<[K]>
    arguments: Schemas[K]["arguments"]
    result: Schema.optional<Schemas[K]["result"]>
  }
> =>
  Schema.Struct({
    ...commonRecordFields,
    kind: Schema.Literal(kind),
    arguments: commandSchemas[kind].arguments as Schemas[K]["arguments"],
    result: Schema.optional(commandSchemas[kind].result as Schemas[K]["result"]),
  })

/**
 * A command record as the API returns it; `sequence` increases per run and orders the run's
 * commands; `result` is present once the machine answered.
 */
export const CommandRecord = Schema.Union(
  record("bash"),
  record("read"),
  record("write"),
  record("edit"),
  record("list"),
  record("put"),
  record("get"),
  record("finish"),
  record("terminal"),
).annotations({ identifier: "CommandRecord" })
export type CommandRecord = typeof CommandRecord.Type

/**
 * What KV `commands` keeps under `<run>.id.<command>`: the sequence a command id was given. The run
 * actor writes it before the record, so a command added again (a retried ask, a resumed agent) finds
 * its sequence, and a reader finds a command by id, without the actor keeping every id.
 */
export const CommandIndex = Schema.Struct({ sequence: IntAtLeast(1) })
export type CommandIndex = typeof CommandIndex.Type

/** A long-poll `wait` query parameter: 0 to 25 seconds. */
export const WaitSeconds = Schema.NumberFromString.pipe(
  Schema.filter(
    (n) =>
      (Number.isInteger(n) && n >= 0 && n <= waitMaxSeconds) ||
      `must be an integer from 0 to ${waitMaxSeconds}`,
  ),
).annotations({
  description: `Seconds to wait, 0 to ${waitMaxSeconds}: the answer comes as soon as there is one to give, or once they have passed.`,
})

const NonNegativeIntFromString = Schema.NumberFromString.pipe(
  Schema.filter((n) => (Number.isSafeInteger(n) && n >= 0) || "must be a non-negative integer"),
)

/** The query of `GET /v1/runs/{id}/commands/{cid}`. */
export const GetCommandQuery = Schema.Struct({ wait: Schema.optional(WaitSeconds) })
/**
 * The query of `POST /v1/runs/{id}/commands` (beyond the spec, which is silent on it): with `wait`,
 * the answer is the command once it has ended, or as it is when the time is up (one request
 * instead of a create and a `GET …?wait=`).
 */
export const CreateCommandQuery = Schema.Struct({
  wait: Schema.optional(WaitSeconds).annotations({
    description: `Seconds to wait for the command's end, 0 to ${waitMaxSeconds}: the answer (still 201) is the command once it has ended, or as it is when they have passed.`,
  }),
})
/** The query of `GET /v1/runs/{id}/commands`: commands changed after sequence `since`. */
export const ListCommandsQuery = Schema.Struct({
  since: Schema.optional(NonNegativeIntFromString).annotations({
    description: "The `sequence` of the last read: commands changed after it.",
  }),
  wait: Schema.optional(WaitSeconds),
})
/** The query of `GET /v1/runs/{id}/commands/{cid}/output`: output from byte offset `after`. */
export const CommandOutputQuery = Schema.Struct({
  after: Schema.optional(NonNegativeIntFromString).annotations({
    description: "The byte offset to read from (the last read's `next`).",
  }),
  wait: Schema.optional(WaitSeconds),
})

/** `GET /v1/runs/{id}/commands`: commands changed after `since`, the run's state, and the next `since`. */
export const CommandList = Schema.Struct({
  commands: Schema.Array(CommandRecord),
  state: RunState,
  sequence: Count,
}).annotations({ identifier: "CommandList" })
export type CommandList = typeof CommandList.Type

/**
 * `GET /v1/runs/{id}/commands/{cid}/output`: at most 512 KiB of output ending on a whole UTF-8
 * character, the offset to read from next, and `done` once the command ended and all kept was read.
 */
export const CommandOutput = Schema.Struct({
  output: Schema.String,
  next: Count,
  output_bytes: Count,
  stored_bytes: Count,
  done: Schema.Boolean,
}).annotations({ identifier: "CommandOutput" })
export type CommandOutput = typeof CommandOutput.Type

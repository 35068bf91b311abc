/**
 * Runs one command record on a machine's guest session and says how it ended (spec, command
 * rule 6): `succeeded` with the kind's result whenever the machine answered, even with a non-zero
 * exit or an `{error}` result; `failed` with `error` when the command could not run (the guest
 * unavailable, arguments the guest refuses, the upload store unreachable). Interrupting the effect
 * cancels the command: a `bash` command's processes are killed by the guest session, and its
 * output stream still gets its done marker.
 *
 * `finish` and `terminal` are not machine commands: the run's machine handles `finish`
 * (`host-agent/runs/RunMachine.ts`), the relay the terminal; they fail with `HandledElsewhere`.
 */
import { posix } from "node:path"
import { Data, Effect, Either, Schema } from "effect"
import type { ParseError } from "effect/ParseResult"
import type { Nats } from "../../core/Nats.ts"
import type { ObjectInfo, ObjectStore } from "../../core/ObjectStore.ts"
import type { SealStream } from "../../core/SealStream.ts"
import type { Storage } from "../../core/Storage.ts"
import { type CommandRecord, type CommandResult, commandSchemas } from "../../schema/Command.ts"
import { fileCommandTimeoutMs } from "../../schema/Limits.ts"
import { type GuestSession, GuestUnavailable, InvalidArguments } from "../guest/GuestSession.ts"
import * as Transfer from "../guest/Transfer.ts"
import * as OutputSink from "./OutputSink.ts"

/** A command kind that is not executed on the machine by the host agent. */
export class HandledElsewhere extends Data.TaggedError("HandledElsewhere")<{
  readonly kind: "finish" | "terminal"
  readonly detail: string
}> {}

/** What the executor needs beyond the guest: where uploads and downloads live, and who owns them. */
export interface CommandContext {
  /** The run's account: uploads are sealed for it, and so is what `get` stores. */
  readonly account: string
  /** The run's environment (the function's variables, secrets opened): under each `bash` command's own `env`. */
  readonly env?: Readonly<Record<string, string>>
  /** The `files` object store (uploads for `put`; `get` stores its file there). */
  readonly files: ObjectStore
  /** A download link valid 15 minutes for an object `get` stored (the gateway's signing). */
  readonly signDownload: (
    object: ObjectInfo,
    as: { readonly kind: "file" | "folder"; readonly filename: string },
  ) => Effect.Effect<string>
  /**
   * How long a file kind (`read`, `write`, `edit`, `list`) may go unanswered before the machine
   * counts as unavailable (default 5 minutes): an SFTP request on a connection that has closed
   * otherwise waits forever.
   */
  readonly fileTimeoutMs?: number
  /** Sink tuning (tests). */
  readonly sink?: OutputSink.SinkOptions
}

/** How a command ended; `cancelled` is reported by whoever interrupted it (see `Dispatcher`). */
export type Outcome =
  | { readonly state: "succeeded"; readonly result: CommandResult }
  | { readonly state: "failed"; readonly error: string }
  | { readonly state: "cancelled" }

// Errors that mean the command could not run, as the `error` text of a failed command.
const describe = (e: { readonly _tag: string; readonly [k: string]: unknown }): string => {
  switch (e._tag) {
    case "GuestUnavailable":
      return `the machine is unavailable: ${String(e.detail)}`
    case "InvalidArguments":
      return `invalid arguments: ${String(e.field)}: ${String(e.detail)}`
    case "NatsError":
      return `storage unavailable: ${String(e.message)}`
    default:
      return `${e._tag}: ${String(e.message ?? e.detail ?? "")}`
  }
}

const failed = (e: { readonly _tag: string }): Outcome => ({ state: "failed", error: describe(e) })
const answered = (result: CommandResult): Outcome => ({ state: "succeeded", result })

// Synchronous decoders, built once per kind (one runs before every command).
const argumentDecoders = new Map<string, (u: unknown) => Either.Either<unknown, ParseError>>()
const decodeArguments = (record: CommandRecord): Either.Either<unknown, InvalidArguments> => {
  let decode = argumentDecoders.get(record.kind)
  if (decode === undefined) {
    decode = Schema.decodeUnknownEither(
      commandSchemas[record.kind].arguments as Schema.Schema<unknown, unknown>,
    )
    argumentDecoders.set(record.kind, decode)
  }
  return Either.mapLeft(
    decode(record.arguments),
    (e) => new InvalidArguments({ field: "arguments", detail: e.message }),
  )
}

/** Default of `CommandContext.fileTimeoutMs` (the run actor counts on it: `Run.ts` command watch). */
export const FILE_TIMEOUT_MS = fileCommandTimeoutMs

/** Executes `record` on `guest`; `bash` output goes to the `OUTPUT` stream as it comes. */
export const execute = (
  guest: GuestSession,
  record: CommandRecord,
  context: CommandContext,
): Effect.Effect<Outcome, HandledElsewhere, Nats | Storage | SealStream> => {
  const fileTimeoutMs = context.fileTimeoutMs ?? FILE_TIMEOUT_MS
  const file = <A, E>(effect: Effect.Effect<A, E>) =>
    effect.pipe(
      Effect.timeoutFail({
        duration: fileTimeoutMs,
        onTimeout: () =>
          new GuestUnavailable({ detail: `no answer from the machine in ${fileTimeoutMs} ms` }),
      }),
    )
  const run = Effect.gen(function* () {
    yield* decodeArguments(record)
    switch (record.kind) {
      case "bash":
        return yield* Effect.acquireUseRelease(
          OutputSink.open(context.account, record.run, record.id, context.sink),
          (sink) => {
            // The done marker is written however the command ends, cancelled included.
            const args =
              context.env === undefined
                ? record.arguments
                : { ...record.arguments, env: { ...context.env, ...record.arguments.env } }
            return guest.bash(args, sink.write).pipe(
              Effect.onExit(() =>
                sink.finish.pipe(
                  Effect.tapError((e) =>
                    Effect.logWarning("command output not fully stored", e).pipe(
                      Effect.annotateLogs({ run: record.run, command: record.id, kind: record.kind }),
                    ),
                  ),
                  Effect.ignore,
                ),
              ),
            )
          },
          (sink) => sink.close,
        )
      case "read":
        return yield* file(guest.read(record.arguments))
      case "write":
        return yield* file(guest.write(record.arguments))
      case "edit":
        return yield* file(guest.edit(record.arguments))
      case "list":
        return yield* file(guest.list(record.arguments))
      case "put":
        return yield* Transfer.put(
          guest,
          { store: context.files, account: context.account },
          record.arguments,
        )
      case "get": {
        const got = yield* Transfer.get(
          guest,
          { store: context.files, account: context.account, name: record.id },
          record.arguments,
        )
        if ("error" in got) return got
        const base = posix.basename(posix.resolve("/workspace", record.arguments.path)) || "root"
        const filename = got.kind === "folder" ? `${base}.tar.gz` : base
        return { download_url: yield* context.signDownload(got.object, { kind: got.kind, filename }) }
      }
      case "finish":
      case "terminal":
        return yield* new HandledElsewhere({
          kind: record.kind,
          detail:
            record.kind === "finish" ? "the run's machine handles finish" : "the relay handles terminals",
        })
    }
  })
  return run.pipe(
    Effect.map((result) => answered(result as CommandResult)),
    Effect.catchAll((e) =>
      e instanceof HandledElsewhere ? Effect.fail(e) : Effect.succeed<Outcome>(failed(e)),
    ),
  )
}

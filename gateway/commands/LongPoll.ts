/**
 * The long-poll parts of the command routes: their settings, the query parameters (`wait` 0 to 25
 * seconds, `since`, `after`), and bounding a wait.
 *
 * A wait is an effect that completes on an event (a KV watch or a stream consumer, never a sleep
 * loop), raced against the caller's `wait`. The server interrupts a request's fiber when its client
 * goes away, which interrupts the wait and closes its watch or consumer.
 */
import { Duration, Effect, Either, type Option, type Schema } from "effect"
import { defineSettings, env } from "../../core/Config.ts"
import { decodeBodyEither } from "../../schema/Decode.ts"
import { ApiError } from "../../schema/Errors.ts"
import { waitMaxSeconds } from "../../schema/Limits.ts"
import type { RawQuery } from "../Router.ts"

/**
 * Settings of the command routes: how long to wait for the run actor's answer
 * (`HANGAR_COMMAND_ASK_TIMEOUT_MS`), how long a cancel waits for the command to end
 * (`HANGAR_COMMAND_CANCEL_WAIT_MS`), the JSON size of one list read (about 4 MiB,
 * `HANGAR_COMMAND_LIST_MAX_BYTES`), and how long a run's records are followed after their last
 * use (a minute, `HANGAR_COMMAND_FOLLOW_IDLE_MS`; `Records.ts`).
 */
export const CommandRouteSettings = defineSettings(
  "hangar/CommandRouteSettings",
  { askTimeoutMs: 10_000, cancelWaitMs: 10_000, listMaxBytes: 4 * 1024 * 1024, followIdleMs: 60_000 },
  (d) => ({
    askTimeoutMs: env.integer("COMMAND_ASK_TIMEOUT_MS", d.askTimeoutMs),
    cancelWaitMs: env.integer("COMMAND_CANCEL_WAIT_MS", d.cancelWaitMs),
    listMaxBytes: env.integer("COMMAND_LIST_MAX_BYTES", d.listMaxBytes),
    followIdleMs: env.integer("COMMAND_FOLLOW_IDLE_MS", d.followIdleMs),
  }),
)

const digits = /^[0-9]+$/

/**
 * Decodes the query parameters a route takes with `schema` (a struct of optional fields); other
 * parameters are ignored. A value that is not plain decimal digits (`1.5`, `-1`, `0x10`, `1e1`,
 * empty) is refused before the schema sees it, so `Number`'s lenient parsing lets nothing odd
 * through; failures are `400 invalid_request` naming the parameter.
 */
export const decodeQuery = <A, I>(
  schema: Schema.Schema<A, I> & { readonly fields: Schema.Struct.Fields },
  raw: RawQuery,
): Either.Either<A, ApiError> => {
  const picked: Record<string, string> = {}
  for (const name of Object.keys(schema.fields)) {
    const value = raw[name]
    if (value === undefined) continue
    if (!digits.test(value))
      return Either.left(
        ApiError.invalidRequest(
          name === "wait"
            ? `wait: must be an integer from 0 to ${waitMaxSeconds}`
            : `${name}: must be a non-negative integer`,
        ),
      )
    picked[name] = value
  }
  // Synchronous (no fiber steps): every long poll decodes its query.
  return decodeBodyEither<A, I>(schema)(picked)
}

/** Runs `event` for at most `limit` (none at once for zero): some value when it came in time. */
export const upTo = <A, E, R>(
  limit: Duration.DurationInput,
  event: Effect.Effect<A, E, R>,
): Effect.Effect<Option.Option<A>, E, R> =>
  Duration.toMillis(Duration.decode(limit)) <= 0 ? Effect.succeedNone : Effect.timeoutOption(event, limit)

/**
 * The access line, one per request, written synchronously: the server answers most requests
 * without a fiber (`Router.Route.now`), and a fiber's `Effect.logInfo` would cost more than the
 * rest of such a request. The line goes to the loggers of the runtime the server was built in,
 * with its minimum level, annotations and clock: what `Effect.logInfo("request", fields)` writes
 * from a fiber of that runtime, `request_id` among the fields.
 */
import { Cause, Effect, FiberId, FiberRef, FiberRefs, Logger, LogLevel } from "effect"

/** The fields of an access line. */
export interface AccessFields {
  readonly request_id: string
  readonly method: string
  readonly route: string
  readonly status: number
  readonly ms: number
  readonly bytes: number
  readonly aborted?: true
}

/** Writes one access line. */
export type AccessLog = (fields: AccessFields) => void

/** The access log of the current runtime (its loggers and settings as they are now). */
export const make: Effect.Effect<AccessLog> = Effect.gen(function* () {
  const refs = yield* Effect.getFiberRefs
  const clock = yield* Effect.clock
  // Not the tracer's logger, which adds a line to the fiber's current span: there is no fiber.
  const loggers = [...FiberRefs.getOrDefault(refs, FiberRef.currentLoggers)].filter(
    (l) => l !== Logger.tracerLogger,
  )
  const annotations = FiberRefs.getOrDefault(refs, FiberRef.currentLogAnnotations)
  const spans = FiberRefs.getOrDefault(refs, FiberRef.currentLogSpan)
  const minimum = FiberRefs.getOrDefault(refs, FiberRef.currentMinimumLogLevel)
  if (LogLevel.greaterThan(minimum, LogLevel.Info)) return () => {}
  return (fields) => {
    const entry = {
      fiberId: FiberId.none,
      logLevel: LogLevel.Info,
      message: ["request", fields],
      cause: Cause.empty,
      context: refs,
      spans,
      annotations,
      date: new Date(clock.unsafeCurrentTimeMillis()),
    }
    for (const logger of loggers) logger.log(entry)
  }
})

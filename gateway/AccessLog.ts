/**
 * The access line, one per request, written synchronously: the server answers most requests
 * without a fiber (`Router.Route.now`), and a fiber's `Effect.logInfo` would cost more than the
 * rest of such a request. The line goes to the loggers of the runtime the server was built in,
 * with its minimum level, annotations and clock, and `request_id` added: exactly what
 * `Effect.logInfo("request", fields)` under `annotateLogs("request_id", id)` writes from a fiber
 * of that runtime.
 */
import { Cause, Effect, FiberId, FiberRef, FiberRefs, HashMap, LogLevel } from "effect"

/** The fields of an access line. */
export interface AccessFields {
  readonly method: string
  readonly route: string
  readonly status: number
  readonly ms: number
  readonly bytes: number
  readonly aborted?: true
}

/** Writes one access line for the request `requestId`. */
export type AccessLog = (requestId: string, fields: AccessFields) => void

/** The access log of the current runtime (its loggers and settings as they are now). */
export const make: Effect.Effect<AccessLog> = Effect.gen(function* () {
  const refs = yield* Effect.getFiberRefs
  const clock = yield* Effect.clock
  const loggers = FiberRefs.getOrDefault(refs, FiberRef.currentLoggers)
  const annotations = FiberRefs.getOrDefault(refs, FiberRef.currentLogAnnotations)
  const spans = FiberRefs.getOrDefault(refs, FiberRef.currentLogSpan)
  const minimum = FiberRefs.getOrDefault(refs, FiberRef.currentMinimumLogLevel)
  if (LogLevel.greaterThan(minimum, LogLevel.Info)) return () => {}
  return (requestId, fields) => {
    const entry = {
      fiberId: FiberId.none,
      logLevel: LogLevel.Info,
      message: ["request", fields],
      cause: Cause.empty,
      context: refs,
      spans,
      annotations: HashMap.set(annotations, "request_id", requestId as unknown),
      date: new Date(clock.unsafeCurrentTimeMillis()),
    }
    for (const logger of loggers) logger.log(entry)
  }
})

/**
 * Running a process's main program: the program runs as one fiber; SIGINT or SIGTERM interrupts
 * it, so every scoped resource (NATS connections, listen sockets, child processes, machines) is
 * released in reverse order of acquisition before the process exits. A second signal while the
 * program is shutting down exits at once with status 130.
 */
import { Cause, Effect, Exit, Fiber } from "effect"

/** Exit status for a program's end: 0 on success or interruption by a signal, 1 on failure. */
const exitCode = <E>(exit: Exit.Exit<unknown, E>): number =>
  Exit.isSuccess(exit) || Cause.isInterruptedOnly(exit.cause) ? 0 : 1

/**
 * What to tell the operator: an expected failure (a tagged error with a message, such as a second
 * start finding the data folder locked) is one line; a defect keeps its full trace.
 */
const describe = <E>(cause: Cause.Cause<E>): string => {
  const failure = Cause.failureOption(cause)
  if (failure._tag === "Some") {
    const error = failure.value as { readonly _tag?: unknown; readonly message?: unknown }
    if (typeof error?.message === "string" && error.message !== "") {
      return `hangar: ${error.message}${typeof error._tag === "string" ? ` (${error._tag})` : ""}`
    }
  }
  return Cause.pretty(cause)
}

/** Runs `program` to completion as the process's main fiber and exits with its status. */
export const runMain = <E>(program: Effect.Effect<unknown, E>): void => {
  const fiber = Effect.runFork(program)
  let signalled = false
  const onSignal = () => {
    if (signalled) process.exit(130)
    signalled = true
    Effect.runFork(Fiber.interrupt(fiber))
  }
  process.on("SIGINT", onSignal)
  process.on("SIGTERM", onSignal)
  fiber.addObserver((exit) => {
    process.off("SIGINT", onSignal)
    process.off("SIGTERM", onSignal)
    if (Exit.isFailure(exit) && !Cause.isInterruptedOnly(exit.cause))
      process.stderr.write(`${describe(exit.cause)}\n`)
    process.exit(exitCode(exit))
  })
}

/**
 * How a CLI command ends badly, and the exit status each way has (spec "Command-line tool"):
 * 1 the run failed, 2 a wrong command (usage printed), 3 the API refused (its `code` and message
 * printed), 4 anything else. `exec` exits with the command's own status, or 125 when it could not
 * be run (`ExecFailed`).
 */

/** The command line is wrong: exit 2, with the command's usage. */
export class UsageError extends Error {
  constructor(
    message: string,
    readonly usage?: string,
  ) {
    super(message)
  }
}

/** The API answered with an error body: exit 3, printing its `code` and message. */
export class ApiRefused extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    readonly detail: string,
  ) {
    super(`${code}: ${detail}`)
  }
}

/** The run (or login) ended badly: exit 1. */
export class RunFailed extends Error {}

/** `exec`: the command could not be run: exit 125. */
export class ExecFailed extends Error {}

/** Exit with a status of its own (`exec`, `shell`), after printing nothing more. */
export class ExitWith extends Error {
  constructor(readonly status: number) {
    super(`exit ${status}`)
  }
}

/** The exit status of a failure (4 for anything not named here). */
export const exitStatusOf = (e: unknown): number =>
  e instanceof UsageError
    ? 2
    : e instanceof ApiRefused
      ? 3
      : e instanceof RunFailed
        ? 1
        : e instanceof ExecFailed
          ? 125
          : e instanceof ExitWith
            ? e.status
            : 4

/**
 * Runs a function's setup commands before the agent: each in its own `bash -euo pipefail -c`, as
 * root in `/workspace`, with the function's environment, one after another. Each command runs
 * through the session's `bash` kind, so its output is kept the same way (first and last 16 KiB and
 * the byte count), and interrupting setup (the run's timeout) kills the running command's processes.
 * The first command that exits non-zero (or times out) stops setup; the result names it, and
 * `failureDetail` turns it into the run's `setup` failure detail.
 */
import { Effect } from "effect"
import { quote } from "./Channel.ts"
import {
  BASH_MAX_TIMEOUT_MS,
  type GuestSession,
  type GuestUnavailable,
  type InvalidArguments,
} from "./GuestSession.ts"

/** What one setup command did. */
export interface SetupStep {
  readonly command: string
  readonly exit_code: number
  /** The first and last 16 KiB of its output (stdout and stderr together). */
  readonly output: string
  readonly output_bytes: number
  readonly truncated: boolean
  readonly timed_out: boolean
  readonly oom_killed: boolean
  /** ISO times. */
  readonly started_at: string
  readonly ended_at: string
}

/** The steps run, in order; `failed` is the index of the step that stopped setup, when one did. */
export interface SetupResult {
  readonly steps: ReadonlyArray<SetupStep>
  readonly failed?: number
}

/** Runs `commands` in order with `env`, stopping at the first failure; each command may run `timeoutMs`. */
export const run = (
  guest: GuestSession,
  commands: ReadonlyArray<string>,
  options: { readonly env?: Readonly<Record<string, string>>; readonly timeoutMs?: number } = {},
): Effect.Effect<SetupResult, GuestUnavailable | InvalidArguments> =>
  Effect.gen(function* () {
    const steps: Array<SetupStep> = []
    for (const command of commands) {
      const started_at = new Date().toISOString()
      const r = yield* guest.bash({
        command: `exec /bin/bash -euo pipefail -c ${quote(command)}`,
        timeout_ms: options.timeoutMs ?? BASH_MAX_TIMEOUT_MS,
        ...(options.env === undefined ? {} : { env: options.env }),
      })
      steps.push({
        command,
        exit_code: r.exit_code,
        output: r.output,
        output_bytes: r.output_bytes,
        truncated: r.truncated,
        timed_out: r.timed_out,
        oom_killed: r.oom_killed,
        started_at,
        ended_at: new Date().toISOString(),
      })
      if (r.exit_code !== 0 || r.timed_out) return { steps, failed: steps.length - 1 }
    }
    return { steps }
  }).pipe(Effect.withSpan("Setup.run"))

/** The run's `setup` failure detail for a failed setup: which command, how it ended, and its output. */
export const failureDetail = (result: SetupResult): string | undefined => {
  if (result.failed === undefined) return undefined
  const step = result.steps[result.failed]
  if (!step) return undefined
  const how = step.timed_out
    ? "timed out"
    : step.oom_killed
      ? `ran out of memory (exit ${step.exit_code})`
      : `exited ${step.exit_code}`
  const shown = step.command.length > 500 ? `${step.command.slice(0, 500)}…` : step.command
  return `setup command ${result.failed + 1} ${how}: ${shown}\n${step.output}`
}

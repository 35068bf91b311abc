/**
 * Settings of the run actor (`HANGAR_RUN_*`). Both are lengths of time the spec fixes (15 minutes
 * to start, a billing minute of 60 seconds); they are settings so tests can run the timers in
 * seconds. Every worker of one deployment must use the same values.
 */
import { defineSettings, env } from "../../core/Config.ts"

export interface RunSettingsShape {
  /** How long a run may stay queued before it fails with `infrastructure` (default 15 minutes). */
  readonly queueTimeoutMs: number
  /**
   * The length of one minute for billing and `timeout_minutes` (default 60,000): a run is charged
   * per started `minuteMs` and times out after `timeout_minutes × minuteMs`.
   */
  readonly minuteMs: number
  /**
   * How long past a command's own timeout (from when the machine was ready) the run actor waits for
   * its host to report its end before failing it (default 60 s).
   */
  readonly commandGraceMs: number
}

/** The run actor's settings. */
export const RunSettings = defineSettings(
  "hangar/RunSettings",
  { queueTimeoutMs: 15 * 60_000, minuteMs: 60_000, commandGraceMs: 60_000 } as RunSettingsShape,
  (d) => ({
    queueTimeoutMs: env.integer("RUN_QUEUE_TIMEOUT_MS", d.queueTimeoutMs),
    minuteMs: env.integer("RUN_MINUTE_MS", d.minuteMs),
    commandGraceMs: env.integer("RUN_COMMAND_GRACE_MS", d.commandGraceMs),
  }),
)

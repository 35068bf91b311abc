/**
 * Settings of the runs a host agent holds (`HANGAR_RUN_*`). Every long interval is a setting so
 * tests can use short ones.
 */
import { defineSettings, env } from "../../core/Config.ts"

export interface RunSettingsShape {
  /** How often a waiting run log is written as a part (spec: at least every 30 s while running). */
  readonly logFlushMs: number
  /**
   * How long ending a run waits for its commands' last records (cancelled) before it destroys the
   * machine anyway; the run actor marks what is left `cancelled`.
   */
  readonly endGraceMs: number
  /**
   * A command still working this long after it started is written `running` (with its real
   * `started_at`); one that ends sooner goes straight from `queued` to its end, one write instead
   * of two. The spec names no state between `queued` and the end.
   */
  readonly runningAfterMs: number
  /**
   * How long a `finish` with `succeeded` waits for the commands sent before it to end before it
   * judges the output anyway: work sent just before a finish is seen (a `write` or a short `bash`
   * ends well within it), and a long command cannot hold the run. If the output is accepted, the
   * run ends and what still runs is cancelled (the spec's command rule 6).
   */
  readonly finishWaitMs: number
}

/** The runs' settings. */
export const RunSettings = defineSettings(
  "host-agent/RunSettings",
  { logFlushMs: 30_000, endGraceMs: 10_000, runningAfterMs: 50, finishWaitMs: 5_000 } as RunSettingsShape,
  (d) => ({
    logFlushMs: env.integer("RUN_LOG_FLUSH_MS", d.logFlushMs),
    endGraceMs: env.integer("RUN_END_GRACE_MS", d.endGraceMs),
    runningAfterMs: env.integer("RUN_RUNNING_AFTER_MS", d.runningAfterMs),
    finishWaitMs: env.integer("RUN_FINISH_WAIT_MS", d.finishWaitMs),
  }),
)

/**
 * Settings of webhook delivery (`HANGAR_WEBHOOK_*`).
 *
 * - `attemptDelaysMs` (`HANGAR_WEBHOOK_ATTEMPT_DELAYS_MS`, comma list): when each attempt is made,
 *   measured from the previous one (the first from `Deliver`); default at once, after 1 minute,
 *   after 10 minutes. Its length is the number of attempts.
 * - `answerTimeoutMs` (`HANGAR_WEBHOOK_ANSWER_TIMEOUT_MS`): how long one attempt may take, from
 *   resolving the host to the response's status line; default 10 seconds.
 * - `caFile` (`HANGAR_WEBHOOK_CA_FILE`): a PEM file of extra certificate authorities trusted beside
 *   the system's (a test receiver with a self-signed certificate); empty = none.
 * - `allowPrivateTargets` (`HANGAR_WEBHOOK_ALLOW_PRIVATE`): deliver to non-public addresses too.
 *   For tests with a receiver on loopback; the production launcher never sets it.
 */
import { Config } from "effect"
import { defineSettings, env } from "../../core/Config.ts"
import { webhookAnswerTimeoutMs, webhookAttemptDelaysMs } from "../../schema/Limits.ts"

export interface WebhookSettingsShape {
  readonly attemptDelaysMs: ReadonlyArray<number>
  readonly answerTimeoutMs: number
  readonly caFile: string
  readonly allowPrivateTargets: boolean
}

const delays = (fallback: ReadonlyArray<number>) =>
  Config.array(Config.integer()).pipe(
    Config.validate({
      message: "a non-empty comma-separated list of non-negative milliseconds",
      validation: (list) => list.length > 0 && list.every((n) => n >= 0),
    }),
    Config.nested("HANGAR_WEBHOOK_ATTEMPT_DELAYS_MS"),
    Config.withDefault(fallback),
  )

/** Webhook delivery settings. */
export const WebhookSettings = defineSettings(
  "actors/WebhookSettings",
  {
    attemptDelaysMs: webhookAttemptDelaysMs,
    answerTimeoutMs: webhookAnswerTimeoutMs,
    caFile: "",
    allowPrivateTargets: false,
  } as WebhookSettingsShape,
  (d) => ({
    attemptDelaysMs: delays(d.attemptDelaysMs),
    answerTimeoutMs: env.integer("WEBHOOK_ANSWER_TIMEOUT_MS", d.answerTimeoutMs),
    caFile: env.string("WEBHOOK_CA_FILE", d.caFile),
    allowPrivateTargets: env.boolean("WEBHOOK_ALLOW_PRIVATE", d.allowPrivateTargets),
  }),
)

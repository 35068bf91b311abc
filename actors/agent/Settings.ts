/**
 * Settings of the agent loops (`HANGAR_AGENT_*`).
 *
 * - `leaseMs` / `renewMs` (`HANGAR_AGENT_LEASE_MS`, `HANGAR_AGENT_RENEW_MS`): how long a loop's
 *   lease lasts without renewal, and how often its worker renews it and looks for agent runs no
 *   live worker holds. A dead worker's loops resume elsewhere about `leaseMs` after it died.
 * - `retryBaseMs` / `retryMaxMs`: backoff of a vendor call that failed `VendorUnavailable`, doubled
 *   per attempt up to the maximum; the loop keeps trying until the run's own timeout ends it.
 * - `toolAnswerMaxBytes`: the largest custom-tool answer kept (a larger one is the tool's error).
 * - `toolAllowPrivate` (`HANGAR_AGENT_TOOL_ALLOW_PRIVATE`): call custom tools on non-public
 *   addresses too. For tests with a tool on loopback; the production launcher never sets it.
 * - `toolCaFile` (`HANGAR_AGENT_TOOL_CA_FILE`): a PEM file of extra certificate authorities for
 *   custom tools (a test tool with a self-signed certificate); empty = none.
 * - `remind` (`HANGAR_AGENT_REMIND`): when the model stops talking without `submit_result`, send it
 *   one reminder before failing the run `no_submission` (default on).
 */
import { defineSettings, env } from "../../core/Config.ts"

export interface AgentSettingsShape {
  readonly leaseMs: number
  readonly renewMs: number
  readonly retryBaseMs: number
  readonly retryMaxMs: number
  readonly toolAnswerMaxBytes: number
  readonly toolAllowPrivate: boolean
  readonly toolCaFile: string
  readonly remind: boolean
}

/** The agent loops' settings. */
export const AgentSettings = defineSettings(
  "actors/AgentSettings",
  {
    leaseMs: 10_000,
    renewMs: 3_333,
    retryBaseMs: 1_000,
    retryMaxMs: 30_000,
    toolAnswerMaxBytes: 1024 * 1024,
    toolAllowPrivate: false,
    toolCaFile: "",
    remind: true,
  } as AgentSettingsShape,
  (d) => ({
    leaseMs: env.integer("AGENT_LEASE_MS", d.leaseMs),
    renewMs: env.integer("AGENT_RENEW_MS", d.renewMs),
    retryBaseMs: env.integer("AGENT_RETRY_BASE_MS", d.retryBaseMs),
    retryMaxMs: env.integer("AGENT_RETRY_MAX_MS", d.retryMaxMs),
    toolAnswerMaxBytes: env.integer("AGENT_TOOL_ANSWER_MAX_BYTES", d.toolAnswerMaxBytes),
    toolAllowPrivate: env.boolean("AGENT_TOOL_ALLOW_PRIVATE", d.toolAllowPrivate),
    toolCaFile: env.string("AGENT_TOOL_CA_FILE", d.toolCaFile),
    remind: env.boolean("AGENT_REMIND", d.remind),
  }),
)

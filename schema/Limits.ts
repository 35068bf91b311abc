/**
 * Every number of the spec's Limits table (and the other limits stated in its text), named once.
 * Schemas use them to refuse requests; the services that enforce the rest (billing, retention,
 * output keeping) import them from here.
 *
 * Units are in the names. "KiB/MiB/GiB" are powers of 1024; "GB" (uploads, input `max_bytes`) is
 * 10^9, as the spec writes them differently.
 */

const KiB = 1024
const MiB = 1024 * KiB
const GiB = 1024 * MiB
const MINUTE_MS = 60_000
const DAY_MS = 24 * 60 * MINUTE_MS

/**
 * Prompt: at most 131072 characters. The Limits table says "128 KiB" but the run-start rule says
 * "at most 131072 chars"; we count characters (UTF-16 code units, JavaScript's `length`) as the
 * rule for the request field does, so a prompt in a non-Latin script is not cut to a third.
 */
export const promptMaxChars = 131_072
/** System prompt: at most 64 KiB, counted in UTF-8 bytes. */
export const systemPromptMaxBytes = 64 * KiB
/** Setup: at most 64 commands. */
export const setupMaxCommands = 64
/** Setup: each command at most 16 KiB (UTF-8 bytes). */
export const setupCommandMaxBytes = 16 * KiB
/** Environment: at most 64 variables. */
export const environmentMaxVariables = 64
/** Environment: a plain value up to 64 KiB (UTF-8 bytes). */
export const envValueMaxBytes = 64 * KiB
/** Environment: a secret value up to 4 KiB (UTF-8 bytes). */
export const envSecretMaxBytes = 4 * KiB
/** Environment variable names: our own bound (the spec sets none), long enough for any real name. */
export const envNameMaxChars = 256
/** The prefix the service reserves for its own variables. */
export const reservedEnvPrefix = "SERVICE_"
/** Custom tools: at most 16 per function. */
export const customToolsMax = 16
/** Custom tool timeout: 1 to 600 seconds, 30 when left out. */
export const customToolTimeoutMinSeconds = 1
export const customToolTimeoutMaxSeconds = 600
export const customToolTimeoutDefaultSeconds = 30
/** Custom tool secret: the spec sets no bound; we take the env secret's 4 KiB. */
export const customToolSecretMaxBytes = 4 * KiB
/** Custom tool description: the spec sets no bound; ours keeps a tool list readable. */
export const customToolDescriptionMaxBytes = 4 * KiB
/** Custom tool `parameters`: our bound on its JSON size (it is sent to the model on every call). */
export const customToolParametersMaxBytes = 64 * KiB
/** Custom tool URL: our bound. */
export const urlMaxChars = 2048
/** Manifests: at most 64 entries each. */
export const manifestMaxEntries = 64
/** Manifest entry description: at most 2000 UTF-8 bytes. */
export const manifestDescriptionMaxBytes = 2000
/** Manifest paths: our bound (Linux PATH_MAX). */
export const manifestPathMaxBytes = 4096
/** Input manifest `max_bytes` when left out: 5 GB. */
export const inputMaxBytesDefault = 5_000_000_000
/** Output manifest `max_bytes` when left out, and the most `/workspace/out` may hold: 50 GiB. */
export const outputMaxBytes = 50 * GiB
/** Upload: at most 5 GB. */
export const uploadMaxBytes = 5_000_000_000
/** `output.files`: at most 1000 listed; `file_count` counts all. */
export const outputFilesMax = 1000
/** `timeout_minutes`: 1 to 1440, 30 when left out. */
export const timeoutMinutesMin = 1
export const timeoutMinutesMax = 1440
export const timeoutMinutesDefault = 30
/** A run not started within 15 minutes fails with `infrastructure`. */
export const runStartWaitMs = 15 * MINUTE_MS
/** `external_reference`: at most 256 UTF-8 bytes. */
export const externalReferenceMaxBytes = 256
/** Function and provider names: 1 to 40 characters. */
export const nameMaxChars = 40
/** Output link and command `get` link: valid 15 minutes. */
export const linkValidMs = 15 * MINUTE_MS
/** Command `get`: a file or folder up to 5 GiB. */
export const getMaxBytes = 5 * GiB
/** Command arguments: at most 128 KiB of JSON (UTF-8 bytes of the serialized `arguments`). */
export const commandArgumentsMaxBytes = 128 * KiB
/** Command `bash` timeout: default 5 minutes, at most 24 hours. */
export const bashTimeoutDefaultMs = 5 * MINUTE_MS
export const bashTimeoutMaxMs = 24 * 60 * MINUTE_MS
/** A file command (`read`, `write`, `edit`, `list`) unanswered by the machine this long fails. */
export const fileCommandTimeoutMs = 5 * MINUTE_MS
/** `bash` result: the first and the last 16 KiB of the output (DESIGN.md). */
export const bashResultHeadBytes = 16 * KiB
export const bashResultTailBytes = 16 * KiB
/** Command output kept: the first 4 MiB per command. */
export const commandOutputKeptBytes = 4 * MiB
/** One command output read: at most 512 KiB, ending on a whole UTF-8 character. */
export const outputReadMaxBytes = 512 * KiB
/** One command list read: about 4 MiB. */
export const commandListReadBytes = 4 * MiB
/** Long-poll `wait`: 0 to 25 seconds. */
export const waitMaxSeconds = 25
/** `list` command: at most 1000 entries. */
export const listMaxEntries = 1000
/** Image read: at most 3.75 MiB and 2000 pixels a side. */
export const imageMaxBytes = 3.75 * MiB
export const imageMaxSide = 2000
/** Terminal: a frame holds at most 32 KiB; the relay waits 2 minutes for the caller's end. */
export const terminalFrameMaxBytes = 32 * KiB
export const terminalCallerWaitMs = 2 * MINUTE_MS
/** Terminal rows and columns: our bound (they travel as 16-bit numbers in resize frames). */
export const terminalMaxSide = 65_535
/** Webhooks: attempts at once, after 1 minute, after 10 minutes. */
export const webhookAttemptDelaysMs = [0, MINUTE_MS, 10 * MINUTE_MS] as const
/** Webhooks: the receiver answers within 10 seconds. */
export const webhookAnswerTimeoutMs = 10_000
/** Webhooks: signature timestamp tolerance, 5 minutes. */
export const webhookToleranceMs = 5 * MINUTE_MS
/** Runs, inputs, outputs, logs: kept 30 days. */
export const retentionMs = 30 * DAY_MS
/** Invites last 7 days. */
export const inviteValidMs = 7 * DAY_MS
/** A CLI login must be approved within 10 minutes. */
export const cliLoginValidMs = 10 * MINUTE_MS
/** Credit purchase: $5 to $500, in cents. */
export const checkoutMinCents = 500
export const checkoutMaxCents = 50_000
/** Overdraft: running runs stop when the balance is more than $10 below the minimum. */
export const overdraftUsdNanos = 10_000_000_000
/** Running runs stop within 5 minutes of an overdraft or a suspension. */
export const stopWithinMs = 5 * MINUTE_MS
/** Run listing page: 50 runs. */
export const runPageSize = 50
/** A host runs VMs with at most 14 vCPUs in all (default; configurable). */
export const hostVcpuBudget = 14
/** New network connections from a machine: 200 per second. */
export const newConnectionsPerSecond = 200
/** Compute price: $0.15 per GiB-hour, in billionths of a dollar. */
export const computeRateUsdNanosPerGibHour = 150_000_000
/** Model `compact_at_tokens`: at least 8000; at least 50000 for `anthropic`; the CLI uses 200000. */
export const compactAtTokensMin = 8000
export const compactAtTokensMinAnthropic = 50_000
export const compactAtTokensDefault = 200_000

/** A machine size's resources. */
export interface SizeSpec {
  readonly vcpus: number
  readonly memoryMib: number
  readonly diskBytes: number
}

/** The machine sizes: vCPUs, memory and the `/workspace` disk. */
export const sizes = {
  s: { vcpus: 1, memoryMib: 2 * 1024, diskBytes: 16 * GiB },
  m: { vcpus: 2, memoryMib: 4 * 1024, diskBytes: 32 * GiB },
  l: { vcpus: 4, memoryMib: 8 * 1024, diskBytes: 64 * GiB },
  xl: { vcpus: 8, memoryMib: 16 * 1024, diskBytes: 128 * GiB },
} as const satisfies Record<string, SizeSpec>

/**
 * The price of one started minute of a size, in billionths of a dollar: memory GiB × the hourly
 * rate / 60 (`s` 5_000_000 = $0.005, `xl` 40_000_000 = $0.04).
 */
export const minutePriceUsdNanos = (memoryMib: number, rate = computeRateUsdNanosPerGibHour): number =>
  Math.ceil((memoryMib * rate) / (1024 * 60))

/** A vendor API key sent to `/v1/providers` or `/v1/catalog`: our bound, far above real keys. */
export const vendorKeyMaxBytes = 4 * 1024
/** Names of keys and CLI logins: our bound. */
export const labelMaxBytes = 256
/** E-mail addresses: at most 254 characters (RFC 5321 path limit). */
export const emailMaxChars = 254

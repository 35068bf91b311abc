/**
 * Sending a command to a run and waiting for its end: the create itself waits
 * (`POST …/commands?wait=25`: one request for a command that ends within it), then
 * `GET …/commands/{cid}?wait=25`, again until it ends.
 */
import type { Api } from "./Api.ts"

/** A command record (the fields the CLI reads). */
export interface CommandRecord {
  readonly id: string
  readonly kind: string
  readonly state: string
  readonly sequence: number
  readonly result?: Record<string, unknown>
  readonly error?: string
}

const ENDED = new Set(["succeeded", "failed", "cancelled"])

/** Whether the command has ended. */
export const ended = (c: CommandRecord): boolean => ENDED.has(c.state)

/** Sends `kind` with `args` to `run`; answers the record as created, or once ended within `wait` seconds. */
export const send = (
  api: Api,
  run: string,
  kind: string,
  args: Record<string, unknown>,
  wait = 0,
): Promise<CommandRecord> =>
  api.call<CommandRecord>(
    "POST",
    `/v1/runs/${encodeURIComponent(run)}/commands`,
    { kind, arguments: args },
    wait === 0 ? {} : { query: { wait } },
  )

/** Waits for the command to end; answers its final record. */
export const awaitEnd = async (
  api: Api,
  run: string,
  command: CommandRecord,
  signal?: AbortSignal,
): Promise<CommandRecord> => {
  let record = command
  while (!ended(record))
    record = await api.call<CommandRecord>(
      "GET",
      `/v1/runs/${encodeURIComponent(run)}/commands/${encodeURIComponent(record.id)}`,
      undefined,
      { query: { wait: 25 }, ...(signal ? { signal } : {}) },
    )
  return record
}

/** Sends a command and waits for its end. */
export const sendAndWait = async (
  api: Api,
  run: string,
  kind: string,
  args: Record<string, unknown>,
): Promise<CommandRecord> => awaitEnd(api, run, await send(api, run, kind, args, 25))

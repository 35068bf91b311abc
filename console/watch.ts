/**
 * Live runs through the API's long-poll: `GET /v1/runs/{id}/commands?since=N&wait=25` answers as
 * soon as a command of the run changes or the run's state changes (or after 25 s with nothing),
 * so a page learns of changes when they happen, with one open request per run it watches.
 */
import { aborted, api, type Json } from "./api.ts"

/** One answer of the long-poll: the changed commands, the run's state, the next `since`. */
export interface Change {
  readonly commands: ReadonlyArray<Json>
  readonly state: string
  readonly sequence: number
}

const ended = (state: string) => state === "succeeded" || state === "failed"

/**
 * Calls `onChange` with every answer, from the first (everything so far), until the run has ended
 * (that answer included) or `signal` aborts. A failed request is tried again after a pause that
 * grows to 30 s.
 */
export const watchRun = async (id: string, onChange: (change: Change) => void, signal: AbortSignal) => {
  let since = 0
  let first = true
  let pause = 1000
  while (!signal.aborted) {
    try {
      const answer = (await api(
        "GET",
        `/v1/runs/${encodeURIComponent(id)}/commands?since=${since}&wait=${first ? 0 : 25}`,
        undefined,
        { signal },
      )) as Change
      first = false
      pause = 1000
      since = answer.sequence
      onChange(answer)
      if (ended(answer.state)) return
    } catch (e) {
      if (aborted(e) || signal.aborted) return
      await new Promise((r) => setTimeout(r, pause))
      pause = Math.min(pause * 2, 30_000)
    }
  }
}

/** Whether a run state is an end. */
export const isEnded = ended

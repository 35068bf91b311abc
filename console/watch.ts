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
 * grows to 30 s. Costs one open request and one run read per change (or per 25 s of quiet).
 */
export const watchRun = async (id: string, onChange: (change: Change) => void, signal: AbortSignal) => {
  const path = (since: number, wait: number) =>
    `/v1/runs/${encodeURIComponent(id)}/commands?since=${since}&wait=${wait}`
  let since = 0
  let state = ""
  let pause = 1000
  while (!signal.aborted) {
    try {
      let answer: Change
      if (state === "") answer = await api("GET", path(since, 0), undefined, { signal })
      else {
        // The long-poll waits for a state other than the one it reads as it starts, so a run that
        // changed since the last answer (a finish handled in between) would leave it waiting the
        // whole 25 s: the run is read once beside it, and a change seen there is answered at once.
        const inner = new AbortController()
        const stop = () => inner.abort()
        signal.addEventListener("abort", stop, { once: true })
        try {
          const poll = api("GET", path(since, 25), undefined, { signal: inner.signal }) as Promise<Change>
          poll.catch(() => undefined)
          const run = await api("GET", `/v1/runs/${encodeURIComponent(id)}`, undefined, { signal })
          if (run.state !== state) {
            inner.abort()
            answer = await api("GET", path(since, 0), undefined, { signal })
          } else answer = await poll
        } finally {
          signal.removeEventListener("abort", stop)
        }
      }
      pause = 1000
      since = answer.sequence
      state = answer.state
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

/**
 * The runs of the account, newest first, 50 a page, with the spec's filters (function, state) and
 * paging (`before`), all in the address so a view can be shared and the back button works. The
 * active runs of the page are watched through the long-poll (at most `WATCHED` at once, so the
 * browser keeps connections free for the rest) and redrawn in place when their state changes; the
 * first page is read again every 30 s while it is shown (not a polling loop: one read per 30 s), for runs started elsewhere.
 */
import { useEffect, useState } from "preact/hooks"
import { api, describe, type Json } from "../api.ts"
import { Link, Page, Problem, State } from "../components.tsx"
import { duration, when } from "../format.ts"
import { navigate } from "../router.ts"
import { isEnded, watchRun } from "../watch.ts"

const WATCHED = 4
const REFRESH_MS = 30_000

const seconds = (run: Json): number | undefined => run.usage?.compute?.seconds

export const RunsPage = (props: { readonly query: URLSearchParams }) => {
  const fn = props.query.get("function") ?? ""
  const state = props.query.get("state") ?? ""
  const before = props.query.get("before") ?? ""
  const [runs, setRuns] = useState<ReadonlyArray<Json> | undefined>(undefined)
  const [next, setNext] = useState<string | undefined>(undefined)
  const [functions, setFunctions] = useState<ReadonlyArray<Json>>([])
  const [problem, setProblem] = useState<string | undefined>(undefined)
  const [reads, setReads] = useState(0)

  useEffect(() => {
    api("GET", "/v1/functions")
      .then((a) => setFunctions(a.functions ?? []))
      .catch(() => setFunctions([]))
  }, [])

  // The page's runs; read again every 30 s while on the first page and visible.
  useEffect(() => {
    const controller = new AbortController()
    const params = new URLSearchParams()
    if (fn !== "") params.set("function", fn)
    if (state !== "") params.set("state", state)
    if (before !== "") params.set("before", before)
    api("GET", `/v1/runs?${params}`, undefined, { signal: controller.signal })
      .then((a) => {
        setRuns(a.runs ?? [])
        setNext(a.next)
        setProblem(undefined)
      })
      .catch((e) => {
        if (!controller.signal.aborted) setProblem(describe(e))
      })
    const timer = before === "" ? setTimeout(() => setReads((n) => n + 1), REFRESH_MS) : undefined
    return () => {
      controller.abort()
      if (timer !== undefined) clearTimeout(timer)
    }
  }, [fn, state, before, reads])

  // The page's active runs, watched; a change reads that run again and replaces its row.
  const active = (runs ?? []).filter((r) => !isEnded(r.state)).slice(0, WATCHED)
  const activeIds = active.map((r) => r.id).join(",")
  useEffect(() => {
    if (activeIds === "") return
    const controller = new AbortController()
    for (const id of activeIds.split(",")) {
      let shown = ""
      void watchRun(
        id,
        (change) => {
          if (change.state === shown) return
          shown = change.state
          api("GET", `/v1/runs/${id}`, undefined, { signal: controller.signal })
            .then((run) => setRuns((old) => old?.map((r) => (r.id === run.id ? run : r))))
            .catch(() => undefined)
        },
        controller.signal,
      )
    }
    return () => controller.abort()
  }, [activeIds])

  const setFilter = (name: string, value: string) => {
    const q = new URLSearchParams(props.query)
    if (value === "") q.delete(name)
    else q.set(name, value)
    q.delete("before")
    navigate(`/runs${q.size > 0 ? `?${q}` : ""}`)
  }
  const names = new Map(functions.map((f) => [f.id, f.name]))

  return (
    <Page title="Runs">
      <form class="filters" onSubmit={(e) => e.preventDefault()}>
        <label>
          Function
          <select
            value={fn}
            onChange={(e) => setFilter("function", (e.currentTarget as HTMLSelectElement).value)}
          >
            <option value="">All functions</option>
            {functions.map((f) => (
              <option key={f.id} value={f.id}>
                {f.name}
              </option>
            ))}
          </select>
        </label>
        <label>
          State
          <select
            value={state}
            onChange={(e) => setFilter("state", (e.currentTarget as HTMLSelectElement).value)}
          >
            <option value="">Any state</option>
            <option value="active">Active</option>
            <option value="succeeded">Succeeded</option>
            <option value="failed">Failed</option>
          </select>
        </label>
      </form>
      <Problem text={problem} />
      {runs === undefined ? (
        <p class="loading">Loading…</p>
      ) : runs.length === 0 ? (
        <p class="empty">No runs{fn !== "" || state !== "" ? " match these filters" : " yet"}.</p>
      ) : (
        <div class="table-wrap">
          <table class="runs">
            <thead>
              <tr>
                <th scope="col">Run</th>
                <th scope="col">Function</th>
                <th scope="col">State</th>
                <th scope="col">Created</th>
                <th scope="col">Compute</th>
              </tr>
            </thead>
            <tbody>
              {runs.map((r) => (
                <tr key={r.id} data-run={r.id}>
                  <td>
                    <Link href={`/runs/${r.id}`} class="mono">
                      {r.id}
                    </Link>
                  </td>
                  <td>
                    {names.get(r.function) ?? <span class="mono">{r.function}</span>}{" "}
                    <span class="dim">v{r.version}</span>
                  </td>
                  <td>
                    <State state={r.state} />
                    {r.failure !== undefined ? <span class="dim"> {r.failure}</span> : null}
                  </td>
                  <td>{when(r.created_at)}</td>
                  <td>{seconds(r) === undefined ? "—" : `${r.size} · ${duration(seconds(r)!)}`}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      <nav class="paging" aria-label="Pages">
        {before !== "" ? (
          <button type="button" onClick={() => setFilter("before", "")}>
            Newest
          </button>
        ) : null}
        {next !== undefined ? (
          <button
            type="button"
            onClick={() => {
              const q = new URLSearchParams(props.query)
              q.set("before", next)
              navigate(`/runs?${q}`)
            }}
          >
            Older
          </button>
        ) : null}
      </nav>
    </Page>
  )
}

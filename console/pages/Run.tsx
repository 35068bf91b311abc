/**
 * One run: state, failure, usage and cost, output (file list and download), the commands with
 * their output, and the log. While the run is active the page follows it through the long-poll
 * (`watch.ts`): a state change reads the run again, a command change updates its row, and the log
 * parts written since are fetched; nothing polls on a timer.
 */
import { useEffect, useRef, useState } from "preact/hooks"
import { api, describe, type Json } from "../api.ts"
import { Page, Problem, State } from "../components.tsx"
import { duration, size, usd, when } from "../format.ts"
import { isEnded, watchRun } from "../watch.ts"

/** How often a running run's log is read when nothing else changed (the service stores it every 30 s). */
const LOG_EVERY_MS = 30_000

// The spec's machine sizes' memory, for the compute cost of a run.
const memoryGib: Record<string, number> = { s: 2, m: 4, l: 8, xl: 16 }

/** What the run's compute costs: every started minute at the account's price per GiB-hour. */
const cost = (run: Json, ratePerGibHour: number | undefined): string => {
  const seconds = run.usage?.compute?.seconds
  const gib = memoryGib[run.usage?.compute?.size ?? run.size]
  if (seconds === undefined || gib === undefined || ratePerGibHour === undefined) return "—"
  return usd((Math.ceil(seconds / 60) * gib * ratePerGibHour) / 60)
}

const LogLine = (props: { readonly line: Json }) => {
  const { at, kind, ...rest } = props.line
  return (
    <div class="log-line">
      <span class="dim">{typeof at === "string" ? at.slice(11, 19) : ""}</span>{" "}
      <span class="log-kind">{kind}</span> <span>{JSON.stringify(rest)}</span>
    </div>
  )
}

const CommandRow = (props: { readonly command: Json }) => {
  const c = props.command
  const args = c.arguments ?? {}
  const what = c.kind === "bash" ? args.command : (args.file_path ?? args.path ?? args.state ?? "")
  const result = c.result ?? {}
  return (
    <li class="command" data-command={c.id}>
      <details>
        <summary>
          <span class="mono dim">#{c.sequence}</span> <span class="command-kind">{c.kind}</span>{" "}
          <span class="mono command-what">{String(what ?? "")}</span> <State state={c.state} />
          {result.exit_code !== undefined ? <span class="dim"> exit {result.exit_code}</span> : null}
          <span class="dim"> {c.source}</span>
        </summary>
        {c.error !== undefined ? (
          <p class="problem">{typeof c.error === "string" ? c.error : JSON.stringify(c.error)}</p>
        ) : null}
        {typeof result.output === "string" ? <pre class="output">{result.output}</pre> : null}
        {c.result !== undefined && typeof result.output !== "string" ? (
          <pre class="output">{JSON.stringify(c.result, null, 2)}</pre>
        ) : null}
      </details>
    </li>
  )
}

export const RunPage = (props: { readonly id: string }) => {
  const { id } = props
  const [run, setRun] = useState<Json | undefined>(undefined)
  const [rate, setRate] = useState<number | undefined>(undefined)
  const [commands, setCommands] = useState<ReadonlyArray<Json>>([])
  const [log, setLog] = useState<ReadonlyArray<Json>>([])
  const [problem, setProblem] = useState<string | undefined>(undefined)
  const partsRead = useRef(0)
  const logBox = useRef<HTMLElement>(null)

  useEffect(() => {
    api("GET", "/v1/account")
      .then((a) => setRate(a.compute_rate_usd_nanos_per_gib_hour))
      .catch(() => undefined)
  }, [])

  useEffect(() => {
    const controller = new AbortController()
    const { signal } = controller
    partsRead.current = 0
    let reading = false
    let sawEnd = false
    let again = false
    // Fetches the log parts written since the last read, in order.
    const readLog = async () => {
      if (reading) {
        again = true
        return
      }
      reading = true
      try {
        do {
          again = false
          const { parts } = await api("GET", `/v1/runs/${id}/log`, undefined, { signal })
          for (const url of (parts as Array<string>).slice(partsRead.current)) {
            const res = await fetch(url, { signal, credentials: "same-origin" })
            if (!res.ok) break
            const lines = (await res.text())
              .split("\n")
              .filter((l) => l !== "")
              .map((l) => {
                try {
                  return JSON.parse(l)
                } catch {
                  return { kind: "text", text: l }
                }
              })
            partsRead.current++
            if (lines.some((l) => l.kind === "end")) sawEnd = true
            setLog((old) => [...old, ...lines])
          }
        } while (again && !signal.aborted)
      } catch {
        // The next change reads the log again.
      } finally {
        reading = false
      }
    }
    let shown = ""
    const readRun = () =>
      api("GET", `/v1/runs/${id}`, undefined, { signal })
        .then((r) => {
          setRun(r)
          setProblem(undefined)
        })
        .catch((e) => {
          if (!signal.aborted) setProblem(describe(e))
        })
    // A running run's log is stored in parts every 30 s (HANGAR_RUN_LOG_FLUSH_MS) whether or not a
    // command changed: read what is new at that pace too, until the run ends.
    const logTimer = setInterval(() => {
      if (shown !== "" && !isEnded(shown)) void readLog()
    }, LOG_EVERY_MS)
    void readRun().then(() =>
      watchRun(
        id,
        (change) => {
          if (change.commands.length > 0)
            setCommands((old) => {
              const byId = new Map(old.map((c) => [c.id, c]))
              for (const c of change.commands) byId.set(c.id, c)
              return [...byId.values()].sort((a, b) => a.sequence - b.sequence)
            })
          if (change.state !== shown) {
            shown = change.state
            void readRun()
          }
          void readLog()
        },
        signal,
      ).finally(async () => {
        clearInterval(logTimer)
        // The last part is stored as the run ends, maybe just after its state: read until the
        // log's closing line is there (a few tries, further apart each time).
        for (let pauseMs = 500; pauseMs <= 8000 && !signal.aborted && !sawEnd; pauseMs *= 2) {
          await readLog()
          if (!sawEnd) await new Promise((r) => setTimeout(r, pauseMs))
        }
      }),
    )
    return () => {
      clearInterval(logTimer)
      controller.abort()
    }
  }, [id])

  // The log box follows new lines while it is scrolled to its end.
  useEffect(() => {
    const box = logBox.current
    if (box !== null && box.scrollHeight - box.scrollTop - box.clientHeight < 80)
      box.scrollTop = box.scrollHeight
  }, [log.length])

  if (run === undefined)
    return (
      <Page title={id}>
        {problem !== undefined ? <Problem text={problem} /> : <p class="loading">Loading…</p>}
      </Page>
    )
  const seconds = run.usage?.compute?.seconds
  const model = run.usage?.model
  return (
    <Page title="Run" actions={<State state={run.state} />}>
      <Problem text={problem} />
      <dl class="facts">
        <dt>Id</dt>
        <dd class="mono">{run.id}</dd>
        <dt>Function</dt>
        <dd>
          <span class="mono">{run.function}</span> v{run.version}
        </dd>
        <dt>Size</dt>
        <dd>
          {run.size} · {run.base}
        </dd>
        <dt>Created</dt>
        <dd>{when(run.created_at)}</dd>
        <dt>Started</dt>
        <dd>{when(run.started_at)}</dd>
        <dt>Ended</dt>
        <dd>{when(run.ended_at)}</dd>
        <dt>Compute</dt>
        <dd>
          {seconds === undefined ? "—" : duration(seconds)} · <span data-cost>{cost(run, rate)}</span>
        </dd>
        <dt>Model</dt>
        <dd>
          {model === undefined || model.calls === 0
            ? "—"
            : `${model.calls} calls · ${model.input_tokens} in · ${model.output_tokens} out · ${model.cache_read_tokens} cached · ${model.web_searches} searches`}
        </dd>
        <dt>Output</dt>
        <dd>
          {run.output === undefined ? (
            "—"
          ) : (
            <>
              <a href={run.output.url} download={`${run.id}.tar.gz`} id="download-output">
                Download .tar.gz
              </a>{" "}
              <span class="dim">
                {size(run.output.bytes)}, {run.output.file_count}{" "}
                {run.output.file_count === 1 ? "file" : "files"} ·{" "}
                <span class="mono" title="SHA-256">
                  sha256 {run.output.sha256.slice(0, 12)}…
                </span>
              </span>
            </>
          )}
        </dd>
        {run.external_reference !== undefined ? (
          <>
            <dt>Reference</dt>
            <dd>{run.external_reference}</dd>
          </>
        ) : null}
      </dl>
      {run.failure !== undefined ? (
        <div class="failure" role="status">
          <strong>Failed: {run.failure}</strong>
          {run.detail !== undefined ? <pre>{run.detail}</pre> : null}
        </div>
      ) : null}
      <h2>Prompt</h2>
      <pre class="prompt">{run.prompt}</pre>
      <p>
        {run.state === "running" ? (
          // A page load, not an in-app link: the terminal's page has its own Content-Security-Policy.
          <a class="button" href={`/runs/${run.id}/terminal`} id="open-terminal">
            Open a terminal
          </a>
        ) : (
          // The same box in every state, so nothing below moves when the run starts or ends.
          <span
            class="button disabled"
            aria-disabled="true"
            title="A terminal opens while the run is running"
          >
            Open a terminal
          </span>
        )}
      </p>
      <h2>Log</h2>
      <section class="log" ref={logBox} aria-label="Run log">
        {log.length === 0 ? (
          <p class="empty">Nothing logged yet.</p>
        ) : (
          log.map((l, i) => <LogLine key={i} line={l} />)
        )}
      </section>
      <h2>Commands</h2>
      {commands.length === 0 ? (
        <p class="empty">No commands yet.</p>
      ) : (
        <ul class="commands">
          {commands.map((c) => (
            <CommandRow key={c.id} command={c} />
          ))}
        </ul>
      )}
      {run.output !== undefined ? (
        <>
          <h2>Output files</h2>
          <ul class="files">
            {(run.output.files as Array<Json>).map((f) => (
              <li key={f.path} class="mono">
                {f.path}
                {f.dir ? "" : <span class="dim"> {size(f.bytes)}</span>}
              </li>
            ))}
          </ul>
          {run.output.file_count > run.output.files.length ? (
            <p class="dim">{run.output.file_count} files in all; the first 1,000 are listed.</p>
          ) : null}
        </>
      ) : null}
    </Page>
  )
}

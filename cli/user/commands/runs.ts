/** `run`, `runs`, `show`, `logs`, `output` and `finish`. */

import type { Api } from "../Api.ts"
import { type Command, text } from "../Command.ts"
import { sendAndWait } from "../Commands.ts"
import { ApiRefused, RunFailed, UsageError } from "../Failures.ts"
import { downloadAndUnpack, uploadFolder } from "../Files.ts"
import * as Print from "../Print.ts"
import { functionId } from "../Resolve.ts"

/** A run (the fields the CLI reads). */
interface Run {
  readonly id: string
  readonly function: string
  readonly version: number
  readonly state: string
  readonly base?: string
  readonly size?: string
  readonly provider?: string
  readonly prompt?: string
  readonly created_at?: string
  readonly started_at?: string
  readonly ended_at?: string
  readonly failure?: string
  readonly detail?: string
  readonly message?: string
  readonly external_reference?: string
  readonly output?: {
    readonly sha256: string
    readonly bytes: number
    readonly file_count: number
    readonly url: string
    readonly files?: ReadonlyArray<{ readonly path: string; readonly bytes: number; readonly dir: boolean }>
  }
  readonly usage?: {
    readonly compute?: { readonly size: string; readonly seconds: number }
    readonly model?: Readonly<Record<string, number>>
  }
}

const FINAL = new Set(["succeeded", "failed"])
const runPath = (run: string) => `/v1/runs/${encodeURIComponent(run)}`
const getRun = (api: Api, run: string) => api.call<Run>("GET", runPath(run))

/** A run's failure as one sentence. */
const failureOf = (r: Run) => `${r.id} failed: ${r.failure ?? "unknown"}${r.detail ? `: ${r.detail}` : ""}`

/** One log line for people: time, kind, and its fields in short. */
const logLine = (out: Print.Out, raw: Record<string, unknown>): string => {
  const { at, kind, ...fields } = raw
  const time = typeof at === "string" ? at.slice(11, 19) : "--:--:--"
  const shown = Object.entries(fields)
    .map(([k, v]) => {
      const s = typeof v === "string" ? v : JSON.stringify(v)
      return `${k}=${s.length > 160 ? `${s.slice(0, 157)}…` : s}`
    })
    .join(" ")
    .replace(/\n/g, "⏎")
  return `${Print.dim(out, time)} ${Print.bold(out, String(kind))} ${shown}`
}

/** Prints the log parts after the first `printed`; answers how many parts there are now and whether an `end` line came. */
const printLog = async (api: Api, out: Print.Out, run: string, printed: number) => {
  const { parts } = await api.call<{ parts: Array<string> }>("GET", `${runPath(run)}/log`)
  let sawEnd = false
  for (const url of parts.slice(printed)) {
    const res = await fetch(url)
    if (!res.ok) throw new Error(`log part: the API answered ${res.status}`)
    for (const l of (await res.text()).split("\n")) {
      if (l === "") continue
      let parsed: Record<string, unknown>
      try {
        parsed = JSON.parse(l) as Record<string, unknown>
      } catch {
        continue
      }
      if (parsed.kind === "end") sawEnd = true
      if (out.json) Print.line(JSON.stringify(parsed))
      else Print.line(logLine(out, parsed))
    }
  }
  return { count: Math.max(printed, parts.length), sawEnd }
}

/**
 * Follows `run` until it ends: its state changes (long-polls of its command list, which answer
 * when the state moves) and, with `log`, its log parts as they are written; answers the final run.
 */
const follow = async (api: Api, out: Print.Out, run: string, log: boolean): Promise<Run> => {
  let since = 0
  let printed = 0
  let sawEnd = false
  let last = ""
  const readLog = async () => {
    const read = await printLog(api, out, run, printed)
    printed = read.count
    sawEnd ||= read.sawEnd
  }
  for (;;) {
    const list = await api.call<{ state: string; sequence: number }>(
      "GET",
      `${runPath(run)}/commands`,
      undefined,
      {
        query: { since, wait: 10 },
      },
    )
    since = list.sequence
    if (list.state !== last && !out.json) Print.note(`${run} ${Print.state(out, list.state)}`)
    last = list.state
    if (log) await readLog()
    if (FINAL.has(list.state)) break
  }
  // The last part (with the `end` line) is written as the machine goes, just after the state.
  for (let i = 0; log && !sawEnd && i < 20; i++) {
    await new Promise((r) => setTimeout(r, 250))
    await readLog()
  }
  return getRun(api, run)
}

/** The run's result for people: state, failure, output and usage. */
const summary = (out: Print.Out, r: Run) => {
  const rows: Array<[string, string]> = [
    ["run", r.id],
    ["state", Print.state(out, r.state)],
    ["function", `${r.function} version ${r.version}`],
  ]
  if (r.base) rows.push(["base", r.base])
  if (r.size) rows.push(["size", r.size])
  if (r.provider) rows.push(["provider", r.provider])
  rows.push(["created", Print.when(r.created_at)])
  if (r.started_at) rows.push(["started", Print.when(r.started_at)])
  if (r.ended_at) rows.push(["ended", Print.when(r.ended_at)])
  if (r.failure) rows.push(["failure", Print.red(out, r.failure)])
  if (r.detail) rows.push(["detail", r.detail])
  if (r.message) rows.push(["message", r.message])
  if (r.external_reference) rows.push(["reference", r.external_reference])
  if (r.output)
    rows.push([
      "output",
      `${r.output.file_count} files, ${Print.bytes(r.output.bytes)}, sha256 ${r.output.sha256.slice(0, 12)}`,
    ])
  const compute = r.usage?.compute
  if (compute) rows.push(["compute", `${compute.size}, ${Print.duration(compute.seconds)}`])
  const model = r.usage?.model
  if (model && (model.calls ?? 0) > 0)
    rows.push([
      "model",
      `${model.calls} calls, ${model.input_tokens ?? 0} in, ${model.output_tokens ?? 0} out tokens`,
    ])
  const width = Math.max(...rows.map(([k]) => k.length))
  for (const [k, v] of rows) Print.line(`${Print.dim(out, k.padEnd(width))}  ${v}`)
}

/** Downloads a succeeded run's output into `dir`. */
const fetchOutput = async (out: Print.Out, r: Run, dir: string) => {
  if (r.state !== "succeeded" || !r.output)
    throw new RunFailed(r.state === "failed" ? failureOf(r) : `${r.id} is ${r.state}: it has no output yet`)
  await downloadAndUnpack(out, r.output.url, r.output.sha256, dir)
  if (!out.json) Print.note(`output: ${r.output.file_count} files into ${dir}`)
}

const integer = (flag: string, value: string | undefined): number | undefined => {
  if (value === undefined) return undefined
  if (!/^\d+$/.test(value)) throw new UsageError(`--${flag} must be a whole number: ${value}`)
  return Number(value)
}

export const run: Command = {
  options: {
    prompt: { type: "string" },
    in: { type: "string" },
    out: { type: "string" },
    version: { type: "string" },
    webhook: { type: "string" },
    ref: { type: "string" },
    detach: { type: "boolean" },
  },
  positionals: [1, 1],
  run: async ({ api, out, values, positionals }) => {
    const prompt = text(values, "prompt")
    if (prompt === undefined) throw new UsageError("--prompt is required")
    if (values.detach && text(values, "out") !== undefined)
      throw new UsageError("--out needs the run followed: leave out --detach")
    const version = integer("version", text(values, "version"))
    const fn = await functionId(api, positionals[0] as string)
    const dir = text(values, "in")
    const input = dir === undefined ? undefined : await uploadFolder(api, out, dir)
    const started = await api.call<Run>("POST", `/v1/functions/${encodeURIComponent(fn)}/runs`, {
      prompt,
      ...(input ? { input } : {}),
      ...(version ? { version } : {}),
      ...(text(values, "webhook") ? { webhook: text(values, "webhook") } : {}),
      ...(text(values, "ref") !== undefined ? { external_reference: text(values, "ref") } : {}),
    })
    if (values.detach) return out.json ? Print.json(started) : Print.line(started.id)
    if (!out.json)
      Print.note(
        `${started.id} started (hangar logs ${started.id} --follow; Ctrl-C stops following, not the run)`,
      )
    const ended = await follow(api, out, started.id, !out.json)
    if (out.json) Print.json(ended)
    else summary(out, ended)
    const into = text(values, "out")
    if (ended.state === "failed") throw new RunFailed(failureOf(ended))
    if (into !== undefined) await fetchOutput(out, ended, into)
  },
}

export const runs: Command = {
  options: { function: { type: "string" }, state: { type: "string" }, before: { type: "string" } },
  positionals: [0, 0],
  run: async ({ api, out, values }) => {
    const state = text(values, "state")
    if (state !== undefined && !["active", "succeeded", "failed"].includes(state))
      throw new UsageError(`--state must be active, succeeded or failed: ${state}`)
    const fnRef = text(values, "function")
    const fn = fnRef === undefined ? undefined : await functionId(api, fnRef)
    const page = await api.call<{ runs: Array<Run>; next?: string }>("GET", "/v1/runs", undefined, {
      query: { function: fn, state, before: text(values, "before") },
    })
    if (out.json) return Print.json(page)
    Print.table(
      out,
      ["RUN", "FUNCTION", "STATE", "CREATED", "TOOK", "FAILURE"],
      page.runs.map((r) => [
        r.id,
        `${r.function}@${r.version}`,
        Print.state(out, r.state),
        Print.when(r.created_at),
        r.started_at && r.ended_at
          ? Print.duration((Date.parse(r.ended_at) - Date.parse(r.started_at)) / 1000)
          : "-",
        r.failure ?? "",
      ]),
      "no runs",
    )
    if (page.next) Print.note(`more: hangar runs --before ${page.next}`)
  },
}

export const show: Command = {
  positionals: [1, 1],
  run: async ({ api, out, positionals }) => {
    const r = await getRun(api, positionals[0] as string)
    if (out.json) return Print.json(r)
    summary(out, r)
    for (const f of r.output?.files ?? [])
      Print.line(`  ${f.path}${f.dir ? "/" : ""}  ${f.dir ? "" : Print.bytes(f.bytes)}`)
  },
}

export const logs: Command = {
  options: { follow: { type: "boolean", short: "f" } },
  positionals: [1, 1],
  run: async ({ api, out, values, positionals }) => {
    const id = positionals[0] as string
    if (values.follow) {
      const ended = await follow(api, out, id, true)
      if (ended.state === "failed" && !out.json) Print.note(failureOf(ended))
      return
    }
    // Refused as the run would be (404 for another account's run) before any part is read.
    await getRun(api, id)
    await printLog(api, out, id, 0)
  },
}

export const output: Command = {
  options: { out: { type: "string" } },
  positionals: [1, 1],
  run: async ({ api, out, values, positionals }) => {
    const dir = text(values, "out")
    if (dir === undefined) throw new UsageError("--out DIR is required")
    const r = await getRun(api, positionals[0] as string)
    await fetchOutput(out, r, dir)
    if (out.json) Print.json(r.output)
  },
}

export const finish: Command = {
  options: { failed: { type: "string" } },
  positionals: [1, 1],
  run: async ({ api, out, values, positionals }) => {
    const id = positionals[0] as string
    const reason = text(values, "failed")
    const record = await sendAndWait(
      api,
      id,
      "finish",
      reason === undefined ? { state: "succeeded" } : { state: "failed", detail: reason },
    )
    if (out.json) Print.json(record)
    if (record.state !== "succeeded")
      throw new Error(`finish ${record.state}: ${record.error ?? "no reason given"}`)
    const result = record.result as { accepted?: boolean; problems?: ReadonlyArray<unknown> } | undefined
    if (result?.accepted === false) {
      const problems = (result.problems ?? []).map((p) => (typeof p === "string" ? p : JSON.stringify(p)))
      throw new ApiRefused(
        400,
        "invalid_request",
        `the output does not match the manifest: ${problems.join("; ")}`,
      )
    }
    if (!out.json) Print.line(`${id} finishing as ${reason === undefined ? "succeeded" : "failed"}`)
  },
}

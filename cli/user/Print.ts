/**
 * What the CLI prints for people: short aligned tables, colour only on a terminal without
 * `NO_COLOR`, sizes and times people read. With `--json` a command prints exactly the API's JSON
 * instead (one document; streams print JSON lines). Messages and progress go to stderr, results to
 * stdout, so a pipe gets only the result.
 */

/** How the current command prints. */
export interface Out {
  readonly json: boolean
  /** Whether stderr is a terminal people watch (progress redraws in place). */
  readonly tty: boolean
  readonly color: boolean
}

// Each asked when first read: a command that prints plain lines (`version`) makes neither stream
// nor loads node:tty, about 5–7 ms of its start.
export const outOf = (json: boolean, env: NodeJS.ProcessEnv = process.env): Out => {
  let tty: boolean | undefined
  let color: boolean | undefined
  return {
    json,
    get tty() {
      tty ??= Boolean(process.stderr.isTTY)
      return tty
    },
    get color() {
      color ??= Boolean(process.stdout.isTTY) && !("NO_COLOR" in env && env.NO_COLOR !== "")
      return color
    },
  }
}

const paint = (code: number) => (out: Out, text: string) => (out.color ? `\x1b[${code}m${text}\x1b[0m` : text)
export const bold = paint(1)
export const dim = paint(2)
export const red = paint(31)
export const green = paint(32)
export const yellow = paint(33)

/** A state in its colour. */
export const state = (out: Out, s: string): string =>
  s === "succeeded" ? green(out, s) : s === "failed" ? red(out, s) : s === "running" ? yellow(out, s) : s

/** Prints one line on stdout. */
export const line = (text = ""): void => {
  process.stdout.write(`${text}\n`)
}

/** Prints a message for people on stderr. */
export const note = (text: string): void => {
  process.stderr.write(`${text}\n`)
}

/** Prints `value` as the API gave it (one document). */
export const json = (value: unknown): void => line(JSON.stringify(value, null, 2))

// biome-ignore lint/suspicious/noControlCharactersInRegex: colour codes are what it strips
const visible = (s: string) => s.replace(/\x1b\[[0-9;]*m/g, "").length

/** Prints rows under a header, columns aligned; `empty` when there are none. */
export const table = (
  out: Out,
  header: ReadonlyArray<string>,
  rows: ReadonlyArray<ReadonlyArray<string>>,
  empty: string,
): void => {
  if (rows.length === 0) {
    note(empty)
    return
  }
  const all = [header.map((h) => dim(out, h)), ...rows]
  const widths = header.map((_, i) => Math.max(...all.map((r) => visible(r[i] ?? ""))))
  for (const r of all)
    line(
      r
        .map((cell, i) => (i === r.length - 1 ? cell : cell + " ".repeat((widths[i] ?? 0) - visible(cell))))
        .join("  ")
        .trimEnd(),
    )
}

/** Bytes as people read them (1.5 MB). */
export const bytes = (n: number): string => {
  const units = ["B", "kB", "MB", "GB", "TB"]
  let v = n
  let u = 0
  while (v >= 1000 && u < units.length - 1) {
    v /= 1000
    u++
  }
  // Whole bytes (a rate can be a fraction of one: 46.15 B/s is shown as 46 B/s).
  return `${u === 0 ? Math.round(v) : v.toFixed(v < 10 ? 1 : 0)} ${units[u]}`
}

/** A timestamp (ISO) as a short local date and time, or `-`. */
export const when = (iso: unknown): string => {
  if (typeof iso !== "string" || iso === "") return "-"
  const d = new Date(iso)
  if (Number.isNaN(d.getTime())) return iso
  const pad = (n: number) => String(n).padStart(2, "0")
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
}

/** Seconds as `1m05s`. */
export const duration = (seconds: number): string => {
  if (!Number.isFinite(seconds) || seconds < 0) return "-"
  const s = Math.round(seconds)
  return s < 60
    ? `${s}s`
    : s < 3600
      ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`
      : `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`
}

/** Progress of one transfer: redrawn in place on a terminal, a plain line every 5 s otherwise. */
export interface Progress {
  readonly add: (n: number) => void
  readonly done: () => void
}

export const progress = (out: Out, label: string, expected: number): Progress => {
  const started = Date.now()
  let sent = 0
  // The first plain line comes after 5 s: a short transfer prints its final line only.
  let lastDraw = out.tty && !out.json ? 0 : started
  const render = () => {
    // A total that was estimated (a folder's tar) never reads below what went.
    const total = Math.max(expected, sent)
    const seconds = (Date.now() - started) / 1000
    const rate = seconds > 0 ? sent / seconds : 0
    const eta = rate > 0 && total > sent ? (total - sent) / rate : 0
    const share = total > 0 ? sent / total : 1
    return `${label} ${(share * 100).toFixed(0).padStart(3)}% ${bytes(sent)}/${bytes(total)} ${bytes(rate)}/s ETA ${duration(eta)}`
  }
  const draw = (final: boolean) => {
    const now = Date.now()
    if (out.tty && !out.json) {
      if (!final && now - lastDraw < 100) return
      const width = 24
      const filled = Math.round((expected > 0 ? Math.min(1, sent / expected) : 1) * width)
      process.stderr.write(
        `\r\x1b[2K[${"#".repeat(filled)}${"-".repeat(width - filled)}] ${render()}${final ? "\n" : ""}`,
      )
    } else {
      if (!final && now - lastDraw < 5000) return
      process.stderr.write(`${render()}\n`)
    }
    lastDraw = now
  }
  return {
    add: (n) => {
      sent += n
      draw(false)
    },
    done: () => draw(true),
  }
}

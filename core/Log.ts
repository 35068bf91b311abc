/**
 * Structured logging: one JSON object per line with time, level, message, annotations and spans.
 *
 * A message given as text and a plain object (`Effect.logInfo("handled", { actor, id })`) puts the
 * object's fields on the line beside the annotations.
 *
 * Values marked secret are `Redacted` (effect) values; the logger replaces every one of them,
 * at any depth of a message or annotation, with "<redacted>" before anything is written, so a
 * secret can never reach a log line by accident. Errors are written as their tag and message only.
 */

import type { Layer } from "effect"
import { Cause, List, Logger, Redacted } from "effect"

const REDACTED = "<redacted>"

/** A JSON-safe copy of `value` with every Redacted replaced and cycles cut. */
export const scrub = (value: unknown, seen?: WeakSet<object>): unknown => {
  if (typeof value === "string" || typeof value === "number" || typeof value === "boolean") return value
  if (Redacted.isRedacted(value)) return REDACTED
  if (value === null || typeof value !== "object") {
    if (typeof value === "bigint") return value.toString()
    if (typeof value === "function" || typeof value === "symbol") return String(value)
    return value
  }
  seen ??= new WeakSet()
  if (seen.has(value)) return "[cycle]"
  seen.add(value)
  if (value instanceof Error) {
    const tag = (value as { _tag?: unknown })._tag
    return { error: typeof tag === "string" ? tag : value.name, message: value.message }
  }
  if (value instanceof Date) return value.toISOString()
  if (value instanceof Uint8Array) return `<${value.byteLength} bytes>`
  if (Array.isArray(value)) return value.map((v) => scrub(v, seen))
  const out: Record<string, unknown> = {}
  for (const [k, v] of Object.entries(value)) out[k] = scrub(v, seen)
  return out
}

/** The keys every line starts with, which fields cannot replace. */
const core = { at: true, level: true, msg: true }

const isFields = (value: unknown): value is Record<string, unknown> => {
  if (value === null || typeof value !== "object" || Redacted.isRedacted(value)) return false
  const proto = Object.getPrototypeOf(value)
  return proto === Object.prototype || proto === null
}

const levels = new Map<string, string>()
const levelOf = (label: string) => {
  let level = levels.get(label)
  if (level === undefined) {
    level = label.toLowerCase()
    levels.set(label, level)
  }
  return level
}

// The time of the last line rendered, as text: a busy process writes many lines in a millisecond.
let isoAt = Number.NaN
let iso = ""
const isoOf = (date: Date): string => {
  const at = date.getTime()
  if (at !== isoAt) {
    iso = date.toISOString()
    isoAt = at
  }
  return iso
}

/**
 * Renders one log entry as a JSON line; exported for tests. Every value went through `scrub`, so
 * `JSON.stringify` needs no replacer (a replacer is called for every key of the line).
 */
export const render = (options: Logger.Logger.Options<unknown>): string => {
  const message = options.message
  const parts = Array.isArray(message) ? message : [message]
  // `Effect.logInfo("handled", { actor, id })`: the fields of a plain object after the text sit
  // beside the annotations (cheaper than `annotateLogs` on a hot path, same line).
  const fields =
    parts.length === 2 && typeof parts[0] === "string" && isFields(parts[1]) ? parts[1] : undefined
  const entry: Record<string, unknown> = {
    at: isoOf(options.date),
    level: levelOf(options.logLevel.label),
    msg: fields !== undefined || parts.length === 1 ? scrub(parts[0]) : parts.map((p) => scrub(p)),
  }
  for (const [key, value] of options.annotations) entry[key] = scrub(value)
  if (fields !== undefined) for (const key in fields) if (!(key in core)) entry[key] = scrub(fields[key])
  if (List.isCons(options.spans)) {
    const now = options.date.getTime()
    for (const span of options.spans) entry[`${span.label}_ms`] = now - span.startTime
  }
  if (!Cause.isEmpty(options.cause)) {
    entry.cause = Cause.pretty(options.cause, { renderErrorCause: false }).split("\n").slice(0, 8).join("\n")
  }
  return JSON.stringify(entry)
}

/** The JSON logger, writing to `write` (stderr by default). */
export const jsonLogger = (write: (line: string) => void = (line) => process.stderr.write(`${line}\n`)) =>
  Logger.make((options) => write(render(options)))

/** Replaces the default logger with the JSON logger for the whole program. */
export const layer: Layer.Layer<never> = Logger.replace(Logger.defaultLogger, jsonLogger())

/** The same logger collecting lines into `lines`, for tests that assert on what was logged. */
export const layerCollect = (lines: Array<string>): Layer.Layer<never> =>
  Logger.replace(
    Logger.defaultLogger,
    jsonLogger((line) => lines.push(line)),
  )

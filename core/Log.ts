/**
 * Structured logging: one JSON object per line with time, level, message, annotations and spans.
 *
 * Values marked secret are `Redacted` (effect) values; the logger replaces every one of them,
 * at any depth of a message or annotation, with "<redacted>" before anything is written, so a
 * secret can never reach a log line by accident. Errors are written as their tag and message only.
 */

import type { Layer } from "effect"
import { Cause, HashMap, List, Logger, Redacted } from "effect"

const REDACTED = "<redacted>"

/** A JSON-safe copy of `value` with every Redacted replaced and cycles cut. */
export const scrub = (value: unknown, seen: WeakSet<object> = new WeakSet()): unknown => {
  if (Redacted.isRedacted(value)) return REDACTED
  if (value === null || typeof value !== "object") {
    if (typeof value === "bigint") return value.toString()
    if (typeof value === "function" || typeof value === "symbol") return String(value)
    return value
  }
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

const messageOf = (message: unknown): unknown => {
  const parts = Array.isArray(message) ? message : [message]
  const scrubbed = parts.map((p) => scrub(p))
  return scrubbed.length === 1 ? scrubbed[0] : scrubbed
}

/** Renders one log entry as a JSON line; exported for tests. */
export const render = (options: Logger.Logger.Options<unknown>): string => {
  const entry: Record<string, unknown> = {
    at: options.date.toISOString(),
    level: options.logLevel.label.toLowerCase(),
    msg: messageOf(options.message),
  }
  for (const [key, value] of HashMap.toEntries(options.annotations)) entry[key] = scrub(value)
  const now = options.date.getTime()
  for (const span of List.toArray(options.spans)) entry[`${span.label}_ms`] = now - span.startTime
  if (!Cause.isEmpty(options.cause)) {
    entry.cause = Cause.pretty(options.cause, { renderErrorCause: false }).split("\n").slice(0, 8).join("\n")
  }
  return JSON.stringify(entry, (_k, v) => (Redacted.isRedacted(v) ? REDACTED : v))
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

/**
 * Building blocks shared by the resource schemas: byte-limited strings, bounded integers and
 * arrays with messages that say the limit, timestamps, HTTPS addresses, hashes.
 * Every message is written to follow the field path, e.g. `setup[3]: at most 16384 bytes`.
 */
import { Schema } from "effect"
import { externalReferenceMaxBytes, urlMaxChars } from "./Limits.ts"

/** The UTF-8 length of a string in bytes. */
export const utf8Bytes = (s: string): number => Buffer.byteLength(s, "utf8")

/** Refines a string schema to at most `n` UTF-8 bytes. */
export const maxBytes =
  (n: number) =>
  <S extends Schema.Schema<string, string, never>>(self: S) =>
    self.pipe(Schema.filter((s: string) => utf8Bytes(s) <= n || `at most ${n} bytes`))

/** A string of at most `n` UTF-8 bytes. */
export const StringMaxBytes = (n: number) => Schema.String.pipe(maxBytes(n))

/** A string of at most `n` characters (UTF-16 code units, JavaScript's `length`). */
export const StringMaxChars = (n: number) =>
  Schema.String.pipe(Schema.maxLength(n, { message: () => `at most ${n} characters` }))

/** A non-empty string. */
export const NonEmptyString = Schema.String.pipe(Schema.minLength(1, { message: () => "must not be empty" }))

/** An integer from `min` to `max`, both included. */
export const IntBetween = (min: number, max: number) =>
  Schema.Number.pipe(
    Schema.filter(
      (n) => (Number.isSafeInteger(n) && n >= min && n <= max) || `must be an integer from ${min} to ${max}`,
    ),
  )

/** An integer of at least `min`. */
export const IntAtLeast = (min: number) =>
  Schema.Number.pipe(
    Schema.filter((n) => (Number.isSafeInteger(n) && n >= min) || `must be an integer of at least ${min}`),
  )

/** A non-negative integer (counts, sizes, sequence numbers). */
export const Count = IntAtLeast(0)

/** An integer amount in billionths of a US dollar (may be negative: refunds, debts). */
export const UsdNanos = Schema.Number.pipe(
  Schema.filter((n) => Number.isSafeInteger(n) || "must be an integer"),
)

/** An array of at most `n` items. */
export const ArrayMax = <A, I>(item: Schema.Schema<A, I, never>, n: number) =>
  Schema.Array(item).pipe(Schema.maxItems(n, { message: () => `at most ${n} items` }))

/** A string literal union whose failure message lists the allowed values. */
export const Enum = <const L extends ReadonlyArray<string>>(...values: L) =>
  Schema.Literal(...values).annotations({
    message: () => ({ message: `must be one of ${values.join(", ")}`, override: true }),
  })

/** An ISO 8601 date-time in UTC as the API writes it: `2025-01-31T12:00:00.000Z`. */
export const Timestamp = Schema.String.pipe(
  Schema.pattern(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z$/, {
    message: () => "must be an ISO 8601 UTC date-time like 2025-01-31T12:00:00.000Z",
  }),
).annotations({ identifier: "Timestamp" })
export type Timestamp = typeof Timestamp.Type

/** The wire form of a moment given in milliseconds since the epoch. */
export const timestamp = (ms: number): Timestamp => new Date(ms).toISOString()

/**
 * An absolute `https:` URL with a host and no credentials in it. Whether the host is public is
 * checked when the address is used (DNS can change), not here.
 */
export const HttpsUrl = Schema.String.pipe(
  Schema.filter((s) => {
    if (s.length > urlMaxChars) return `at most ${urlMaxChars} characters`
    let url: URL
    try {
      url = new URL(s)
    } catch {
      return "must be an absolute https:// URL"
    }
    if (url.protocol !== "https:") return "must be an https:// URL"
    if (url.hostname === "") return "must name a host"
    if (url.username !== "" || url.password !== "") return "must not carry a user name or password"
    return true
  }),
).annotations({ identifier: "HttpsUrl" })

/** A SHA-256 digest as 64 lowercase hexadecimal characters. */
export const Sha256Hex = Schema.String.pipe(
  Schema.pattern(/^[0-9a-f]{64}$/, {
    message: () => "must be 64 lowercase hexadecimal characters (SHA-256)",
  }),
).annotations({ identifier: "Sha256Hex" })

/** A caller's own reference, returned as sent: at most 256 UTF-8 bytes. */
export const ExternalReference = StringMaxBytes(externalReferenceMaxBytes).annotations({
  identifier: "ExternalReference",
})

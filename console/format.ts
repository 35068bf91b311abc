/** Small formatting helpers for the pages. */

/** Dollars from nanodollars, with cents (more digits for amounts under a cent). */
export const usd = (nanos: number): string => {
  const dollars = nanos / 1e9
  const digits = Math.abs(dollars) > 0 && Math.abs(dollars) < 0.01 ? 4 : 2
  return `${dollars < 0 ? "-" : ""}$${Math.abs(dollars).toFixed(digits)}`
}

/** A timestamp as local date and time, or a dash. */
export const when = (iso: string | undefined): string =>
  iso === undefined
    ? "—"
    : new Date(iso).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" })

/** Bytes in a human unit. */
export const size = (n: number): string => {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"]
  let v = n
  let i = 0
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024
    i++
  }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`
}

/** A duration in seconds as `1h 2m 3s`. */
export const duration = (seconds: number): string => {
  const h = Math.floor(seconds / 3600)
  const m = Math.floor((seconds % 3600) / 60)
  const s = seconds % 60
  return [h > 0 ? `${h}h` : "", m > 0 ? `${m}m` : "", `${s}s`].filter((x) => x !== "").join(" ")
}

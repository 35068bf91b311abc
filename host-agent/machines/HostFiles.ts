/**
 * Small synchronous reads of the host's files (cgroupfs, sysfs, /proc, the driver's own records):
 * each takes microseconds, where an asynchronous one waits its turn on a busy thread pool.
 */
import { readFileSync } from "node:fs"

/** A file's text, or undefined when it cannot be read (it, or its folder, is gone or never was). */
export const readText = (path: string): string | undefined => {
  try {
    return readFileSync(path, "utf8")
  } catch {
    return undefined
  }
}

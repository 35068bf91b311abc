/**
 * Small synchronous reads of the host's files (cgroupfs, sysfs, /proc, the driver's own records):
 * each takes microseconds, where an asynchronous one waits its turn on a busy thread pool. And a
 * process's priority, set thread by thread through /proc.
 */
import { readdirSync, readFileSync } from "node:fs"
import { getPriority, setPriority } from "node:os"

/** A file's text, or undefined when it cannot be read (it, or its folder, is gone or never was). */
export const readText = (path: string): string | undefined => {
  try {
    return readFileSync(path, "utf8")
  } catch {
    return undefined
  }
}

/**
 * The fields of a `/proc/…/stat` text after the program's name, which may hold anything but ends at
 * the last ")": the state (proc(5)'s 3rd field) is the first.
 */
export const statFields = (text: string): Array<string> => text.slice(text.lastIndexOf(")") + 2).split(" ")

/** The nice value in a `/proc/…/stat` file (its 19th field), or none when it is not there. */
export const niceIn = (stat: string): number | undefined => {
  const text = readText(stat)
  if (text === undefined) return undefined
  return Number(statFields(text)[16])
}

/**
 * The nice value the host agent runs at (its main thread's: 0 unless its operator chose another).
 * Its machines and host services run at it; background work runs nicer than it.
 */
export const normalNice = (): number => getPriority(process.pid)

/**
 * The nice values of process `pid`'s threads, each once (a thread that ended meanwhile is left
 * out; none when the process is gone).
 */
export const threadNices = (pid: number): Array<number> => {
  let tids: Array<string>
  try {
    tids = readdirSync(`/proc/${pid}/task`)
  } catch {
    return []
  }
  const nices = tids.map((tid) => niceIn(`/proc/${pid}/task/${tid}/stat`))
  return [...new Set(nices.filter((n): n is number => n !== undefined))]
}

/**
 * Sets every thread of process `pid` to `nice`, again until none is left at another (a thread may
 * start meanwhile with its parent's); a process gone is left. Root may raise a priority.
 */
export const reniceAll = (pid: number, nice: number): void => {
  for (let pass = 0; pass < 3; pass++) {
    let tids: Array<string>
    try {
      tids = readdirSync(`/proc/${pid}/task`)
    } catch {
      return // gone
    }
    let changed = 0
    for (const tid of tids) {
      try {
        if (getPriority(Number(tid)) === nice) continue
        setPriority(Number(tid), nice)
        changed++
      } catch {
        // the thread ended
      }
    }
    if (changed === 0) return
  }
}

/** One line of a mountinfo file (`/proc/<pid>/mountinfo`). */
export interface MountEntry {
  /** Where it is mounted, its octal escapes (`\040` for a space) read back. */
  readonly point: string
  /** The mount's own options (`rw`, `nosuid`…). */
  readonly options: ReadonlyArray<string>
  readonly type: string
  /** The superblock's options (`rw`, `nsdelegate`…). */
  readonly superOptions: ReadonlyArray<string>
}

/** The mounts of a mountinfo file's text: `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL…] - TYPE SOURCE SUPER`. */
export const mountsOf = (mountinfo: string): Array<MountEntry> =>
  mountinfo.split("\n").flatMap((line) => {
    const [before, after] = line.split(" - ")
    if (before === undefined || after === undefined) return []
    const [, , , , point, options = ""] = before.split(" ")
    const [type, , superOptions = ""] = after.split(" ")
    if (point === undefined || type === undefined) return []
    return [
      {
        point: point.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8))),
        options: options.split(","),
        type,
        superOptions: superOptions.split(",").filter((o) => o !== ""),
      },
    ]
  })

/**
 * Stops the nats-servers of a process that died without stopping them (SIGKILL, or a signal it
 * had no handler for, so no `exit` hook ran). `deploy/NatsProcess.ts` starts one watchdog per
 * process, detached, and tells it on stdin, a tab-separated line each:
 *
 *   +  <pid>  <config path>  <folder>…   a server it started, and the folders to remove after it
 *   -  <pid>                             a server it stopped itself
 *
 * When stdin ends (the process is gone, however it went), each server still listed gets SIGTERM,
 * SIGKILL if it is still there 5 seconds later, and then its folders are removed. A pid is only
 * signalled while /proc shows it running with that config file, so a pid the system has since
 * given to another process is never touched.
 */
import { readFileSync, rmSync } from "node:fs"

const servers = new Map()
let buffer = ""

const handle = (line) => {
  const [op, pid, config, ...dirs] = line.split("\t")
  if (op === "+" && config !== undefined) servers.set(Number(pid), { config, dirs })
  if (op === "-") servers.delete(Number(pid))
}

const running = (pid, config) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").includes(config)
  } catch {
    return false
  }
}
const live = () => [...servers].filter(([pid, s]) => running(pid, s.config)).map(([pid]) => pid)
const signal = (pids, name) => {
  for (const pid of pids) {
    try {
      process.kill(pid, name)
    } catch {}
  }
}
const settle = async (ms) => {
  const until = Date.now() + ms
  while (live().length > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 50))
}

process.stdin.setEncoding("utf8")
process.stdin.on("data", (chunk) => {
  buffer += chunk
  for (let i = buffer.indexOf("\n"); i >= 0; i = buffer.indexOf("\n")) {
    handle(buffer.slice(0, i))
    buffer = buffer.slice(i + 1)
  }
})
process.stdin.on("end", async () => {
  signal(live(), "SIGTERM")
  await settle(5_000)
  signal(live(), "SIGKILL")
  await settle(1_000)
  for (const { dirs } of servers.values())
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true })
  process.exit(0)
})

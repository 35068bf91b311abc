/**
 * The process that starts host tools for `exec.ts`. It is small (plain JavaScript, no loader), so
 * each fork it makes copies little; forking the host agent itself, with its hundreds of MiB,
 * costs 10–20 ms a tool. Each message `{ id, cmd, args, input?, env?, log? }` starts one tool;
 * the answer is `{ id, code, stdout, stderr }` once it ends, or `{ id, error }` when it could not
 * start. With `log`, the tool's output goes to that file (appended) instead of the answer. It exits
 * when its parent goes (the IPC channel closes); tools it started run on.
 */
import { spawn } from "node:child_process"
import { closeSync, openSync } from "node:fs"

process.on("disconnect", () => process.exit(0))

process.on("message", (message) => {
  const { id, cmd, args, input, env, log } = message
  let fd
  try {
    if (log !== undefined) fd = openSync(log, "a")
  } catch (e) {
    process.send({ id, error: `${log}: ${e.message}` })
    return
  }
  const child = spawn(cmd, args, {
    stdio: fd === undefined ? ["pipe", "pipe", "pipe"] : ["ignore", fd, fd],
    ...(env === undefined ? {} : { env }),
  })
  if (fd !== undefined) closeSync(fd)
  const out = []
  const err = []
  let answered = false
  const answer = (body) => {
    if (answered) return
    answered = true
    process.send({ id, ...body })
  }
  child.stdout?.on("data", (b) => out.push(b))
  child.stderr?.on("data", (b) => err.push(b))
  child.on("error", (e) => answer({ error: e.message }))
  // Output to a file: its end is its exit (what it started may hold the file open for long).
  if (fd !== undefined) child.on("exit", (code) => answer({ code, stdout: "", stderr: "" }))
  else
    child.on("close", (code) =>
      answer({
        code,
        stdout: Buffer.concat(out).toString("utf8"),
        stderr: Buffer.concat(err).toString("utf8"),
      }),
    )
  if (child.stdin) {
    child.stdin.on("error", () => undefined) // a tool that reads no input may exit first
    child.stdin.end(input ?? "")
  }
})

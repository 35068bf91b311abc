/**
 * `exec RUN -- COMMAND…`: a `bash` command in the run's machine, its output streamed as it comes
 * (long-polls of the output route), the CLI exiting with the command's own status (125 when it
 * could not be run). Ctrl-C cancels the command and exits 130. The words after `--` are joined
 * with spaces into the `bash -c` line, as `ssh host -- …` does.
 */
import { type Command, text } from "../Command.ts"
import { type CommandRecord, send } from "../Commands.ts"
import { ExecFailed, ExitWith, UsageError } from "../Failures.ts"
import * as Print from "../Print.ts"

interface OutputRead {
  readonly output: string
  readonly next: number
  readonly done: boolean
}

export const exec: Command = {
  options: { workdir: { type: "string" }, timeout: { type: "string" } },
  positionals: [2, Number.POSITIVE_INFINITY],
  run: async ({ api, out, values, positionals }) => {
    const [run, ...words] = positionals as [string, ...Array<string>]
    const line = words.join(" ")
    if (line.trim() === "") throw new UsageError("give the command after --")
    const timeout = text(values, "timeout")
    if (timeout !== undefined && !/^\d+$/.test(timeout))
      throw new UsageError(`--timeout must be whole seconds: ${timeout}`)
    const path = `/v1/runs/${encodeURIComponent(run)}/commands`
    const created = await send(api, run, "bash", {
      command: line,
      ...(text(values, "workdir") ? { workdir: text(values, "workdir") } : {}),
      ...(timeout !== undefined ? { timeout_ms: Number(timeout) * 1000 } : {}),
    })
    const at = `${path}/${encodeURIComponent(created.id)}`
    // Ctrl-C: the command is cancelled (its processes killed), then the CLI exits 130.
    const stop = new AbortController()
    let interrupted = false
    const onSignal = () => {
      if (interrupted) return
      interrupted = true
      stop.abort()
    }
    process.on("SIGINT", onSignal)
    process.on("SIGTERM", onSignal)
    try {
      let after = 0
      let done = false
      while (!done && !out.json) {
        const read = await api.call<OutputRead>("GET", `${at}/output`, undefined, {
          query: { after, wait: 25 },
          signal: stop.signal,
        })
        if (read.output !== "") process.stdout.write(read.output)
        after = read.next
        done = read.done
      }
      let record: CommandRecord = created
      while (!["succeeded", "failed", "cancelled"].includes(record.state))
        record = await api.call<CommandRecord>("GET", at, undefined, {
          query: { wait: 25 },
          signal: stop.signal,
        })
      if (out.json) Print.json(record)
      if (record.state !== "succeeded")
        throw new ExecFailed(`the command ${record.state}: ${record.error ?? "no reason given"}`)
      const result = record.result as {
        exit_code?: number
        timed_out?: boolean
        oom_killed?: boolean
        truncated?: boolean
      }
      if (result.timed_out) Print.note("hangar exec: the command timed out")
      if (result.oom_killed) Print.note("hangar exec: the command ran out of memory")
      throw new ExitWith(
        typeof result.exit_code === "number" && result.exit_code >= 0 ? result.exit_code : 125,
      )
    } catch (e) {
      if (!interrupted) throw e
      await api.call("POST", `${at}/cancel`).catch(() => undefined)
      Print.note("hangar exec: cancelled")
      throw new ExitWith(130)
    } finally {
      process.off("SIGINT", onSignal)
      process.off("SIGTERM", onSignal)
    }
  },
}

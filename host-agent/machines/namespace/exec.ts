/** Runs a host tool and collects its output; fails with the tool's stderr when it exits non-zero. */
import { spawn } from "node:child_process"

export const run = (cmd: string, args: ReadonlyArray<string>, options: { readonly input?: string } = {}) =>
  new Promise<string>((ok, fail) => {
    const child = spawn(cmd, args, { stdio: ["pipe", "pipe", "pipe"] })
    const out: Array<Buffer> = []
    const err: Array<Buffer> = []
    child.stdout.on("data", (b: Buffer) => out.push(b))
    child.stderr.on("data", (b: Buffer) => err.push(b))
    child.on("error", (e) => fail(new Error(`${cmd}: ${e.message}`)))
    child.on("close", (code) =>
      code === 0
        ? ok(Buffer.concat(out).toString("utf8"))
        : fail(
            new Error(
              `${cmd} ${args.join(" ")} exited ${code}: ${Buffer.concat(err).toString("utf8").trim()}`,
            ),
          ),
    )
    child.stdin.on("error", () => undefined) // a tool that reads no input may exit first
    child.stdin.end(options.input ?? "")
  })

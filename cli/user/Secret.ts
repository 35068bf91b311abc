/**
 * A vendor key read from stdin: piped (`… | hangar models openai`), or typed at a terminal without
 * being shown. Never from an argument, where it would land in the shell's history and `ps`.
 */
import { UsageError } from "./Failures.ts"

const fromPipe = async (): Promise<string> => {
  const chunks: Array<Buffer> = []
  for await (const c of process.stdin) chunks.push(c as Buffer)
  return Buffer.concat(chunks).toString("utf8")
}

const fromTerminal = (prompt: string): Promise<string> =>
  new Promise((resolve, reject) => {
    const stdin = process.stdin
    process.stderr.write(prompt)
    let typed = ""
    const done = (error?: Error) => {
      stdin.setRawMode(false)
      stdin.pause()
      stdin.off("data", onData)
      process.stderr.write("\n")
      if (error) reject(error)
      else resolve(typed)
    }
    const onData = (data: Buffer) => {
      for (const ch of data.toString("utf8")) {
        if (ch === "\r" || ch === "\n") return done()
        if (ch === "\u0003") return done(new UsageError("cancelled"))
        if (ch === "\u007f" || ch === "\b") typed = typed.slice(0, -1)
        else typed += ch
      }
    }
    stdin.setRawMode(true)
    stdin.resume()
    stdin.on("data", onData)
  })

/** The key from stdin, trimmed; refused when empty. */
export const readKey = async (what: string): Promise<string> => {
  const key = (process.stdin.isTTY ? await fromTerminal(`${what} (not shown): `) : await fromPipe()).trim()
  if (key === "") throw new UsageError(`${what}: give it on stdin (for example: hangar … < key.txt)`)
  return key
}

/**
 * `cp LOCAL RUN:PATH` and `cp RUN:PATH LOCAL`: a file or a folder into or out of a run's machine,
 * through the `put` and `get` command kinds (spec "Command kinds"). Relative run paths resolve
 * from `/workspace`, as everywhere in the machine.
 *
 * Into a run:
 * - a file is uploaded as it is (`POST /v1/files` and the signed link), then a `put` writes it at
 *   PATH (replacing a file there, making parent folders). A PATH ending in `/` (or empty) means
 *   "into that folder under the file's own name".
 * - a folder is uploaded as one `.tar.gz` (packed as `hangar run --in` packs, so links and special
 *   files are refused here before anything is sent), `put` to a temporary file in the machine's
 *   `/tmp`, and unpacked there by a `bash` command: `mkdir -p PATH && tar -xzf T -C PATH`, the
 *   archive removed whatever the outcome. One upload and one archive instead of a `put` per file:
 *   a folder of many small files costs two commands, not thousands. The folder's content lands in
 *   PATH (as `hangar run --in` fills `/workspace/in`); files already there are replaced, others
 *   kept.
 *
 * Out of a run: a `get` answers a `download_url` for a file, or for a folder as `.tar.gz`. The
 * answer does not say which; the link's signed `filename` does: the gateway names a folder's
 * archive `<name>.tar.gz` after the folder and a file by its own name, so the link is a folder's
 * exactly when its filename is the path's last segment plus `.tar.gz` (a file called `x.tar.gz` is
 * named `x.tar.gz`, never `x.tar.gz.tar.gz`). A folder is unpacked into LOCAL (made if missing;
 * links, special files and paths leaving LOCAL refused, see `Files.ts`); a file is written to LOCAL,
 * or into LOCAL under its own name when LOCAL is an existing folder or ends in `/`.
 *
 * A command that ends `failed` or `cancelled`, or answers an `error` (no such path, not a folder,
 * a full disk), ends `cp` with exit status 4 and that message; an API refusal is exit 3 as
 * everywhere. `--json` prints the last command's final record.
 */
import { randomBytes } from "node:crypto"
import { stat } from "node:fs/promises"
import { basename, join, posix } from "node:path"
import type { Command, Context } from "../Command.ts"
import { type CommandRecord, sendAndWait } from "../Commands.ts"
import { UsageError } from "../Failures.ts"
import * as Files from "../Files.ts"
import * as Print from "../Print.ts"

/** `run_<id>:path`. */
const REMOTE = /^(run_[0-9A-Za-z]+):(.*)$/s

interface Remote {
  readonly run: string
  readonly path: string
}

const remoteOf = (arg: string): Remote | undefined => {
  const m = REMOTE.exec(arg)
  return m ? { run: m[1] as string, path: m[2] as string } : undefined
}

/** A path for the shell, single-quoted. */
const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`

/** The path as the machine resolves it (relative to `/workspace`). */
const resolved = (path: string) => posix.resolve("/workspace", path === "" ? "." : path)

/** Sends a command and waits for its end; anything but a clean answer is an Error (exit 4). */
const perform = async (
  api: Context["api"],
  run: string,
  kind: string,
  args: Record<string, unknown>,
): Promise<CommandRecord> => {
  const record = await sendAndWait(api, run, kind, args)
  if (record.state === "failed") throw new Error(`${kind} failed: ${record.error ?? "no reason given"}`)
  if (record.state !== "succeeded") throw new Error(`${kind} ${record.state}`)
  const error = record.result?.error
  if (typeof error === "string") throw new Error(error)
  return record
}

const into = async (context: Context, local: string, remote: Remote): Promise<CommandRecord> => {
  const { api, out } = context
  let s: Awaited<ReturnType<typeof stat>>
  try {
    s = await stat(local)
  } catch (e) {
    throw new Error(
      `${local}: ${(e as NodeJS.ErrnoException).code === "ENOENT" ? "no such file or folder" : (e as Error).message}`,
    )
  }
  if (s.isFile()) {
    const path =
      remote.path === "" || remote.path.endsWith("/") ? `${remote.path}${basename(local)}` : remote.path
    const file = await Files.uploadFile(api, out, local)
    const record = await perform(api, remote.run, "put", { file, path })
    Print.note(
      `copied ${local} to ${remote.run}:${resolved(path)} (${Print.bytes(Number(record.result?.bytes ?? s.size))})`,
    )
    return record
  }
  if (!s.isDirectory()) throw new Error(`${local}: not a regular file or folder`)
  const target = resolved(remote.path)
  const file = await Files.uploadFolder(api, out, local)
  const archive = `/tmp/.hangar-cp-${randomBytes(8).toString("hex")}.tar.gz`
  await perform(api, remote.run, "put", { file, path: archive })
  const t = quote(archive)
  const unpacked = await perform(api, remote.run, "bash", {
    command: `mkdir -p -- ${quote(target)} && tar -xzf ${t} -C ${quote(target)}; s=$?; rm -f -- ${t}; exit $s`,
  })
  const exit = unpacked.result?.exit_code
  if (exit !== 0) {
    const output = typeof unpacked.result?.output === "string" ? unpacked.result.output.trim() : ""
    throw new Error(`unpacking into ${target} exited ${String(exit)}${output ? `: ${output}` : ""}`)
  }
  Print.note(`copied ${local}/ into ${remote.run}:${target}`)
  return unpacked
}

const outOf = async (context: Context, remote: Remote, local: string): Promise<CommandRecord> => {
  const { api, out } = context
  const record = await perform(api, remote.run, "get", { path: remote.path === "" ? "." : remote.path })
  const url = record.result?.download_url
  if (typeof url !== "string") throw new Error("get answered no download_url")
  const path = resolved(remote.path)
  const name = posix.basename(path) || "root"
  const filename = new URL(url).searchParams.get("filename")
  if (filename === `${name}.tar.gz`) {
    await Files.downloadAndUnpack(out, url, undefined, local)
    Print.note(`copied ${remote.run}:${path}/ into ${local}`)
    return record
  }
  let target = local
  if (local.endsWith("/")) target = join(local, name)
  else {
    const existing = await stat(local).catch(() => undefined)
    if (existing?.isDirectory()) target = join(local, name)
  }
  const bytes = await Files.downloadFile(out, url, target)
  Print.note(`copied ${remote.run}:${path} to ${target} (${Print.bytes(bytes)})`)
  return record
}

export const cp: Command = {
  positionals: [2, 2],
  run: async (context) => {
    const [from, to] = context.positionals as [string, string]
    const source = remoteOf(from)
    const target = remoteOf(to)
    if (source !== undefined && target !== undefined)
      throw new UsageError(
        "copy between a run and this machine: one side is RUN:PATH, the other a local path",
      )
    if (source === undefined && target === undefined)
      throw new UsageError("one side must be RUN:PATH (for example run_…:/workspace/in)")
    const record =
      target !== undefined ? await into(context, from, target) : await outOf(context, source as Remote, to)
    if (context.out.json) Print.json(record)
  },
}

/**
 * The file command kinds (`read`, `write`, `edit`, `list`) over one SFTP channel. A problem with
 * the file itself (missing, a folder, an `old_text` not found) is the command's answer, returned as
 * `{error}`; only a lost connection fails the effect.
 */
import { posix } from "node:path"
import type { SFTPWrapper, Stats } from "ssh2"
import { dimensions, IMAGE_MAX_BYTES, IMAGE_MAX_SIDE, sniff } from "./Images.ts"

/** Where relative paths resolve from. */
export const WORKSPACE = "/workspace"

/** A path resolved against `/workspace`. */
export const resolvePath = (path: string) => posix.resolve(WORKSPACE, path)

/** Most entries a `list` returns. */
export const LIST_MAX_ENTRIES = 1000
/** Lines a `read` returns when no `limit` is given. */
export const READ_DEFAULT_LIMIT = 2000
/** Most bytes of text a `read` returns. */
export const READ_MAX_BYTES = 1024 * 1024
/** Largest file an `edit` loads (it holds the file in the host agent's memory). */
export const EDIT_MAX_BYTES = 64 * 1024 * 1024

export interface ReadArgs {
  readonly file_path: string
  /** The first line to return, counting from 1. */
  readonly offset?: number
  /** How many lines to return. */
  readonly limit?: number
}
export type ReadResult =
  | { readonly output: string }
  | { readonly image_url: string }
  | { readonly error: string }

export interface WriteArgs {
  readonly file_path: string
  readonly content: string
}
export type WriteResult = { readonly bytes: number } | { readonly error: string }

export interface EditArgs {
  readonly file_path: string
  readonly edits: ReadonlyArray<{ readonly old_text: string; readonly new_text: string }>
}
export type EditResult = { readonly applied: number } | { readonly error: string }

export interface ListArgs {
  readonly path: string
}
export interface ListEntry {
  readonly name: string
  readonly type: "file" | "folder"
  readonly size?: number
}
export type ListResult =
  | {
      readonly entries: ReadonlyArray<ListEntry>
      readonly truncated: boolean
      readonly skipped: ReadonlyArray<string>
    }
  | { readonly error: string }

/** An SFTP status answer from the guest (as opposed to a broken channel). */
export class FileProblem extends Error {}

const S_IFMT = 0o170000
const S_IFDIR = 0o040000
const S_IFREG = 0o100000

const statusMessage = (path: string, e: unknown) => {
  const code = (e as { code?: unknown }).code
  if (code === 2) return `${path}: no such file or folder`
  if (code === 3) return `${path}: permission denied`
  return `${path}: ${(e as Error).message}`
}

// SFTP status errors carry a numeric `code`; anything else means the channel itself failed.
const call = <A>(path: string, f: (cb: (err: Error | undefined | null, a: A) => void) => void) =>
  new Promise<A>((ok, fail) =>
    f((err, a) => {
      if (!err) ok(a)
      else if (typeof (err as { code?: unknown }).code === "number")
        fail(new FileProblem(statusMessage(path, err)))
      else fail(err)
    }),
  )

const stat = (sftp: SFTPWrapper, path: string) => call<Stats>(path, (cb) => sftp.stat(path, cb))
const lstat = (sftp: SFTPWrapper, path: string) => call<Stats>(path, (cb) => sftp.lstat(path, cb))
const readAll = (sftp: SFTPWrapper, path: string) => call<Buffer>(path, (cb) => sftp.readFile(path, cb))
const writeAll = (sftp: SFTPWrapper, path: string, data: Buffer, mode?: number) =>
  call<void>(path, (cb) =>
    sftp.writeFile(path, data, mode === undefined ? {} : { mode }, (e) => cb(e, undefined)),
  )

const readHead = async (sftp: SFTPWrapper, path: string, bytes: number): Promise<Buffer> => {
  const handle = await call<Buffer>(path, (cb) => sftp.open(path, "r", cb))
  try {
    const buf = Buffer.alloc(bytes)
    const n = await call<number>(path, (cb) => sftp.read(handle, buf, 0, bytes, 0, (e, got) => cb(e, got)))
    return buf.subarray(0, n)
  } finally {
    await call<void>(path, (cb) => sftp.close(handle, (e) => cb(e, undefined))).catch(() => undefined)
  }
}

const orError = async <A>(f: () => Promise<A>): Promise<A | { readonly error: string }> => {
  try {
    return await f()
  } catch (e) {
    if (e instanceof FileProblem) return { error: e.message }
    throw e
  }
}

/** Reads text lines, or an image as a data URL. */
export const read = (sftp: SFTPWrapper, args: ReadArgs): Promise<ReadResult> =>
  orError(async () => {
    const path = resolvePath(args.file_path)
    const st = await stat(sftp, path)
    if ((st.mode & S_IFMT) === S_IFDIR) return { error: `${path}: is a folder (use list)` }
    // A device, pipe or socket can be endless (/dev/zero): only files are read.
    if ((st.mode & S_IFMT) !== S_IFREG) return { error: `${path}: not a regular file` }
    const type = sniff(await readHead(sftp, path, 16))
    if (type) {
      if (st.size > IMAGE_MAX_BYTES) {
        return {
          error: `${path}: image is ${st.size} bytes; at most ${IMAGE_MAX_BYTES} (3.75 MiB) can be read`,
        }
      }
      const data = await readAll(sftp, path)
      const size = dimensions(type, data)
      if (!size) return { error: `${path}: damaged ${type} header` }
      if (size.width > IMAGE_MAX_SIDE || size.height > IMAGE_MAX_SIDE) {
        return {
          error: `${path}: image is ${size.width}x${size.height} pixels; at most ${IMAGE_MAX_SIDE} a side can be read`,
        }
      }
      return { image_url: `data:${type};base64,${data.toString("base64")}` }
    }
    const offset = Math.max(1, args.offset ?? 1)
    const limit = Math.max(0, args.limit ?? READ_DEFAULT_LIMIT)
    return { output: await readLines(sftp, path, offset, limit) }
  })

// Streams the file and stops once the requested lines (or the byte cap) are in. Each line keeps
// its own ending, so the answer is the file's bytes from line `offset` on (a trailing newline, a
// `\r\n`, a last line without one all come back as they are).
const readLines = (sftp: SFTPWrapper, path: string, offset: number, limit: number) =>
  new Promise<string>((ok, fail) => {
    const stream = sftp.createReadStream(path)
    const decoder = new TextDecoder("utf-8", { fatal: false })
    const out: Array<string> = []
    let taken = 0
    let line = 1
    let partial = ""
    let bytes = 0
    let done = false
    const finish = () => {
      if (done) return
      done = true
      stream.destroy()
      ok(out.join(""))
    }
    const take = (text: string) => {
      if (line >= offset && taken < limit) {
        out.push(text)
        taken++
        bytes += Buffer.byteLength(text)
        if (bytes > READ_MAX_BYTES)
          out.push(`${text.endsWith("\n") ? "" : "\n"}[... read stops at ${READ_MAX_BYTES} bytes ...]\n`)
      }
      line++
      if (taken >= limit || bytes > READ_MAX_BYTES) finish()
    }
    stream.on("data", (chunk: Buffer) => {
      if (done) return
      const parts = (partial + decoder.decode(chunk, { stream: true })).split("\n")
      partial = parts.pop() ?? ""
      for (const p of parts) if (!done) take(`${p}\n`)
      // A line longer than the cap is not waited for to its end: what came is taken, and the read
      // stops there (a multi-GB file without a newline costs no more than the cap).
      if (!done && partial.length > READ_MAX_BYTES) {
        take(partial)
        partial = ""
        finish()
      }
    })
    stream.on("end", () => {
      if (done) return
      const last = partial + decoder.decode()
      if (last !== "") take(last)
      finish()
    })
    stream.on("error", (e: Error) => {
      if (!done)
        fail(typeof (e as { code?: unknown }).code === "number" ? new FileProblem(statusMessage(path, e)) : e)
    })
  })

const mkdirs = async (sftp: SFTPWrapper, dir: string): Promise<void> => {
  const st = await stat(sftp, dir).catch(() => undefined)
  if (st) {
    if ((st.mode & S_IFMT) !== S_IFDIR) throw new FileProblem(`${dir}: not a folder`)
    return
  }
  await mkdirs(sftp, posix.dirname(dir))
  await call<void>(dir, (cb) => sftp.mkdir(dir, (e) => cb(e, undefined))).catch(async (e) => {
    // Another command may have made it in the meantime.
    if (!(await stat(sftp, dir).catch(() => undefined))) throw e
  })
}

/** Writes `content` (UTF-8), making parent folders. */
export const write = (sftp: SFTPWrapper, args: WriteArgs): Promise<WriteResult> =>
  orError(async () => {
    const path = resolvePath(args.file_path)
    const data = Buffer.from(args.content, "utf8")
    await mkdirs(sftp, posix.dirname(path))
    await writeAll(sftp, path, data)
    return { bytes: data.length }
  })

const occurrences = (text: string, part: string) => {
  let n = 0
  for (let i = text.indexOf(part); i !== -1; i = text.indexOf(part, i + part.length)) n++
  return n
}

/** Applies every edit or none; the file is replaced in one rename. */
export const edit = (sftp: SFTPWrapper, args: EditArgs): Promise<EditResult> =>
  orError(async () => {
    const path = resolvePath(args.file_path)
    const st = await stat(sftp, path)
    if ((st.mode & S_IFMT) !== S_IFREG) return { error: `${path}: not a regular file` }
    if (st.size > EDIT_MAX_BYTES)
      return {
        error: `${path}: ${st.size} bytes; edit takes files of at most ${EDIT_MAX_BYTES} bytes (use bash)`,
      }
    let text = (await readAll(sftp, path)).toString("utf8")
    for (const [i, e] of args.edits.entries()) {
      if (e.old_text === "") return { error: `edits[${i}].old_text is empty; nothing applied` }
      const n = occurrences(text, e.old_text)
      if (n !== 1)
        return { error: `edits[${i}].old_text occurs ${n} times, must occur exactly once; nothing applied` }
      const at = text.indexOf(e.old_text)
      text = text.slice(0, at) + e.new_text + text.slice(at + e.old_text.length)
    }
    const temp = posix.join(posix.dirname(path), `.${posix.basename(path)}.edit-${process.pid}-${Date.now()}`)
    await writeAll(sftp, temp, Buffer.from(text, "utf8"), st.mode & 0o7777)
    try {
      await call<void>(path, (cb) => sftp.ext_openssh_rename(temp, path, (e) => cb(e, undefined)))
    } catch (e) {
      await call<void>(temp, (cb) => sftp.unlink(temp, (err) => cb(err, undefined))).catch(() => undefined)
      throw e
    }
    return { applied: args.edits.length }
  })

/** Files and folders directly inside `path`, by name; links are skipped, not followed. */
export const list = (sftp: SFTPWrapper, args: ListArgs): Promise<ListResult> =>
  orError(async () => {
    const path = resolvePath(args.path)
    const st = await lstat(sftp, path)
    if ((st.mode & S_IFMT) !== S_IFDIR) return { error: `${path}: not a folder` }
    const names = await call<Array<{ filename: string; attrs: Stats }>>(path, (cb) => sftp.readdir(path, cb))
    names.sort((a, b) => (a.filename < b.filename ? -1 : a.filename > b.filename ? 1 : 0))
    const entries: Array<ListEntry> = []
    const skipped: Array<string> = []
    let truncated = false
    for (const { filename, attrs } of names) {
      const kind = attrs.mode & S_IFMT
      if (kind === S_IFDIR || kind === S_IFREG) {
        if (entries.length >= LIST_MAX_ENTRIES) {
          truncated = true
          continue
        }
        entries.push(
          kind === S_IFDIR
            ? { name: filename, type: "folder" }
            : { name: filename, type: "file", size: attrs.size },
        )
      } else if (skipped.length < LIST_MAX_ENTRIES) skipped.push(filename)
    }
    return { entries, truncated, skipped }
  })

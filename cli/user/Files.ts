/**
 * Moving folders and files between this machine and the API, streamed from and to disk so a 1 GiB
 * folder goes up and down with flat memory.
 *
 * Up: a folder is packed (node-tar, portable headers, regular files and folders only, paths
 * relative to the folder so the run's `/workspace/in` gets its content) twice: once to count the
 * `.tar.gz`'s size and SHA-256, which `POST /v1/files` announces, and again as it is sent with the
 * answered method, URL and headers (spec "Upload"). A single file goes up as it is, after one pass
 * to hash it.
 *
 * Down: the `.tar.gz` is streamed to a temporary file while it is hashed and its entries checked
 * (node-tar's parser, strict); only when the hash matches and every entry is a regular file or a
 * folder under a relative path without `..` is it unpacked, so a refused or damaged download leaves
 * nothing behind. node-tar's unpacker also refuses to write through a symbolic link it finds in the
 * target (a folder component that is a link: `SymlinkError`; a file that is a link is replaced).
 *
 * Decisions:
 *
 * - No temporary archive: the two packs of a folder are the same bytes (portable headers, the same
 *   members and levels), so nothing is written to disk, and the second pack goes on while the
 *   bytes are sent (the upload waited for a whole pack before). A 5 GB folder needs no 5 GB of free
 *   disk. A folder changed between the two packs is refused, naming it, rather than sent unlike
 *   what was announced: a change of size is seen here as the bytes go, any other by the gateway,
 *   which refuses a body whose SHA-256 is not the one announced (hashing it again here would take
 *   ~0.6 s of CPU per GB from the sending).
 * - gzip level 1 (level 0, stored, for a member whose sample level 1 would not shrink by 3 %),
 *   in members of 4 MiB compressed on the thread pool side by side (a `.tar.gz` may
 *   be several gzip members one after another; gzip, GNU tar and Node's gunzip read them as one
 *   stream). One deflate stream runs at about 60 MB/s on incompressible data here, slower than the
 *   upload itself; members let every core work and keep memory to a few blocks. A stored member is
 *   made here in one buffer, not by zlib: on a process with a big heap, zlib's three big buffers
 *   per member, and the level sample's zlib state, kept the garbage collector busy (packing ran at
 *   ~230 MB/s beside the bench's stack, 700–830 MB/s now, with a 16 KiB sample).
 * - The body goes with exactly the answered headers (from 1e9 bytes they hold no content-length,
 *   and the body goes chunked).
 * - A connection lost while sending is tried again (3 attempts) from the start of the file; a
 *   `conflict` on a later attempt means the earlier one completed.
 */
import { createHash } from "node:crypto"
import { createReadStream, type Stats } from "node:fs"
import { type FileHandle, mkdir, mkdtemp, open, readdir, rename, rm, stat } from "node:fs/promises"
import http from "node:http"
import https from "node:https"
import { availableParallelism, tmpdir } from "node:os"
import { basename, dirname, join } from "node:path"
import { Readable } from "node:stream"
import { promisify } from "node:util"
import { crc32, deflateRawSync, gzip as gzipCallback, type ZlibOptions } from "node:zlib"
import { x as extract, Pack, Parser, type ReadEntry } from "tar"
import type { Api } from "./Api.ts"
import { ApiRefused } from "./Failures.ts"
import * as Print from "./Print.ts"

const MiB = 1024 * 1024

/** A member's sample: when level 1 saves less than 3 % of it, the member is stored (level 0). */
const SAMPLE_BYTES = 16 * 1024

/** Copies \`target.length\` bytes of \`parts\` (one after another) from \`offset\` into \`target\`. */
const copyOut = (parts: ReadonlyArray<Buffer>, offset: number, target: Buffer): void => {
  let skip = offset
  let to = 0
  for (const part of parts) {
    if (to >= target.length) return
    if (skip >= part.length) {
      skip -= part.length
      continue
    }
    to += part.copy(target, to, skip, Math.min(part.length, skip + (target.length - to)))
    skip = 0
  }
}

/**
 * The gzip level of a member of `size` bytes in `parts`: 1 (the fastest that compresses), or 0
 * (stored) for data level 1 would not shrink (already compressed, random): deflating it costs most
 * of the time of an upload and wins nothing, while storing it runs at memory speed. Judged on a
 * sample from its middle.
 */
const levelFor = (parts: ReadonlyArray<Buffer>, size: number): 0 | 1 => {
  if (size <= SAMPLE_BYTES) return 1
  const sample = Buffer.allocUnsafe(SAMPLE_BYTES)
  copyOut(parts, Math.floor((size - SAMPLE_BYTES) / 2), sample)
  return deflateRawSync(sample, { level: 1 }).length > SAMPLE_BYTES * 0.97 ? 0 : 1
}

/** A gzip member's header: deflate, no name, no time, made on Unix. */
const GZIP_HEADER = Buffer.from([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3])

/** The most a stored deflate block holds. */
const STORED_BLOCK = 65_535

/**
 * The gzip member of `size` bytes in `parts`, stored (deflate's uncompressed blocks), made here in
 * one buffer: the bytes are copied once, where zlib at level 0 takes a joined copy in and gives
 * pieces out to be joined again. On this process's heap those big short-lived buffers are what
 * the garbage collector is run for.
 */
const storedMember = (parts: ReadonlyArray<Buffer>, size: number): Buffer => {
  const member = Buffer.allocUnsafe(GZIP_HEADER.length + Math.ceil(size / STORED_BLOCK) * 5 + size + 8)
  let at = GZIP_HEADER.copy(member, 0)
  let crc = 0
  let done = 0
  // Bytes the current block still takes: at 0 the next block's header goes in first.
  let left = 0
  for (const part of parts) {
    crc = crc32(part, crc)
    for (let from = 0; from < part.length; ) {
      if (left === 0) {
        left = Math.min(STORED_BLOCK, size - done)
        member[at] = done + left === size ? 1 : 0
        member.writeUInt16LE(left, at + 1)
        member.writeUInt16LE(left ^ 0xffff, at + 3)
        at += 5
      }
      const n = part.copy(member, at, from, from + Math.min(left, part.length - from))
      at += n
      from += n
      done += n
      left -= n
    }
  }
  member.writeUInt32LE(crc >>> 0, at)
  member.writeUInt32LE(size % 2 ** 32, at + 4)
  return member
}

/** Plain tar bytes per gzip member. */
const MEMBER_BYTES = 4 * MiB

const SEND_ATTEMPTS = 3

const gzip = promisify(gzipCallback) as (input: Buffer, options: ZlibOptions) => Promise<Buffer>

/** What `POST /v1/files` answers (spec "Upload"). */
interface UploadLink {
  readonly id: string
  readonly url: string
  readonly method: string
  readonly headers: Readonly<Record<string, string>>
}

const kindOf = (
  s: Pick<Stats, "isSymbolicLink" | "isFIFO" | "isSocket" | "isCharacterDevice" | "isBlockDevice">,
) =>
  s.isSymbolicLink()
    ? "a symbolic link"
    : s.isFIFO()
      ? "a fifo"
      : s.isSocket()
        ? "a socket"
        : s.isCharacterDevice() || s.isBlockDevice()
          ? "a device file"
          : "a special file"

const refusedMember = (path: string, kind: string) =>
  new Error(`${path}: ${kind} cannot be uploaded (a folder may hold only regular files and folders)`)

const BLOCK = 512
const blocks = (bytes: number) => Math.ceil(bytes / BLOCK) * BLOCK

/**
 * The tar header bytes of member `name` (as node-tar names it, `./…`): one block, or, for a name
 * ustar cannot hold (not ASCII, or longer than 100 bytes with no slash splitting it into at most
 * 155 + 100), a PAX header before it carrying the name.
 */
const headerBytes = (name: string): number => {
  const length = Buffer.byteLength(name)
  const split = name.lastIndexOf("/", 155)
  const fits =
    length === name.length && (length <= 100 || (split > 0 && length - split - 1 <= 100 && split <= 155))
  return fits ? BLOCK : BLOCK + blocks(length + 16) + BLOCK
}

/**
 * Walks `dir` (links are not followed) and answers the bytes of its tar before compression, the
 * measure packing progress counts in: each member's header and its content in whole blocks, and the
 * two zero blocks that end the archive. Throws naming the first entry that is neither a regular
 * file nor a folder.
 */
export const tarBytes = async (dir: string): Promise<number> => {
  const walk = async (folder: string, name: string): Promise<number> => {
    let total = headerBytes(`${name}/`)
    for (const entry of await readdir(folder, { withFileTypes: true })) {
      const path = join(folder, entry.name)
      const member = `${name}/${entry.name}`
      if (entry.isDirectory()) total += await walk(path, member)
      else if (entry.isFile()) total += headerBytes(member) + blocks((await stat(path)).size)
      else throw refusedMember(path, kindOf(entry))
    }
    return total
  }
  return (await walk(dir, ".")) + 2 * BLOCK
}

// A link cache that remembers nothing: node-tar then packs every hard-linked file as a file of its
// own (the service refuses link entries).
const noLinks = {
  get: () => undefined,
  set() {
    return this
  },
} as unknown as Map<`${number}:${number}`, string>

/** What a pass over bytes counted. */
interface Counted {
  readonly bytes: number
  readonly sha256: string
}

/** The `.tar.gz` of `dir`, as its gzip members come, in order; `onPlain` sees the tar bytes packed. */
async function* packed(dir: string, onPlain?: (n: number) => void): AsyncGenerator<Buffer> {
  let refused: Error | undefined
  const pack = new Pack({
    cwd: dir,
    portable: true,
    linkCache: noLinks,
    maxReadSize: MiB,
    jobs: 2,
    // Checked again as node-tar reads each entry: something swapped in after `tarBytes` is refused too.
    filter: (path: string, s: Stats | ReadEntry) => {
      const ok = "isFile" in s && (s.isFile() || s.isDirectory())
      if (!ok) refused ??= refusedMember(join(dir, path), "isFile" in s ? kindOf(s) : "a special file")
      return ok
    },
  })
  pack.add(".")
  pack.end()
  const width = Math.max(2, Math.min(availableParallelism(), 4))
  // Compressed members in order; at most `width` are being compressed at once.
  const working: Array<Promise<Buffer>> = []
  let block: Array<Buffer> = []
  let blockBytes = 0
  const seal = () => {
    if (blockBytes === 0) return
    const parts = block
    const size = blockBytes
    block = []
    blockBytes = 0
    if (levelFor(parts, size) === 0) {
      working.push(Promise.resolve(storedMember(parts, size)))
      return
    }
    const compressing = gzip(Buffer.concat(parts, size), { level: 1, chunkSize: MiB })
    compressing.catch(() => undefined) // awaited in order below; a failure is seen there
    working.push(compressing)
  }
  try {
    for await (const chunk of pack as AsyncIterable<Buffer>) {
      if (refused) throw refused
      onPlain?.(chunk.length)
      block.push(chunk)
      blockBytes += chunk.length
      if (blockBytes >= MEMBER_BYTES) {
        seal()
        while (working.length >= width) yield await (working.shift() as Promise<Buffer>)
      }
    }
    if (refused) throw refused
    seal()
    while (working.length > 0) yield await (working.shift() as Promise<Buffer>)
  } finally {
    // An early end (a refusal, a full disk, a send stopped) leaves node-tar paused mid-folder: stop it.
    if (refused !== undefined || working.length > 0 || blockBytes > 0) pack.destroy()
  }
}

/** Counts the size and SHA-256 of `chunks`, handing each to `each` (awaited) as it comes. */
const counted = async (
  chunks: AsyncIterable<Buffer>,
  each?: (chunk: Buffer) => Promise<unknown>,
): Promise<Counted> => {
  const hash = createHash("sha256")
  let bytes = 0
  for await (const chunk of chunks) {
    hash.update(chunk)
    bytes += chunk.length
    await each?.(chunk)
  }
  return { bytes, sha256: hash.digest("hex") }
}

/** Packs `dir` into `file` (made new); answers the archive's size and SHA-256. */
export const packFolder = async (
  dir: string,
  file: string,
  onPlain?: (n: number) => void,
): Promise<Counted> => {
  const out = await open(file, "wx", 0o600)
  try {
    return await counted(packed(dir, onPlain), (member) => out.write(member))
  } finally {
    await out.close()
  }
}

/** A folder that changed between the pack that counted it and the one being sent. */
class FolderChanged extends Error {
  constructor(dir: string) {
    super(`${dir}: the folder changed while it was being uploaded; nothing was kept, try again`)
  }
}

/**
 * `chunks`, failing with `FolderChanged` as soon as they are more or fewer bytes than `expected`
 * counted. Their SHA-256 is the gateway's to check (not hashed twice here, beside the sending): it
 * refuses a body that is not the one announced, which `uploadFolder` answers as the same.
 */
async function* sameSize(
  dir: string,
  chunks: AsyncIterable<Buffer>,
  expected: Counted,
): AsyncGenerator<Buffer> {
  let bytes = 0
  for await (const chunk of chunks) {
    bytes += chunk.length
    if (bytes > expected.bytes) throw new FolderChanged(dir)
    yield chunk
  }
  if (bytes !== expected.bytes) throw new FolderChanged(dir)
}

/** Hashes a file in one streamed pass. */
const hashFile = (path: string): Promise<Counted> =>
  counted(createReadStream(path, { highWaterMark: MiB }) as AsyncIterable<Buffer>)

const clientOf = (url: URL) => (url.protocol === "https:" ? https : http)

/** The error body of a refusal (`{error, code}`) as `ApiRefused`, else a plain Error. */
const refusal = (what: string, status: number, text: string): Error => {
  try {
    const body = JSON.parse(text) as { error?: unknown; code?: unknown }
    if (typeof body.code === "string")
      return new ApiRefused(status, body.code, typeof body.error === "string" ? body.error : text)
  } catch {
    // not the API's error body
  }
  return new Error(`${what}: the server answered ${status}${text ? `: ${text.slice(0, 200)}` : ""}`)
}

/** The bytes of an upload, afresh for each attempt. */
type Source = () => Readable

/** One attempt at sending `source` to the link: answers the status and body, or rejects (connection). */
const sendOnce = (
  link: UploadLink,
  source: Readable,
  progress: Print.Progress,
): Promise<{ status: number; text: string }> =>
  new Promise((resolve, reject) => {
    const url = new URL(link.url)
    const headers: Record<string, string> = { ...link.headers }
    const req = clientOf(url).request(url, { method: link.method || "PUT", headers, agent: false }, (res) => {
      let text = ""
      res.setEncoding("utf8")
      res.on("data", (c: string) => {
        if (text.length < 64 * 1024) text += c
      })
      res.on("end", () => {
        // A refusal may come before the whole body went: stop reading the source.
        source.destroy()
        resolve({ status: res.statusCode ?? 0, text })
      })
      res.on("error", reject)
    })
    req.on("error", reject)
    source.on("data", (c) => progress.add(c.length))
    source.on("error", (e) => {
      req.destroy(e)
      reject(e)
    })
    source.pipe(req)
  })

/**
 * Sends what `source` gives (`counted` is its size and hash) with `POST /v1/files` and the
 * answered link; `name` is the file or folder, for errors.
 */
const upload = async (
  api: Api,
  out: Print.Out,
  name: string,
  source: Source,
  counted: Counted,
  label: string,
): Promise<string> => {
  const link = await api.call<UploadLink>("POST", "/v1/files", {
    bytes: counted.bytes,
    sha256: counted.sha256,
  })
  for (let attempt = 1; ; attempt++) {
    const progress = Print.progress(out, label, counted.bytes)
    let answer: { status: number; text: string }
    try {
      answer = await sendOnce(link, source(), progress)
    } catch (e) {
      if (e instanceof FolderChanged) throw e
      if (attempt >= SEND_ATTEMPTS)
        throw new Error(`upload to ${new URL(link.url).host} failed: ${(e as Error).message}`)
      Print.note(`upload interrupted (${(e as Error).message}); sending again`)
      continue
    }
    progress.done()
    if (answer.status >= 200 && answer.status < 300) return link.id
    // The earlier attempt arrived whole; only its answer was lost.
    if (attempt > 1 && answer.status === 409) return link.id
    throw refusal(`upload of ${name}`, answer.status, answer.text)
  }
}

/** A new temporary folder under the system's (removed by the caller). */
const scratch = () => mkdtemp(join(tmpdir(), "hangar-"))

/**
 * Packs `dir` as a `.tar.gz` (streamed, gzip level 1, regular files and folders only: a link is
 * refused with an Error naming it) to count its bytes and sha256, announces them with
 * `POST /v1/files`, then packs it again as it is sent with the answer's method/url/headers, with
 * progress on stderr; answers the upload id (`file_…`). Nothing is written to disk.
 */
export const uploadFolder = async (api: Api, out: Print.Out, dir: string): Promise<string> => {
  const s = await stat(dir)
  if (!s.isDirectory()) throw new Error(`${dir}: not a folder`)
  const total = await tarBytes(dir)
  const packing = Print.progress(out, `packing ${basename(dir)}`, total)
  const count = await counted(packed(dir, packing.add))
  packing.done()
  try {
    return await upload(
      api,
      out,
      dir,
      () => Readable.from(sameSize(dir, packed(dir), count), { objectMode: false }),
      count,
      "uploading",
    )
  } catch (e) {
    // The gateway's answer to a body whose SHA-256 is not the one announced (spec "Upload").
    if (e instanceof ApiRefused && e.status === 400 && e.detail.startsWith("sha256:"))
      throw new FolderChanged(dir)
    throw e
  }
}

/** Uploads one local file as it is (for `cp` into a run); answers the upload id. */
export const uploadFile = async (api: Api, out: Print.Out, path: string): Promise<string> => {
  const s = await stat(path)
  if (!s.isFile()) throw new Error(`${path}: not a regular file`)
  return upload(
    api,
    out,
    path,
    () => createReadStream(path, { highWaterMark: MiB }),
    await hashFile(path),
    `uploading ${basename(path)}`,
  )
}

/**
 * Streams the body at `url` into the open file `into` with progress; `onChunk` sees each piece.
 * Answers the bytes and their SHA-256; a body shorter than its content-length is an Error.
 */
const download = (
  out: Print.Out,
  url: string,
  into: FileHandle,
  label: string,
  onChunk?: (chunk: Buffer) => Promise<void> | void,
): Promise<Counted> =>
  new Promise((resolve, reject) => {
    const target = new URL(url)
    const req = clientOf(target).get(target, { agent: false }, (res) => {
      const status = res.statusCode ?? 0
      if (status < 200 || status > 299) {
        let text = ""
        res.setEncoding("utf8")
        res.on("data", (c: string) => {
          if (text.length < 64 * 1024) text += c
        })
        res.on("end", () => reject(refusal("download", status, text)))
        res.on("error", reject)
        return
      }
      const length = Number(res.headers["content-length"] ?? Number.NaN)
      const progress = Print.progress(out, label, Number.isFinite(length) ? length : 0)
      const hash = createHash("sha256")
      let bytes = 0
      ;(async () => {
        for await (const chunk of res as AsyncIterable<Buffer>) {
          hash.update(chunk)
          bytes += chunk.length
          await into.write(chunk)
          await onChunk?.(chunk)
          progress.add(chunk.length)
        }
        progress.done()
        if (Number.isFinite(length) && bytes !== length)
          throw new Error(`the download was cut off: ${bytes} of ${length} bytes arrived`)
        return { bytes, sha256: hash.digest("hex") }
      })().then(resolve, (e) => {
        res.destroy()
        reject(e)
      })
    })
    req.on("error", (e) => reject(new Error(`download from ${target.host} failed: ${e.message}`)))
  })

/** Streams the file at `url` to `path` (through a temporary file beside it, renamed at the end). */
export const downloadFile = async (out: Print.Out, url: string, path: string): Promise<number> => {
  await mkdir(dirname(path), { recursive: true })
  const temp = join(dirname(path), `.${basename(path)}.hangar-${process.pid}-${Date.now()}.part`)
  let moved = false
  try {
    const file = await open(temp, "wx", 0o644)
    let counted: Counted
    try {
      counted = await download(out, url, file, `downloading ${basename(path)}`)
      await file.sync()
    } finally {
      await file.close()
    }
    await rename(temp, path)
    moved = true
    return counted.bytes
  } finally {
    if (!moved) await rm(temp, { force: true })
  }
}

/** Why an archive entry is refused, or undefined when it may be unpacked. */
export const entryRefusal = (entry: Pick<ReadEntry, "path" | "type">): string | undefined => {
  const shown = JSON.stringify(entry.path)
  const t = entry.type
  if (t === "Link" || t === "SymbolicLink")
    return `${shown}: ${t === "Link" ? "hard" : "symbolic"} links are refused (only regular files and folders)`
  if (t !== "File" && t !== "OldFile" && t !== "ContiguousFile" && t !== "Directory")
    return `${shown}: entries of type ${t} are refused (only regular files and folders)`
  const p = entry.path
  if (p.includes("\0")) return `${shown}: the name holds a NUL character`
  if (p.startsWith("/") || p.startsWith("\\") || /^[A-Za-z]:/.test(p))
    return `${shown}: absolute paths are refused`
  if (p.split(/[\\/]/).includes("..")) return `${shown}: paths with .. are refused`
  return undefined
}

/** A checking parser fed as the archive arrives: `refused` holds the first rule broken. */
const checker = () => {
  const state: { refused: string | undefined } = { refused: undefined }
  const parser = new Parser({ strict: true })
  const refuse = (why: string) => {
    if (state.refused === undefined) state.refused = why
  }
  parser.on("entry", (entry: ReadEntry) => {
    const why = entryRefusal(entry)
    if (why !== undefined) refuse(why)
    entry.resume()
  })
  parser.on("ignoredEntry", (entry: ReadEntry) => {
    if (!entry.meta) refuse(entryRefusal(entry) ?? `${JSON.stringify(entry.path)}: entry refused`)
  })
  parser.on("error", (e: Error) => refuse(`not a readable .tar.gz: ${e.message}`))
  const guard = (f: () => unknown) => {
    try {
      f()
    } catch (e) {
      refuse(`not a readable .tar.gz: ${(e as Error).message}`)
    }
  }
  return {
    state,
    push: async (chunk: Buffer) => {
      if (state.refused !== undefined) return
      let drained = true
      guard(() => {
        drained = parser.write(chunk)
      })
      if (!drained && state.refused === undefined) await new Promise((r) => parser.once("drain", r))
    },
    end: () => guard(() => parser.end()),
  }
}

/**
 * Downloads the `.tar.gz` at `url` with progress, checks its SHA-256 against `sha256` (when
 * given), and unpacks it into `dir` (made if missing), refusing links and any path outside `dir`.
 */
export const downloadAndUnpack = async (
  out: Print.Out,
  url: string,
  sha256: string | undefined,
  dir: string,
): Promise<void> => {
  const temp = await scratch()
  try {
    const archive = join(temp, "download.tar.gz")
    const check = checker()
    const file = await open(archive, "wx", 0o600)
    let counted: Counted
    try {
      counted = await download(out, url, file, "downloading", check.push)
    } finally {
      await file.close()
    }
    if (sha256 !== undefined && counted.sha256 !== sha256.toLowerCase())
      throw new Error(
        `the download's SHA-256 is ${counted.sha256}, not the ${sha256} announced; nothing was unpacked`,
      )
    check.end()
    if (check.state.refused !== undefined)
      throw new Error(`the archive is refused, nothing was unpacked: ${check.state.refused}`)
    await mkdir(dir, { recursive: true })
    // Checked again as it unpacks (the same file, so nothing should differ).
    let refused: string | undefined
    await extract({
      file: archive,
      cwd: dir,
      strict: true,
      preserveOwner: false,
      filter: (_path: string, entry: Stats | ReadEntry) => {
        const why = "type" in entry ? entryRefusal(entry) : "not an archive entry"
        if (why !== undefined) refused ??= why
        return why === undefined
      },
    })
    if (refused !== undefined) throw new Error(`the archive is refused: ${refused}`)
  } finally {
    await rm(temp, { recursive: true, force: true })
  }
}

/**
 * A checking tar filter: reads a tar stream with `node-tar`'s parser (ustar, GNU long names, PAX,
 * base-256 numbers; strict, so a damaged header or a cut-off archive is an error), refuses anything
 * but regular files and folders with safe relative paths, and re-emits the accepted entries as a
 * fresh tar (`node-tar`'s header and PAX encoders) that carries only a name, a mode (permission
 * bits only), a size, a modification time and the data. The guest's `tar` therefore never parses a
 * header we did not write ourselves: no link, device, fifo, sparse file, absolute or `..` path,
 * owner or extended attribute can reach it.
 *
 * `push` returns the bytes now ready (the parser emits synchronously, so everything a chunk
 * completes is out when `push` returns); `end` checks the archive was complete. Both throw
 * `TarRefused`, whose `detail` is a sentence for the run's `input` failure.
 */
import { Header, Parser, Pax, type ReadEntry, types } from "tar"

/** Bytes of one tar block. */
export const BLOCK = 512

/** The archive breaks a rule; `detail` names the entry and the rule. */
export class TarRefused extends Error {
  constructor(readonly detail: string) {
    super(detail)
  }
}

// Metadata entries (PAX headers, GNU long names) are held in memory, so they are bounded.
const META_MAX_BYTES = 1024 * 1024

const padOf = (size: number) => (BLOCK - (size % BLOCK)) % BLOCK

/** The safe relative form of an archive path (no leading `./`, no empty segments), or a refusal. */
export const safePath = (name: string): string => {
  const shown = JSON.stringify(name.length > 200 ? `${name.slice(0, 200)}…` : name)
  if (name.includes("\0")) throw new TarRefused(`${shown}: the name holds a NUL character`)
  if (name.startsWith("/")) throw new TarRefused(`${shown}: absolute paths are refused`)
  const parts = name.split("/").filter((p) => p !== "" && p !== ".")
  if (parts.includes("..")) throw new TarRefused(`${shown}: paths with .. are refused`)
  return parts.join("/")
}

// What each refused entry type is called in a refusal.
const refusedTypes: Readonly<Record<string, string>> = {
  Link: "hard links are refused (only regular files and folders)",
  SymbolicLink: "symbolic links are refused (only regular files and folders)",
  CharacterDevice: "device files are refused (only regular files and folders)",
  BlockDevice: "device files are refused (only regular files and folders)",
  FIFO: "fifos are refused (only regular files and folders)",
  SparseFile: "sparse files are refused",
}

// Largest value an 11-digit octal field holds (a modification time past it is clamped).
const OCTAL_MAX = 8 ** 11 - 1

/** A fresh header (and a PAX header before it when the name or size needs one) for an accepted entry. */
const reEmit = (path: string, dir: boolean, mode: number, size: number, mtime: Date | undefined) => {
  // A damaged time reads as no time; it is not worth refusing the archive for.
  const seconds = Math.floor((mtime?.getTime() ?? 0) / 1000)
  const name = dir ? `${path}/` : path
  const header = new Header({
    path: name,
    type: dir ? "Directory" : "File",
    size,
    // Permission bits only (no setuid/setgid/sticky); a folder stays writable so its contents unpack.
    mode: dir ? (mode & 0o777) | 0o700 : mode & 0o777,
    uid: 0,
    gid: 0,
    mtime: new Date((Number.isFinite(seconds) ? Math.min(Math.max(seconds, 0), OCTAL_MAX) : 0) * 1000),
  })
  // A name longer than ustar holds (or not ASCII) or a size over 8 GiB go in a PAX header.
  if (!header.encode() || header.block === undefined) return header.block ?? Buffer.alloc(0)
  return Buffer.concat([new Pax({ path: name, size }).encode(), header.block])
}

/** The filter for one archive; refuses once the file data passes `maxBytes` in all. */
export class TarFilter {
  private readonly parser: Parser
  private out: Array<Uint8Array> = []
  private refused: TarRefused | undefined
  private ended = false
  // One zero block and then nothing is how some writers end an archive; GNU tar takes it.
  private zeroBlock = false
  /** Bytes of file data accepted so far. */
  bytes = 0
  /** Files and folders accepted so far. */
  entries = 0

  constructor(private readonly maxBytes: number = Number.POSITIVE_INFINITY) {
    // A tar only: the parser's own decompression (it sniffs gzip and zstd) would take a second
    // layer the caller did not ask for; such an archive is refused as unreadable instead.
    this.parser = new Parser({ strict: true, maxMetaEntrySize: META_MAX_BYTES, gzip: false, zstd: false })
    this.parser.on("entry", (entry: ReadEntry) => this.guard(() => this.onEntry(entry)))
    // Entries the parser passes over: metadata over the bound, and types it does not know.
    this.parser.on("ignoredEntry", (entry: ReadEntry) =>
      this.guard(() => {
        if (entry.meta) throw new TarRefused(`an extended header of ${entry.size} bytes is too large`)
        this.onEntry(entry)
      }),
    )
    this.parser.on("meta", (text: string) => {
      if (text.includes("GNU.sparse.")) this.refuse("sparse files are refused")
    })
    this.parser.on("nullBlock", () => {
      this.zeroBlock = true
    })
    this.parser.on("eof", () => {
      this.ended = true
    })
    this.parser.on("error", (e: Error & { tarCode?: string }) => this.refuse(describe(e)))
  }

  /** True once the end-of-archive blocks were read; later input is ignored. */
  get done(): boolean {
    return this.ended
  }

  push(input: Uint8Array): Array<Uint8Array> {
    if (this.refused !== undefined) throw this.refused
    if (this.ended) return []
    this.feed(() => this.parser.write(Buffer.from(input.buffer, input.byteOffset, input.byteLength)))
    return this.take()
  }

  /** The closing blocks; refuses an archive cut off inside an entry. */
  end(): Array<Uint8Array> {
    if (this.refused !== undefined) throw this.refused
    if (!this.ended) {
      this.feed(() => this.parser.end())
      if (this.refused === undefined && !this.ended && !this.zeroBlock)
        this.refuse("the archive is cut off in the middle of an entry")
    }
    const out = this.take()
    return [...out, Buffer.alloc(2 * BLOCK)]
  }

  // The parser throws on some damaged input (an entry given more data than its header said)
  // rather than reporting it: that is an unreadable archive too.
  private feed(f: () => void) {
    try {
      f()
    } catch (e) {
      this.refuse(describe(e instanceof Error ? e : new Error(String(e))))
    }
  }

  private take(): Array<Uint8Array> {
    if (this.refused !== undefined) throw this.refused
    const out = this.out
    this.out = []
    return out
  }

  private refuse(detail: string) {
    if (this.refused !== undefined) return
    this.refused = new TarRefused(detail)
    this.parser.abort(this.refused)
  }

  private guard(f: () => void) {
    try {
      f()
    } catch (e) {
      if (e instanceof TarRefused) this.refuse(e.detail)
      else throw e
    }
  }

  private onEntry(entry: ReadEntry) {
    if (this.refused !== undefined) return entry.resume()
    const shown = JSON.stringify(entry.path)
    const type = entry.type
    const rule = refusedTypes[type]
    if (rule !== undefined) throw new TarRefused(`${shown}: ${rule}`)
    if (type !== "File" && type !== "OldFile" && type !== "ContiguousFile" && type !== "Directory")
      throw new TarRefused(
        `${shown}: entries of type ${JSON.stringify(types.code.get(type) ?? "?")} are refused (only regular files and folders)`,
      )
    const size = entry.size ?? 0
    if (!Number.isSafeInteger(size) || size < 0) throw new TarRefused(`${shown}: damaged size field`)
    const dir = type === "Directory" || (type !== "ContiguousFile" && entry.path.endsWith("/") && size === 0)
    const path = safePath(entry.path)
    const mode = Number.isInteger(entry.mode) ? (entry.mode as number) : dir ? 0o755 : 0o644
    if (dir) {
      // A folder's size field carries no data of its own: whatever follows is skipped.
      entry.resume()
      if (path === "") return // the archive's own "./"
      this.entries++
      this.out.push(reEmit(path, true, mode, 0, entry.mtime))
      return
    }
    if (path === "") throw new TarRefused(`${shown}: a file needs a name`)
    this.bytes += size
    if (this.bytes > this.maxBytes)
      throw new TarRefused(
        `the archive unpacks to more than the /workspace disk holds (${this.maxBytes} bytes): ${shown} brings it to ${this.bytes} bytes`,
      )
    this.entries++
    this.out.push(reEmit(path, false, mode, size, entry.mtime))
    // Read entries start paused; the data flows synchronously from here, as the parser writes it.
    entry.on("data", (chunk: Buffer) => {
      if (this.refused === undefined) this.out.push(chunk)
    })
    entry.on("end", () => {
      if (this.refused === undefined && padOf(size) > 0) this.out.push(Buffer.alloc(padOf(size)))
    })
    entry.resume()
  }
}

// A parser error as a sentence for the run's log.
const describe = (e: Error & { tarCode?: string }): string => {
  if (/checksum/i.test(e.message)) return "not a readable tar archive (bad header checksum)"
  if (/truncated|unexpected end/i.test(e.message)) return "the archive is cut off in the middle of an entry"
  if (e.tarCode === "TAR_BAD_ARCHIVE") return "not a readable tar archive"
  return `not a readable tar archive (${e.message.replace(/^TAR_[A-Z_]+: /, "")})`
}

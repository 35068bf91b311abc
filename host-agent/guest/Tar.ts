/**
 * A checking tar filter: reads a tar stream (ustar, GNU long names, PAX), refuses anything but
 * regular files and folders with safe relative paths, and re-emits the accepted entries as a fresh
 * tar that carries only a name, a mode (permission bits only), a size, a modification time and the
 * data. The guest's `tar` therefore never parses a header we did not write ourselves: no link,
 * device, fifo, sparse file, absolute or `..` path, owner or extended attribute can reach it.
 *
 * It is a synchronous state machine like `SealStream`'s: `push` returns the bytes now ready (file
 * data is passed through without copying), `end` checks the archive was complete. Both throw
 * `TarRefused`, whose `detail` is a sentence for the run's `input` failure.
 */

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
// Largest size an 11-digit octal field holds; larger sizes go in a PAX record.
const OCTAL_SIZE_MAX = 8 ** 11 - 1

const field = (b: Uint8Array, at: number, len: number) => {
  const raw = b.subarray(at, at + len)
  const nul = raw.indexOf(0)
  return Buffer.from(nul === -1 ? raw : raw.subarray(0, nul)).toString("utf8")
}

// Octal text, or GNU base-256 when the high bit of the first byte is set.
const number = (b: Uint8Array, at: number, len: number): number => {
  const first = b[at] as number
  if (first & 0x80) {
    if (first & 0x40) return Number.NaN // negative
    let n = first & 0x3f
    for (let i = 1; i < len; i++) n = n * 256 + (b[at + i] as number)
    return n
  }
  const text = field(b, at, len).trim()
  if (text === "") return 0
  return /^[0-7]+$/.test(text) ? Number.parseInt(text, 8) : Number.NaN
}

const checksumOk = (h: Uint8Array) => {
  const stored = number(h, 148, 8)
  let unsigned = 0
  let signed = 0
  for (let i = 0; i < BLOCK; i++) {
    const v = i >= 148 && i < 156 ? 0x20 : (h[i] as number)
    unsigned += v
    signed += v > 127 ? v - 256 : v
  }
  return stored === unsigned || stored === signed
}

const isZero = (b: Uint8Array) => b.every((v) => v === 0)

// PAX records: "<length> <key>=<value>\n", the length counting the whole record.
const paxRecords = (data: Buffer): Map<string, string> => {
  const out = new Map<string, string>()
  let at = 0
  while (at < data.length) {
    const space = data.indexOf(0x20, at)
    if (space === -1) break
    const len = Number.parseInt(data.subarray(at, space).toString("ascii"), 10)
    if (!Number.isInteger(len) || len <= 0 || at + len > data.length)
      throw new TarRefused("damaged PAX header")
    const record = data.subarray(space + 1, at + len - 1).toString("utf8")
    const eq = record.indexOf("=")
    if (eq === -1) throw new TarRefused("damaged PAX header")
    out.set(record.slice(0, eq), record.slice(eq + 1))
    at += len
  }
  return out
}

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

const writeOctal = (h: Buffer, at: number, len: number, value: number) => {
  h.write(`${value.toString(8).padStart(len - 1, "0")}\0`, at, len, "ascii")
}

/** One tar header block (ustar); tests use it to craft archives, the filter to re-emit entries. */
export const header = (entry: {
  readonly name: string
  readonly type: string
  readonly size?: number
  readonly mode?: number
  readonly mtime?: number
  readonly linkname?: string
  readonly devmajor?: number
  readonly devminor?: number
}): Buffer => {
  const h = Buffer.alloc(BLOCK)
  h.write(entry.name, 0, 100, "utf8")
  writeOctal(h, 100, 8, entry.mode ?? 0o644)
  writeOctal(h, 108, 8, 0)
  writeOctal(h, 116, 8, 0)
  writeOctal(h, 124, 12, Math.min(entry.size ?? 0, OCTAL_SIZE_MAX))
  writeOctal(h, 136, 12, Math.max(0, Math.min(entry.mtime ?? 0, OCTAL_SIZE_MAX)))
  h.write(entry.type, 156, 1, "latin1")
  if (entry.linkname) h.write(entry.linkname, 157, 100, "utf8")
  h.write("ustar\x0000", 257, 8, "latin1")
  writeOctal(h, 329, 8, entry.devmajor ?? 0)
  writeOctal(h, 337, 8, entry.devminor ?? 0)
  h.fill(0x20, 148, 156)
  let sum = 0
  for (const v of h) sum += v
  h.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148, 8, "ascii")
  return h
}

/** A PAX extended header entry (header and padded records) for the entry that follows it. */
export const paxHeader = (records: Readonly<Record<string, string>>): Buffer => {
  const parts: Array<Buffer> = []
  for (const [k, v] of Object.entries(records)) {
    const body = ` ${k}=${v}\n`
    const base = Buffer.byteLength(body)
    // The length counts its own digits.
    let len = base + String(base).length
    if (String(len).length > String(base).length) len = base + String(len).length
    parts.push(Buffer.from(`${len}${body}`, "utf8"))
  }
  const data = Buffer.concat(parts)
  return Buffer.concat([
    header({ name: "PaxHeader", type: "x", size: data.length }),
    data,
    Buffer.alloc(padOf(data.length)),
  ])
}

const reEmit = (path: string, dir: boolean, mode: number, size: number, mtime: number): Buffer => {
  const name = dir ? `${path}/` : path
  const records: Record<string, string> = {}
  // ustar's name field is 100 bytes; anything longer or not ASCII goes in a PAX `path`.
  if (Buffer.byteLength(name) > 100 || !/^[\x20-\x7e]*$/.test(name)) records.path = name
  if (size > OCTAL_SIZE_MAX) records.size = String(size)
  const h = header({
    name: records.path === undefined ? name : "long-name",
    type: dir ? "5" : "0",
    size,
    // Permission bits only (no setuid/setgid/sticky); a folder stays writable so its contents unpack.
    mode: dir ? (mode & 0o777) | 0o700 : mode & 0o777,
    mtime,
  })
  return Object.keys(records).length === 0 ? h : Buffer.concat([paxHeader(records), h])
}

type State =
  | { readonly kind: "header" }
  | {
      readonly kind: "meta"
      readonly type: string
      readonly size: number
      readonly parts: Array<Buffer>
      got: number
    }
  | { readonly kind: "data"; left: number; readonly pad: number }
  | { readonly kind: "skip"; left: number }
  | { readonly kind: "end" }

/** The filter for one archive; refuses once the file data passes `maxBytes` in all. */
export class TarFilter {
  private state: State = { kind: "header" }
  private readonly block = Buffer.alloc(BLOCK)
  private fill = 0
  private pax = new Map<string, string>()
  private longName: string | undefined
  /** Bytes of file data accepted so far. */
  bytes = 0
  /** Files and folders accepted so far. */
  entries = 0

  constructor(private readonly maxBytes: number = Number.POSITIVE_INFINITY) {}

  /** True once the end-of-archive block was read; later input is ignored. */
  get done(): boolean {
    return this.state.kind === "end"
  }

  push(input: Uint8Array): Array<Uint8Array> {
    const out: Array<Uint8Array> = []
    let at = 0
    while (at < input.length) {
      const s = this.state
      switch (s.kind) {
        case "end":
          return out
        case "header": {
          const n = Math.min(BLOCK - this.fill, input.length - at)
          this.block.set(input.subarray(at, at + n), this.fill)
          this.fill += n
          at += n
          if (this.fill === BLOCK) {
            this.fill = 0
            const emitted = this.onHeader(this.block)
            if (emitted) out.push(emitted)
          }
          break
        }
        case "meta": {
          const n = Math.min(s.size - s.got, input.length - at)
          s.parts.push(Buffer.from(input.subarray(at, at + n)))
          s.got += n
          at += n
          if (s.got === s.size) {
            this.onMeta(s.type, Buffer.concat(s.parts))
            this.state = { kind: "skip", left: padOf(s.size) }
          }
          break
        }
        case "data": {
          const n = Math.min(s.left, input.length - at)
          if (n > 0) out.push(input.subarray(at, at + n))
          s.left -= n
          at += n
          if (s.left === 0) {
            if (s.pad > 0) out.push(Buffer.alloc(s.pad))
            this.state = { kind: "skip", left: s.pad }
          }
          break
        }
        case "skip": {
          const n = Math.min(s.left, input.length - at)
          s.left -= n
          at += n
          if (s.left === 0) this.state = { kind: "header" }
          break
        }
      }
    }
    // A zero-length entry completes without input.
    return out
  }

  /** The closing blocks; refuses an archive cut off inside an entry. */
  end(): Array<Uint8Array> {
    const s = this.state
    if (s.kind === "end") return []
    if (s.kind !== "header" || this.fill !== 0 || this.pax.size > 0 || this.longName !== undefined)
      throw new TarRefused("the archive is cut off in the middle of an entry")
    this.state = { kind: "end" }
    return [Buffer.alloc(2 * BLOCK)]
  }

  private onMeta(type: string, data: Buffer) {
    if (type === "x") {
      for (const [k, v] of paxRecords(data)) {
        if (k.startsWith("GNU.sparse.")) throw new TarRefused("sparse files are refused")
        this.pax.set(k, v)
      }
    } else if (type === "L") {
      const nul = data.indexOf(0)
      this.longName = (nul === -1 ? data : data.subarray(0, nul)).toString("utf8")
    }
    // "g" (PAX global) records are read and dropped: nothing we re-emit depends on them.
  }

  private onHeader(h: Buffer): Uint8Array | undefined {
    if (isZero(h)) {
      if (this.pax.size > 0 || this.longName !== undefined)
        throw new TarRefused("the archive ends after an extended header")
      this.state = { kind: "end" }
      return Buffer.alloc(2 * BLOCK)
    }
    if (!checksumOk(h)) throw new TarRefused("not a readable tar archive (bad header checksum)")
    const ustar = h.subarray(257, 263).toString("latin1") === "ustar\0"
    const prefix = ustar ? field(h, 345, 155) : ""
    const rawName =
      this.pax.get("path") ?? this.longName ?? (prefix ? `${prefix}/${field(h, 0, 100)}` : field(h, 0, 100))
    const type = String.fromCharCode(h[156] as number)
    const paxSize = this.pax.get("size")
    const size =
      paxSize !== undefined && type !== "x" && type !== "g" && type !== "L"
        ? Number(paxSize)
        : number(h, 124, 12)
    if (!Number.isSafeInteger(size) || size < 0)
      throw new TarRefused(`${JSON.stringify(rawName)}: damaged size field`)
    if (type === "x" || type === "g" || type === "L") {
      if (size > META_MAX_BYTES) throw new TarRefused(`an extended header of ${size} bytes is too large`)
      this.state = { kind: "meta", type, size, parts: [], got: 0 }
      return this.finishEmpty()
    }
    const shown = JSON.stringify(rawName)
    const refuse = (what: string) => new TarRefused(`${shown}: ${what}`)
    this.pax = new Map()
    this.longName = undefined
    switch (type) {
      case "1":
        throw refuse("hard links are refused (only regular files and folders)")
      case "2":
        throw refuse("symbolic links are refused (only regular files and folders)")
      case "K":
        throw refuse("links are refused (only regular files and folders)")
      case "3":
      case "4":
        throw refuse("device files are refused (only regular files and folders)")
      case "6":
        throw refuse("fifos are refused (only regular files and folders)")
      case "S":
        throw refuse("sparse files are refused")
      case "0":
      case "\0":
      case "7":
      case "5":
        break
      default:
        throw refuse(`entries of type ${JSON.stringify(type)} are refused (only regular files and folders)`)
    }
    const dir = type === "5" || (type !== "7" && rawName.endsWith("/") && size === 0)
    const path = safePath(rawName)
    const mode = number(h, 100, 8)
    const mtime = number(h, 136, 12)
    if (dir) {
      // A folder's size field carries no data to skip when it is a folder entry.
      this.state = { kind: "skip", left: size + padOf(size) }
      this.finishEmpty()
      if (path === "") return undefined // the archive's own "./"
      this.entries++
      return reEmit(path, true, Number.isNaN(mode) ? 0o755 : mode, 0, Number.isNaN(mtime) ? 0 : mtime)
    }
    if (path === "") throw refuse("a file needs a name")
    this.bytes += size
    if (this.bytes > this.maxBytes)
      throw new TarRefused(
        `the archive unpacks to more than the /workspace disk holds (${this.maxBytes} bytes): ${shown} brings it to ${this.bytes} bytes`,
      )
    this.entries++
    this.state = { kind: "data", left: size, pad: padOf(size) }
    const emitted = reEmit(
      path,
      false,
      Number.isNaN(mode) ? 0o644 : mode,
      size,
      Number.isNaN(mtime) ? 0 : mtime,
    )
    if (size === 0) this.state = { kind: "header" }
    return emitted
  }

  // States that need no input (an empty metadata entry, nothing left to skip) complete at once.
  private finishEmpty(): undefined {
    const s = this.state
    if (s.kind === "meta" && s.size === 0) {
      this.onMeta(s.type, Buffer.alloc(0))
      this.state = { kind: "header" }
    } else if (s.kind === "skip" && s.left === 0) this.state = { kind: "header" }
    return undefined
  }
}

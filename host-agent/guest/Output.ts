/**
 * Keeps a command's output the way a `bash` result reports it: the first and the last 16 KiB and
 * the total byte count, whatever the size, in constant memory. Bytes that are not UTF-8 become
 * U+FFFD; the cut points are moved to whole characters so a cut never makes one.
 */

/** Bytes kept at each end of a `bash` result's output. */
export const OUTPUT_PART_BYTES = 16 * 1024

export interface Kept {
  readonly output: string
  readonly output_bytes: number
  readonly truncated: boolean
}

const decoder = () => new TextDecoder("utf-8", { fatal: false })

const isContinuation = (b: number) => (b & 0xc0) === 0x80

// Drops an incomplete character at the end (a lead byte whose continuation bytes were cut off).
const trimEnd = (buf: Uint8Array): Uint8Array => {
  for (let back = 1; back <= Math.min(4, buf.length); back++) {
    const b = buf[buf.length - back] as number
    if (isContinuation(b)) continue
    const need = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1
    return need > back ? buf.subarray(0, buf.length - back) : buf
  }
  return buf
}

// Drops continuation bytes at the start (the rest of a character whose lead byte was cut off).
const trimStart = (buf: Uint8Array): Uint8Array => {
  let i = 0
  while (i < Math.min(3, buf.length) && isContinuation(buf[i] as number)) i++
  return buf.subarray(i)
}

/** An accumulator of head, tail and byte count. */
export class OutputKeeper {
  private readonly head = new Uint8Array(OUTPUT_PART_BYTES)
  private headLength = 0
  private tail: Array<Uint8Array> = []
  private tailLength = 0
  private total = 0

  constructor(private readonly part: number = OUTPUT_PART_BYTES) {}

  push(chunk: Uint8Array): void {
    this.total += chunk.length
    let rest = chunk
    if (this.headLength < this.part) {
      const take = Math.min(this.part - this.headLength, rest.length)
      this.head.set(rest.subarray(0, take), this.headLength)
      this.headLength += take
      rest = rest.subarray(take)
    }
    if (rest.length === 0) return
    this.tail.push(rest)
    this.tailLength += rest.length
    while (this.tailLength - (this.tail[0]?.length ?? 0) >= this.part) {
      this.tailLength -= (this.tail.shift() as Uint8Array).length
    }
  }

  result(): Kept {
    const tailAll = Buffer.concat(this.tail)
    const tail = tailAll.subarray(Math.max(0, tailAll.length - this.part))
    const head = this.head.subarray(0, this.headLength)
    const omitted = this.total - head.length - tail.length
    if (omitted === 0) {
      return {
        output: decoder().decode(Buffer.concat([head, tail])),
        output_bytes: this.total,
        truncated: false,
      }
    }
    const output = `${decoder().decode(trimEnd(head))}\n[... ${omitted} bytes omitted ...]\n${decoder().decode(trimStart(tail))}`
    return { output, output_bytes: this.total, truncated: true }
  }
}

/**
 * A writer of `newc` cpio archives, the format the kernel unpacks as an initramfs. Written here
 * rather than run through `cpio(1)` because the archives are tiny and made per machine (the
 * machine's keys ride in one appended to the shared initramfs: the kernel unpacks concatenated
 * archives in order).
 */

/** One archive member; folders must come before what they hold. */
export type Entry =
  | { readonly type: "dir"; readonly path: string; readonly mode?: number }
  | { readonly type: "file"; readonly path: string; readonly data: Uint8Array; readonly mode?: number }
  | { readonly type: "symlink"; readonly path: string; readonly target: string }

const hex8 = (n: number) => n.toString(16).padStart(8, "0")
const pad4 = (n: number) => Buffer.alloc((4 - (n % 4)) % 4)

const member = (ino: number, name: string, mode: number, data: Uint8Array): Array<Buffer> => {
  const nameBytes = Buffer.from(`${name}\0`, "utf8")
  const header = Buffer.from(
    [
      "070701",
      hex8(ino),
      hex8(mode),
      hex8(0), // uid
      hex8(0), // gid
      hex8(1), // nlink
      hex8(0), // mtime
      hex8(data.length),
      hex8(0), // devmajor
      hex8(0), // devminor
      hex8(0), // rdevmajor
      hex8(0), // rdevminor
      hex8(nameBytes.length),
      hex8(0), // check
    ].join(""),
    "ascii",
  )
  return [header, nameBytes, pad4(header.length + nameBytes.length), Buffer.from(data), pad4(data.length)]
}

/** The archive holding `entries`, owned by root, with the trailer. */
export const newc = (entries: ReadonlyArray<Entry>): Buffer => {
  const parts: Array<Buffer> = []
  entries.forEach((e, i) => {
    const name = e.path.replace(/^\/+/, "")
    if (e.type === "dir") parts.push(...member(i + 1, name, 0o040000 | (e.mode ?? 0o755), new Uint8Array()))
    else if (e.type === "file") parts.push(...member(i + 1, name, 0o100000 | (e.mode ?? 0o644), e.data))
    else parts.push(...member(i + 1, name, 0o120777, Buffer.from(e.target, "utf8")))
  })
  parts.push(...member(0, "TRAILER!!!", 0, new Uint8Array()))
  return Buffer.concat(parts)
}

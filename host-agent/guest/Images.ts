/**
 * Recognises the image formats a `read` returns as pictures (PNG, JPEG, GIF, WebP) by their first
 * bytes, and reads their pixel size from the header without decoding them.
 */

export type ImageType = "image/png" | "image/jpeg" | "image/gif" | "image/webp"

/** Largest image a `read` returns: 3.75 MiB. */
export const IMAGE_MAX_BYTES = 3.75 * 1024 * 1024
/** Largest side of an image a `read` returns, in pixels. */
export const IMAGE_MAX_SIDE = 2000

const ascii = (b: Uint8Array, at: number, text: string) =>
  [...text].every((c, i) => b[at + i] === c.charCodeAt(0))

/** The image type of a file from its first 16 bytes, or undefined for anything else. */
export const sniff = (b: Uint8Array): ImageType | undefined => {
  if (b[0] === 0x89 && ascii(b, 1, "PNG\r\n\x1a\n")) return "image/png"
  if (b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return "image/jpeg"
  if (ascii(b, 0, "GIF87a") || ascii(b, 0, "GIF89a")) return "image/gif"
  if (ascii(b, 0, "RIFF") && ascii(b, 8, "WEBP")) return "image/webp"
  return undefined
}

/** The width and height in the header, or undefined when the header is damaged. */
export const dimensions = (type: ImageType, b: Buffer): { width: number; height: number } | undefined => {
  try {
    switch (type) {
      case "image/png":
        return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) }
      case "image/gif":
        return { width: b.readUInt16LE(6), height: b.readUInt16LE(8) }
      case "image/webp": {
        if (ascii(b, 12, "VP8 "))
          return { width: b.readUInt16LE(26) & 0x3fff, height: b.readUInt16LE(28) & 0x3fff }
        if (ascii(b, 12, "VP8L")) {
          const bits = b.readUInt32LE(21)
          return { width: (bits & 0x3fff) + 1, height: ((bits >> 14) & 0x3fff) + 1 }
        }
        if (ascii(b, 12, "VP8X")) return { width: b.readUIntLE(24, 3) + 1, height: b.readUIntLE(27, 3) + 1 }
        return undefined
      }
      case "image/jpeg": {
        let i = 2
        while (i + 9 < b.length) {
          if (b[i] !== 0xff) return undefined
          const marker = b[i + 1] as number
          if (marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc) {
            return { height: b.readUInt16BE(i + 5), width: b.readUInt16BE(i + 7) }
          }
          i += 2 + b.readUInt16BE(i + 2)
        }
        return undefined
      }
    }
  } catch {
    return undefined
  }
}

import { describe, expect, it } from "vitest"
import { dimensions, sniff } from "./Images.ts"
import { OutputKeeper } from "./Output.ts"

describe("OutputKeeper", () => {
  it("never cuts a character in two at the head/tail boundaries", () => {
    const k = new OutputKeeper(4)
    // "é" is 2 bytes: the head's 4 bytes end inside the second é, the tail starts inside one.
    k.push(Buffer.from("aéé-xyz-ééb"))
    const r = k.result()
    expect(r.output_bytes).toBe(15)
    expect(r.truncated).toBe(true)
    expect(r.output).toBe("aé\n[... 7 bytes omitted ...]\néb")
  })

  it("keeps everything when the output fits both parts, across chunks", () => {
    const k = new OutputKeeper(4)
    for (const c of ["ab", "cd", "ef", "gh"]) k.push(Buffer.from(c))
    expect(k.result()).toEqual({ output: "abcdefgh", output_bytes: 8, truncated: false })
  })
})

describe("image headers", () => {
  it("reads GIF, JPEG and WebP sizes", () => {
    const gif = Buffer.from("GIF89a\x10\x00\x20\x00", "latin1")
    expect(sniff(gif)).toBe("image/gif")
    expect(dimensions("image/gif", gif)).toEqual({ width: 16, height: 32 })
    // SOI, an APP0 segment of 4 bytes, then SOF0 with height 300 and width 2001.
    const jpeg = Buffer.from([
      0xff, 0xd8, 0xff, 0xe0, 0, 4, 0, 0, 0xff, 0xc0, 0, 17, 8, 0x01, 0x2c, 0x07, 0xd1, 3, 0, 0,
    ])
    expect(sniff(jpeg)).toBe("image/jpeg")
    expect(dimensions("image/jpeg", jpeg)).toEqual({ width: 2001, height: 300 })
    const webp = Buffer.alloc(30)
    webp.write("RIFF", 0, "latin1")
    webp.write("WEBPVP8X", 8, "latin1")
    webp.writeUIntLE(1999, 24, 3)
    webp.writeUIntLE(9, 27, 3)
    expect(sniff(webp)).toBe("image/webp")
    expect(dimensions("image/webp", webp)).toEqual({ width: 2000, height: 10 })
    expect(sniff(Buffer.from("hello world, not an image"))).toBeUndefined()
  })
})

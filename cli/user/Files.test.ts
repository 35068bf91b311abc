/**
 * `Files.ts` on its own: packing refuses what the service would refuse (links, special files),
 * unpacking refuses any archive that would write a link, a special file or outside the target, and
 * leaves nothing behind when it refuses; a packed folder comes back byte for byte; a folder is
 * sent as the pack that counted it, with nothing written to disk, and one changed in between is
 * refused. Archives are crafted with node-tar's `Header`, served from (and uploads sent to) a
 * local HTTP server; the API that answers the upload link is a stand-in (the CLI tests in
 * `test/` send folders to the real gateway).
 */
import { spawnSync } from "node:child_process"
import { createHash, randomBytes } from "node:crypto"
import {
  existsSync,
  linkSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs"
import http from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join, relative } from "node:path"
import { gunzipSync, gzipSync } from "node:zlib"
import { Header } from "tar"
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest"
import type { Api } from "./Api.ts"
import { downloadAndUnpack, downloadFile, packFolder, tarBytes, uploadFolder } from "./Files.ts"
import type { Out } from "./Print.ts"

const out: Out = { json: false, tty: false, color: false }

// Every test works in a folder of its own, and TMPDIR points inside it so the module's temporary
// files can be seen (and seen gone).
let work: string
let temp: string
let savedTmp: string | undefined
beforeEach(() => {
  work = mkdtempSync(join(tmpdir(), "hangar-files-test-"))
  temp = join(work, "tmp")
  mkdirSync(temp)
  savedTmp = process.env.TMPDIR
  process.env.TMPDIR = temp
})
afterEach(() => {
  if (savedTmp === undefined) delete process.env.TMPDIR
  else process.env.TMPDIR = savedTmp
  rmSync(work, { recursive: true, force: true })
})

// Archives served by path; uploads (PUT) received whole by path, and every PUT begun. An upload
// whose SHA-256 is not the one announced for its path is refused as the gateway refuses it.
const served = new Map<string, Buffer>()
const received = new Map<string, Buffer>()
const begun: Array<string> = []
const announcedSha = new Map<string, string>()
let server: http.Server
let base: string
beforeAll(async () => {
  server = http.createServer((req, res) => {
    if (req.method === "PUT") {
      begun.push(req.url ?? "")
      const parts: Array<Buffer> = []
      req.on("data", (c: Buffer) => parts.push(c))
      req.on("end", () => {
        const body = Buffer.concat(parts)
        const digest = createHash("sha256").update(body).digest("hex")
        if (digest !== announcedSha.get(req.url ?? "")) {
          res.writeHead(400, { "content-type": "application/json" })
          return res.end(
            JSON.stringify({
              error: `sha256: the body's SHA-256 is ${digest}, not the one announced`,
              code: "invalid_request",
            }),
          )
        }
        received.set(req.url ?? "", body)
        res.end()
      })
      return
    }
    const body = served.get(req.url ?? "")
    if (body === undefined) {
      res.writeHead(404, { "content-type": "application/json" })
      return res.end(JSON.stringify({ error: "no such object", code: "not_found" }))
    }
    res.writeHead(200, { "content-type": "application/gzip", "content-length": String(body.length) })
    res.end(body)
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())))

const serve = (name: string, body: Buffer) => {
  const path = `/${name.replace(/[^a-z0-9.]+/gi, "-")}`
  served.set(path, body)
  return `${base}${path}`
}

/** An API that must not be called (packing refused before the upload is announced). */
const noApi: Api = {
  base: "http://127.0.0.1:9",
  key: () => "unused",
  call: async () => {
    throw new Error("the API was called")
  },
}

// One crafted tar entry (a header, then data padded to a block).
type Crafted = {
  readonly path: string
  readonly type: "File" | "Directory" | "SymbolicLink" | "Link" | "FIFO" | "CharacterDevice"
  readonly data?: string
  readonly linkpath?: string
}
const crafted = (entries: ReadonlyArray<Crafted>): Buffer => {
  const parts: Array<Buffer> = []
  for (const e of entries) {
    const data = Buffer.from(e.data ?? "")
    const h = new Header({
      path: e.path,
      type: e.type,
      size: data.length,
      mode: e.type === "Directory" ? 0o755 : 0o644,
      mtime: new Date(0),
      uid: 0,
      gid: 0,
      ...(e.linkpath ? { linkpath: e.linkpath } : {}),
    })
    h.encode()
    parts.push(h.block as Buffer, data, Buffer.alloc((512 - (data.length % 512)) % 512))
  }
  parts.push(Buffer.alloc(1024))
  return gzipSync(Buffer.concat(parts))
}

/** Every file and folder under `dir` (relative), with the files' SHA-256. */
const tree = (dir: string): Record<string, string> => {
  const found: Record<string, string> = {}
  const walk = (at: string) => {
    for (const name of readdirSync(at)) {
      const p = join(at, name)
      const s = lstatSync(p)
      if (s.isDirectory()) {
        found[`${relative(dir, p)}/`] = "dir"
        walk(p)
      } else
        found[relative(dir, p)] = s.isFile()
          ? createHash("sha256").update(readFileSync(p)).digest("hex")
          : "other"
    }
  }
  walk(dir)
  return found
}

const refusalOf = async (promise: Promise<unknown>): Promise<string> => {
  try {
    await promise
  } catch (e) {
    return (e as Error).message
  }
  throw new Error("it was not refused")
}

describe("packing", () => {
  it("refuses a folder holding a symbolic link, naming it, before anything is uploaded", async () => {
    const dir = join(work, "src")
    mkdirSync(join(dir, "a", "b"), { recursive: true })
    writeFileSync(join(dir, "a", "file.txt"), "x")
    symlinkSync("/etc/passwd", join(dir, "a", "b", "link"))
    const message = await refusalOf(uploadFolder(noApi, out, dir))
    expect(message).toContain(join(dir, "a", "b", "link"))
    expect(message).toContain("symbolic link")
    expect(readdirSync(temp)).toEqual([])
  })

  it("refuses a fifo in the folder", async () => {
    const dir = join(work, "src")
    mkdirSync(dir)
    expect(spawnSync("mkfifo", [join(dir, "pipe")]).status).toBe(0)
    const message = await refusalOf(uploadFolder(noApi, out, dir))
    expect(message).toContain(join(dir, "pipe"))
    expect(message).toContain("fifo")
    expect(readdirSync(temp)).toEqual([])
  })

  it("refuses a link while packing too (node-tar's filter: one swapped in after the walk)", async () => {
    const dir = join(work, "src")
    mkdirSync(dir)
    writeFileSync(join(dir, "ok.txt"), "ok")
    symlinkSync("/etc", join(dir, "later"))
    const archive = join(work, "a.tar.gz")
    const message = await refusalOf(packFolder(dir, archive))
    expect(message).toContain(join(dir, "later"))
  })

  it("packs hard-linked files as two regular files, paths relative to the folder, readable by GNU tar", async () => {
    const dir = join(work, "src")
    mkdirSync(join(dir, "sub", "empty"), { recursive: true })
    writeFileSync(join(dir, "one.txt"), "same bytes")
    linkSync(join(dir, "one.txt"), join(dir, "sub", "two.txt"))
    const archive = join(work, "a.tar.gz")
    const counted = await packFolder(dir, archive)
    const bytes = readFileSync(archive)
    expect(counted.bytes).toBe(bytes.length)
    expect(counted.sha256).toBe(createHash("sha256").update(bytes).digest("hex"))
    const listed = spawnSync("tar", ["-tvzf", archive], { encoding: "utf8" })
    expect(listed.status).toBe(0)
    const lines = listed.stdout.trim().split("\n")
    // Regular files (-) and folders (d) only: no hard link (h).
    for (const line of lines) expect(line[0]).toMatch(/[-d]/)
    const names = lines.map((l) => l.split(/\s+/).at(-1)).sort()
    expect(names).toEqual(["./", "./one.txt", "./sub/", "./sub/empty/", "./sub/two.txt"])
  })

  it("comes back byte for byte through downloadAndUnpack (several gzip members, nested folders)", async () => {
    const dir = join(work, "src")
    mkdirSync(join(dir, "deep", "er", "still"), { recursive: true })
    mkdirSync(join(dir, "empty"))
    writeFileSync(join(dir, "big.bin"), randomBytes(9 * 1024 * 1024 + 17))
    writeFileSync(join(dir, "deep", "er", "still", "small.txt"), "hello\n")
    writeFileSync(join(dir, "deep", "zeros"), Buffer.alloc(3 * 1024 * 1024))
    writeFileSync(join(dir, "empty.txt"), "")
    const archive = join(work, "a.tar.gz")
    const counted = await packFolder(dir, archive)
    const target = join(work, "back")
    await downloadAndUnpack(out, serve("round.tar.gz", readFileSync(archive)), counted.sha256, target)
    expect(tree(target)).toEqual(tree(dir))
    expect(readdirSync(temp)).toEqual([])
  })
})

/** An API whose `POST /v1/files` answers a link to this server's `/upload/<name>` (after `onPost`). */
const uploadApi = (name: string, onPost: () => void = () => undefined) => {
  const announced: Array<{ bytes: number; sha256: string }> = []
  const api: Api = {
    base,
    key: () => "unused",
    call: async <T>(method: string, path: string, body?: unknown) => {
      expect(`${method} ${path}`).toBe("POST /v1/files")
      announced.push(body as { bytes: number; sha256: string })
      announcedSha.set(`/upload/${name}`, (body as { sha256: string }).sha256)
      onPost()
      const { bytes } = body as { bytes: number }
      return {
        id: `file_${name}`,
        url: `${base}/upload/${name}`,
        method: "PUT",
        headers: { "content-length": String(bytes), "content-type": "application/gzip" },
      } as T
    },
  }
  return { api, announced }
}

describe("uploading a folder", () => {
  it("sends the bytes the counting pack announced, a .tar.gz byte for byte like packFolder's, writing nothing to disk", async () => {
    const dir = join(work, "src")
    mkdirSync(join(dir, "deep"), { recursive: true })
    writeFileSync(join(dir, "big.bin"), randomBytes(9 * 1024 * 1024 + 5))
    writeFileSync(join(dir, "deep", "zeros"), Buffer.alloc(5 * 1024 * 1024))
    writeFileSync(join(dir, "small.txt"), "hello\n")
    const { api, announced } = uploadApi("whole")
    expect(await uploadFolder(api, out, dir)).toBe("file_whole")
    const body = received.get("/upload/whole")
    expect(body).toBeDefined()
    expect(announced).toEqual([
      { bytes: body!.length, sha256: createHash("sha256").update(body!).digest("hex") },
    ])
    expect(readdirSync(temp)).toEqual([])
    const archive = join(work, "a.tar.gz")
    await packFolder(dir, archive)
    expect(readFileSync(archive).equals(body!)).toBe(true)
    const target = join(work, "back")
    await downloadAndUnpack(out, serve("sent.tar.gz", body!), announced[0]!.sha256, target)
    expect(tree(target)).toEqual(tree(dir))
  })

  // A size change is seen as the bytes go; any other by the gateway's SHA-256 check, whose
  // refusal is answered the same.
  for (const [what, name, after] of [
    ["of size", "grows", "after, and longer\n"],
    ["of the same size", "same-size", "after!\n"],
  ] as const)
    it(`a folder changed between the count and the send (${what}) is refused naming it, sent once and not kept`, async () => {
      const dir = join(work, "src")
      mkdirSync(dir)
      writeFileSync(join(dir, "note.txt"), "before\n")
      writeFileSync(join(dir, "big.bin"), randomBytes(6 * 1024 * 1024))
      const { api } = uploadApi(name, () => writeFileSync(join(dir, "note.txt"), after))
      const message = await refusalOf(uploadFolder(api, out, dir))
      expect(message).toContain(dir)
      expect(message).toContain("changed while it was being uploaded")
      expect(begun.filter((u) => u === `/upload/${name}`)).toHaveLength(1)
      expect(received.has(`/upload/${name}`)).toBe(false)
      expect(readdirSync(temp)).toEqual([])
    })
})

describe("packing progress", () => {
  it("counts against the tar's own size: headers, whole blocks, long and non-ASCII names, the end blocks", async () => {
    const dir = join(work, "src")
    mkdirSync(join(dir, "deep", "deeper"), { recursive: true })
    mkdirSync(join(dir, "empty"))
    writeFileSync(join(dir, "q.txt"), "6*7\n")
    writeFileSync(join(dir, "none"), "")
    writeFileSync(join(dir, "block"), Buffer.alloc(512, 1))
    writeFileSync(join(dir, "block+1"), Buffer.alloc(513, 1))
    writeFileSync(join(dir, "é.txt"), "accent")
    writeFileSync(join(dir, "deep", "x".repeat(99)), "at the line")
    writeFileSync(join(dir, "deep", "y".repeat(101)), "past it, one name")
    writeFileSync(join(dir, "deep", "deeper", "z".repeat(90)), "split at a slash")
    const archive = join(work, "a.tar.gz")
    await packFolder(dir, archive)
    expect(await tarBytes(dir)).toBe(gunzipSync(readFileSync(archive)).length)
  })

  it("prints one final line for a short upload, its bytes out of the tar's", async () => {
    const dir = join(work, "question")
    mkdirSync(dir)
    writeFileSync(join(dir, "q.txt"), "6*7\n")
    const lines: Array<string> = []
    const write = process.stderr.write
    process.stderr.write = ((chunk: string) => {
      lines.push(
        ...String(chunk)
          .split("\n")
          .filter((l) => l !== ""),
      )
      return true
    }) as typeof process.stderr.write
    try {
      expect(await uploadFolder(uploadApi("progress").api, out, dir)).toBe("file_progress")
    } finally {
      process.stderr.write = write
    }
    const packing = lines.filter((l) => l.startsWith("packing question"))
    expect(packing).toEqual([expect.stringMatching(/^packing question 100% 2\.6 kB\/2\.6 kB /)])
    expect(lines.filter((l) => l.startsWith("uploading"))).toHaveLength(1)
  })
})

describe("gzip levels", () => {
  it("stores what level 1 would not shrink (random data) and compresses the rest; GNU tar reads both", async () => {
    for (const [name, data, most] of [
      ["random", randomBytes(12 * 1024 * 1024), 1.01],
      ["zeros", Buffer.alloc(12 * 1024 * 1024), 0.01],
    ] as const) {
      const dir = join(work, `levels-${name}`)
      mkdirSync(dir)
      writeFileSync(join(dir, "data.bin"), data)
      const archive = join(work, `levels-${name}.tar.gz`)
      const counted = await packFolder(dir, archive)
      expect(counted.bytes / data.length).toBeLessThan(most)
      const listed = spawnSync("tar", ["-tzvf", archive], { encoding: "utf8" })
      expect(listed.status, listed.stderr).toBe(0)
      expect(listed.stdout).toContain(String(data.length))
    }
  })
})

describe("unpacking refuses", () => {
  const outside = () => join(work, "outside")

  const cases: ReadonlyArray<readonly [string, ReadonlyArray<Crafted>, string]> = [
    ["a ../ path", [{ path: "../outside", type: "File", data: "escaped" }], "paths with .. are refused"],
    [
      "a ../ path deeper in",
      [
        { path: "a/", type: "Directory" },
        { path: "a/../../outside", type: "File", data: "escaped" },
      ],
      "paths with .. are refused",
    ],
    ["an absolute path", [{ path: "/ABSOLUTE/outside", type: "File", data: "escaped" }], "absolute paths"],
    [
      "a symbolic link entry",
      [{ path: "link", type: "SymbolicLink", linkpath: "../outside" }],
      "symbolic links",
    ],
    [
      "a hard link entry",
      [
        { path: "ok.txt", type: "File", data: "fine" },
        { path: "hard", type: "Link", linkpath: "../outside" },
      ],
      "hard links",
    ],
    ["a fifo entry", [{ path: "pipe", type: "FIFO" }], "FIFO"],
    ["a device entry", [{ path: "dev", type: "CharacterDevice" }], "CharacterDevice"],
  ]

  for (const [what, entries, says] of cases)
    it(`${what}, writing nothing at all`, async () => {
      const abs = entries.find((e) => e.path.startsWith("/ABSOLUTE"))
      const archive = abs
        ? crafted(entries.map((e) => ({ ...e, path: e.path.replace("/ABSOLUTE", work) })))
        : crafted(entries)
      const target = join(work, "target")
      const message = await refusalOf(
        downloadAndUnpack(out, serve(`${what}.tar.gz`, archive), undefined, target),
      )
      expect(message).toContain(says)
      expect(message).toContain("nothing was unpacked")
      expect(existsSync(outside())).toBe(false)
      expect(existsSync(target)).toBe(false)
      expect(readdirSync(temp)).toEqual([])
    })

  it("a download whose SHA-256 is not the one announced, unpacking nothing", async () => {
    const archive = crafted([{ path: "a.txt", type: "File", data: "a" }])
    const target = join(work, "target")
    const message = await refusalOf(
      downloadAndUnpack(out, serve("sha.tar.gz", archive), "0".repeat(64), target),
    )
    expect(message).toContain("SHA-256")
    expect(message).toContain("nothing was unpacked")
    expect(existsSync(target)).toBe(false)
    expect(readdirSync(temp)).toEqual([])
  })

  it("something that is not a .tar.gz", async () => {
    const message = await refusalOf(
      downloadAndUnpack(
        out,
        serve("junk.tar.gz", Buffer.concat([Buffer.from([0x1f, 0x8b, 8, 0]), randomBytes(4000)])),
        undefined,
        join(work, "t"),
      ),
    )
    expect(message).toContain("nothing was unpacked")
    expect(existsSync(join(work, "t"))).toBe(false)
  })

  it("a refused download (the API's error body) as the API's refusal", async () => {
    const message = await refusalOf(downloadAndUnpack(out, `${base}/missing`, undefined, join(work, "t")))
    expect(message).toContain("not_found")
    expect(existsSync(join(work, "t"))).toBe(false)
  })
})

describe("unpacking never follows a link already in the target out of it", () => {
  it("a folder that is a link to outside, named by the archive: the link is replaced by a folder", async () => {
    const target = join(work, "target")
    mkdirSync(target)
    mkdirSync(join(work, "outside"))
    symlinkSync(join(work, "outside"), join(target, "evil"))
    const archive = crafted([
      { path: "evil/", type: "Directory" },
      { path: "evil/x.txt", type: "File", data: "escaped" },
    ])
    await downloadAndUnpack(out, serve("evil-dir.tar.gz", archive), undefined, target)
    expect(readdirSync(join(work, "outside"))).toEqual([])
    expect(lstatSync(join(target, "evil")).isDirectory()).toBe(true)
    expect(readFileSync(join(target, "evil", "x.txt"), "utf8")).toBe("escaped")
  })

  it("a folder that is a link to outside, only under a file's path: refused, nothing lands outside", async () => {
    const target = join(work, "target")
    mkdirSync(target)
    mkdirSync(join(work, "outside"))
    symlinkSync(join(work, "outside"), join(target, "evil"))
    const archive = crafted([{ path: "evil/x.txt", type: "File", data: "escaped" }])
    const message = await refusalOf(
      downloadAndUnpack(out, serve("evil-parent.tar.gz", archive), undefined, target),
    )
    expect(message).toMatch(/symlink/i)
    expect(readdirSync(join(work, "outside"))).toEqual([])
  })

  it("a file that is a link to outside: the link is replaced, the outside file is untouched", async () => {
    const target = join(work, "target")
    mkdirSync(target)
    writeFileSync(join(work, "outside.txt"), "original")
    symlinkSync(join(work, "outside.txt"), join(target, "evil.txt"))
    const archive = crafted([{ path: "evil.txt", type: "File", data: "new content" }])
    await downloadAndUnpack(out, serve("evil-file.tar.gz", archive), undefined, target)
    expect(readFileSync(join(work, "outside.txt"), "utf8")).toBe("original")
    expect(lstatSync(join(target, "evil.txt")).isFile()).toBe(true)
    expect(readFileSync(join(target, "evil.txt"), "utf8")).toBe("new content")
  })
})

describe("downloadFile", () => {
  it("writes the file whole through a temporary file beside it, and leaves nothing on a refusal", async () => {
    const data = randomBytes(3 * 1024 * 1024)
    const target = join(work, "dl", "file.bin")
    expect(await downloadFile(out, serve("file.bin", data), target)).toBe(data.length)
    expect(readFileSync(target).equals(data)).toBe(true)
    expect(readdirSync(join(work, "dl"))).toEqual(["file.bin"])
    await refusalOf(downloadFile(out, `${base}/missing`, join(work, "dl", "other.bin")))
    expect(readdirSync(join(work, "dl"))).toEqual(["file.bin"])
  })
})

import { spawnSync } from "node:child_process"
import { createHash } from "node:crypto"
import { Chunk, Effect, Option, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { SealStream } from "../../core/SealStream.ts"
import { storageRuntime } from "../../test/harness/NatsServer.ts"
import { uniqueName } from "../../test/harness/names.ts"
import { type Compressor, inspect, list, pack } from "./Outputs.ts"
import { store, type TestGuest, testGuest } from "./testing.ts"

const ACC = "acc_0000000000000000000000000b"
let t: TestGuest
const runtime = storageRuntime()

beforeAll(async () => {
  t = await testGuest("out")
}, 15 * 60_000)

afterAll(async () => {
  await runtime.dispose()
  expect(await t.close()).toEqual([])
})

const sh = async (command: string) => (await Effect.runPromise(t.guest.bash({ command }))).output

// Packs the output, then reads the stored object back through SealStream open.
const packAndOpen = (compressor?: Compressor) =>
  runtime.runPromise(
    Effect.gen(function* () {
      const outputs = yield* store("outputs")
      const seal = yield* SealStream
      const name = uniqueName("run")
      const packed = yield* pack(
        t.guest,
        { store: outputs, account: ACC, name },
        compressor ? { compressor } : {},
      )
      const found = Option.getOrThrow(yield* outputs.get(name))
      const opened = Buffer.concat(
        Chunk.toReadonlyArray(yield* Stream.runCollect(found.data.pipe(seal.open(ACC, name)))),
      )
      return { packed, opened }
    }),
  )

const tarList = (archive: Buffer) => {
  const r = spawnSync("tar", ["-tzf", "-"], { input: archive })
  expect(r.status).toBe(0)
  return r.stdout
    .toString("utf8")
    .split("\n")
    .filter((l) => l !== "")
    .sort()
}

describe("outputs", () => {
  it("an empty or absent /workspace/out packs to an empty archive", async () => {
    await sh("rm -rf /workspace/out")
    const { packed, opened } = await packAndOpen()
    expect(packed.file_count).toBe(0)
    expect(packed.files).toEqual([])
    expect(packed.bytes).toBe(opened.length)
    expect(packed.sha256).toBe(createHash("sha256").update(opened).digest("hex"))
    expect(tarList(opened)).toEqual(["./"])
  })

  it("nested files: listed with sizes, archived whole, hashed as stored", async () => {
    await sh(
      "rm -rf /workspace/out; mkdir -p /workspace/out/a/b /workspace/out/empty; echo hi > /workspace/out/a/b/c.txt; head -c 70000 /dev/urandom > /workspace/out/r.bin; echo top > '/workspace/out/with space'",
    )
    for (const compressor of ["guest", "host"] as const) {
      const { packed, opened } = await packAndOpen(compressor)
      expect(packed.files).toEqual([
        { path: "a", bytes: 0, dir: true },
        { path: "a/b", bytes: 0, dir: true },
        { path: "a/b/c.txt", bytes: 3, dir: false },
        { path: "empty", bytes: 0, dir: true },
        { path: "r.bin", bytes: 70000, dir: false },
        { path: "with space", bytes: 4, dir: false },
      ])
      expect(packed.file_count).toBe(6)
      expect(packed.bytes).toBe(opened.length)
      expect(packed.sha256).toBe(createHash("sha256").update(opened).digest("hex"))
      expect(opened[0]).toBe(0x1f)
      expect(tarList(opened)).toEqual([
        "./",
        "./a/",
        "./a/b/",
        "./a/b/c.txt",
        "./empty/",
        "./r.bin",
        "./with space",
      ])
      const r = spawnSync("bash", ["-c", "tar -xzOf - ./r.bin | sha256sum"], { input: opened })
      expect(r.stdout.toString().slice(0, 64)).toBe(
        (await sh("sha256sum < /workspace/out/r.bin")).slice(0, 64),
      )
    }
  })

  it("lists 1,000 of 1,001 files and counts all of them", async () => {
    await sh(
      "rm -rf /workspace/out; mkdir -p /workspace/out; cd /workspace/out; for i in $(seq -w 1 1001); do echo $i > f$i; done",
    )
    const { packed, opened } = await packAndOpen()
    expect(packed.file_count).toBe(1001)
    expect(packed.files).toHaveLength(1000)
    expect(packed.files[0]).toEqual({ path: "f0001", bytes: 5, dir: false })
    expect(packed.files[999]?.path).toBe("f1000")
    expect(tarList(opened)).toHaveLength(1002)
  })

  it("sorts by the path's bytes, as LC_ALL=C sort: capitals first, a newline before a space, UTF-8 last", async () => {
    await sh(
      "rm -rf /workspace/out; mkdir -p /workspace/out/Z; cd /workspace/out; : > a; : > B; : > Z/x; : > 'a b'; : > $'a\\nb'; echo é > é",
    )
    const listing = await Effect.runPromise(list(t.guest))
    expect(listing.files.map((f) => f.path)).toEqual(["B", "Z", "Z/x", "a", "a\nb", "a b", "é"])
    expect(listing.files.at(-1)).toEqual({ path: "é", bytes: 3, dir: false })
    expect(listing.file_count).toBe(7)
  })

  it("of 2,500 entries lists the first 1,000 by path and counts them all", async () => {
    // Made in reverse, so the first by path are found last (ext4 gives its own order anyway).
    await sh(
      "rm -rf /workspace/out; mkdir -p /workspace/out; cd /workspace/out; for i in $(seq -w 2500 -1 1); do : > f$i; done",
    )
    const listing = await Effect.runPromise(list(t.guest))
    expect(listing.file_count).toBe(2500)
    expect(listing.files.map((f) => f.path)).toEqual(
      Array.from({ length: 1000 }, (_, i) => `f${String(i + 1).padStart(4, "0")}`),
    )
  })

  it("lists a path of 4,000 bytes, far over no cap of a record's", async () => {
    // 16 folders of 249 bytes and a file: the longest paths Linux takes are about this long.
    const folder = Array.from(
      { length: 16 },
      (_, i) => `${String(i).padStart(2, "0")}${"x".repeat(247)}`,
    ).join("/")
    await sh(`rm -rf /workspace/out; mkdir -p /workspace/out/${folder}; echo hi > /workspace/out/${folder}/f`)
    const listing = await Effect.runPromise(list(t.guest))
    expect(listing.file_count).toBe(17)
    expect(listing.files.at(-1)).toEqual({ path: `${folder}/f`, bytes: 3, dir: false })
    expect(Buffer.byteLength(`${folder}/f`)).toBe(4001)
  })

  describe("a listing program the tenant replaced (a find earlier on PATH)", () => {
    const fake = (body: string) =>
      sh(`printf '%s\\n' '#!/bin/bash' '${body}' > /usr/local/bin/find && chmod +x /usr/local/bin/find`)
    afterAll(() => sh("rm -f /usr/local/bin/find"))

    it("a record without its end fails the listing at 8 KiB, without waiting for the rest", async () => {
      await fake('head -c 10000 /dev/zero | tr "\\0" a; exec sleep 600')
      const exit = await Effect.runPromiseExit(list(t.guest))
      expect(String(exit)).toContain("output listing: a record over 8192 bytes")
    })

    it("status 1 (an entry it could not read) lists what it found; any other status fails", async () => {
      await fake('printf "f 3 kept\\0"; exit 1')
      expect(await Effect.runPromise(list(t.guest))).toEqual({
        files: [{ path: "kept", bytes: 3, dir: false }],
        file_count: 1,
      })
      await fake('printf "f 3 kept\\0"; echo broken >&2; exit 2')
      expect(String(await Effect.runPromiseExit(list(t.guest)))).toContain(
        "output listing failed (exit 2): broken",
      )
      await fake('printf "f 3 cut"')
      expect(String(await Effect.runPromiseExit(list(t.guest)))).toContain("output listing failed (exit 0)")
    })
  })

  it("reports output manifest problems, with max_bytes checked at the boundary", async () => {
    await sh(
      "rm -rf /workspace/out; mkdir -p /workspace/out/data; head -c 100 /dev/zero > /workspace/out/report.txt; head -c 50 /dev/zero > /workspace/out/data/x; ln -s report.txt /workspace/out/link",
    )
    const check = async (manifest: ReadonlyArray<{ path: string; max_bytes: number }>) =>
      (await Effect.runPromise(inspect(t.guest, manifest))).problems
    expect(
      await check([
        { path: "report.txt", max_bytes: 100 },
        { path: "data/", max_bytes: 50 },
      ]),
    ).toEqual([])
    expect(
      await check([
        { path: "report.txt", max_bytes: 99 },
        { path: "data/", max_bytes: 49 },
        { path: "summary.md", max_bytes: 10 },
        { path: "charts/", max_bytes: 10 },
        { path: "link", max_bytes: 1000 },
      ]),
    ).toEqual([
      { path: "report.txt", detail: "report.txt: is 100 bytes, more than its max_bytes 99" },
      { path: "data/", detail: "data/: holds 50 bytes, more than its max_bytes 49" },
      { path: "summary.md", detail: "summary.md: missing" },
      { path: "charts/", detail: "charts/: folder missing" },
      { path: "link", detail: "link: is a link, not a file" },
    ])
  })

  it("answers the manifest and lists the folder in one pass, as the archive has them: links not followed", async () => {
    await sh(
      [
        "rm -rf /workspace/out /workspace/elsewhere; mkdir -p /workspace/out/d/e /workspace/out/dd /workspace/elsewhere",
        "cd /workspace/out; head -c 10 /dev/zero > d/a; head -c 20 /dev/zero > d/e/b; head -c 40 /dev/zero > dd/c",
        "head -c 7 /dev/zero > /workspace/elsewhere/f; ln -s /workspace/elsewhere linked; ln -s d/a alink; mkfifo pipe",
      ].join("; "),
    )
    const { problems, listing } = await Effect.runPromise(
      inspect(t.guest, [
        // Every regular file anywhere inside, none of the folder `dd` that only starts alike.
        { path: "d/", max_bytes: 29 },
        { path: "d/e/", max_bytes: 19 },
        { path: "d/e/b", max_bytes: 20 },
        // Through a linked folder is not in the folder (the archive keeps the link only).
        { path: "linked/f", max_bytes: 100 },
        { path: "linked/", max_bytes: 100 },
        { path: "alink", max_bytes: 100 },
        { path: "pipe", max_bytes: 100 },
        { path: "pipe/", max_bytes: 100 },
        { path: "d/a/", max_bytes: 100 },
        { path: "d/e", max_bytes: 100 },
      ]),
    )
    expect(problems.map((p) => p.detail)).toEqual([
      "d/: holds 30 bytes, more than its max_bytes 29",
      "d/e/: holds 20 bytes, more than its max_bytes 19",
      "linked/f: missing",
      "linked/: is a link, not a folder",
      "alink: is a link, not a file",
      "pipe: is not a regular file",
      "pipe/: is not a regular folder",
      "d/a/: is a file, not a folder",
      "d/e: is a folder, not a file",
    ])
    // Files and folders only; the links and the pipe are not listed nor counted.
    expect(listing).toEqual({
      files: [
        { path: "d", bytes: 0, dir: true },
        { path: "d/a", bytes: 10, dir: false },
        { path: "d/e", bytes: 0, dir: true },
        { path: "d/e/b", bytes: 20, dir: false },
        { path: "dd", bytes: 0, dir: true },
        { path: "dd/c", bytes: 40, dir: false },
      ],
      file_count: 6,
    })
    await sh("rm -rf /workspace/elsewhere")
  })
})

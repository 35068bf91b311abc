import { spawnSync } from "node:child_process"
import { createHash, randomBytes } from "node:crypto"
import { Chunk, Effect, Option, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { SealStream } from "../../core/SealStream.ts"
import { storageRuntime } from "../../test/harness/NatsServer.ts"
import { uniqueName } from "../../test/harness/names.ts"
import { type GetResult, get, put } from "./Transfer.ts"
import { store, type TestGuest, testGuest } from "./testing.ts"

const ACC = "acc_0000000000000000000000000c"
let t: TestGuest
const runtime = storageRuntime()

beforeAll(async () => {
  t = await testGuest("xfer", { diskBytes: 48 * 1024 * 1024 })
}, 15 * 60_000)

afterAll(async () => {
  await runtime.dispose()
  expect(await t.close()).toEqual([])
})

const sh = async (command: string) => (await Effect.runPromise(t.guest.bash({ command }))).output
const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex")

// Seals `bytes` into the files store as an upload; its name.
const upload = (bytes: Buffer) =>
  runtime.runPromise(
    Effect.gen(function* () {
      const files = yield* store("files")
      const seal = yield* SealStream
      const name = uniqueName("file")
      const pieces: Array<Buffer> = []
      for (let at = 0; at < bytes.length; at += 70_000) pieces.push(bytes.subarray(at, at + 70_000))
      yield* files.put(name, Stream.fromIterable(pieces).pipe(seal.seal(ACC, name)))
      return name
    }),
  )

const putFile = (file: string, path: string) =>
  runtime.runPromise(
    Effect.flatMap(store("files"), (files) => put(t.guest, { store: files, account: ACC }, { file, path })),
  )

// Gets `path` into a fresh object and reads the object back opened.
const getPath = (path: string, maxBytes?: number) =>
  runtime.runPromise(
    Effect.gen(function* () {
      const files = yield* store("files")
      const seal = yield* SealStream
      const name = uniqueName("get")
      const result: GetResult = yield* get(t.guest, { store: files, account: ACC, name }, { path }, maxBytes)
      const found = yield* files.get(name)
      const opened = Option.isNone(found)
        ? undefined
        : Buffer.concat(
            Chunk.toReadonlyArray(yield* Stream.runCollect(found.value.data.pipe(seal.open(ACC, name)))),
          )
      return { result, opened }
    }),
  )

describe("put and get", () => {
  it("put streams an upload into a new file, making parents; get returns the same bytes", async () => {
    const data = randomBytes(1_500_000)
    const file = await upload(data)
    expect(await putFile(file, "deep/er/data.bin")).toEqual({ bytes: data.length })
    expect((await sh("sha256sum /workspace/deep/er/data.bin")).slice(0, 64)).toBe(sha(data))
    expect(await sh("stat -c %a /workspace/deep/er/data.bin; ls -A /workspace/deep/er")).toBe(
      "644\ndata.bin\n",
    )
    const { result, opened } = await getPath("deep/er/data.bin")
    expect(result).toMatchObject({ kind: "file", bytes: data.length, sha256: sha(data) })
    expect(opened && sha(opened)).toBe(sha(data))
  })

  it("put replaces an existing file, keeping its mode; an empty upload makes an empty file", async () => {
    await sh("echo old > /workspace/replace.sh; chmod 750 /workspace/replace.sh")
    expect(await putFile(await upload(Buffer.from("new\n")), "/workspace/replace.sh")).toEqual({ bytes: 4 })
    expect(await sh("cat /workspace/replace.sh; stat -c %a /workspace/replace.sh")).toBe("new\n750\n")
    expect(await putFile(await upload(Buffer.alloc(0)), "empty")).toEqual({ bytes: 0 })
    expect(await sh("stat -c %s /workspace/empty")).toBe("0\n")
  })

  it("put answers with an error for a folder path or a missing upload, and leaves nothing behind", async () => {
    await sh("mkdir -p /workspace/afolder")
    const file = await upload(Buffer.from("x"))
    expect(await putFile(file, "afolder")).toEqual({ error: "/workspace/afolder: is a folder" })
    expect(await putFile("file_missing", "x")).toEqual({ error: "file_missing: no such upload" })
    expect(await sh("ls -A /workspace/afolder; ls -A /workspace | grep put- ; true")).toBe("")
  })

  it("put answers at once when the machine floods the line it reads the temporary file's name from", async () => {
    // A tenant's own mktemp (earlier on PATH) whose name is 20 MiB: the host agent reads 8 KiB of
    // it, finds no name, and answers without taking the rest.
    await sh(
      `printf '%s\\n' '#!/bin/bash' 'head -c 20M /dev/zero | tr "\\0" a' > /usr/local/bin/mktemp && chmod +x /usr/local/bin/mktemp`,
    )
    try {
      expect(await putFile(await upload(Buffer.from("x")), "flood")).toEqual({
        error: "/workspace/flood: could not be written",
      })
    } finally {
      await sh("rm -f /usr/local/bin/mktemp")
    }
  })

  it("put into a full disk answers with the guest's error and leaves no partial file", async () => {
    await sh("echo keep > /workspace/big.bin")
    const file = await upload(randomBytes(60 * 1024 * 1024))
    const r = await putFile(file, "big.bin")
    expect(r).toMatchObject({ error: expect.stringContaining("No space left on device") })
    expect(await sh("cat /workspace/big.bin; ls -A /workspace | grep put- ; true")).toBe("keep\n")
  })

  it("get returns a folder as a .tar.gz of the same files", async () => {
    await sh(
      "rm -rf /workspace/tree; mkdir -p /workspace/tree/sub/empty; head -c 200000 /dev/urandom > /workspace/tree/sub/r; echo a > /workspace/tree/a",
    )
    const { result, opened } = await getPath("tree")
    expect(result).toMatchObject({ kind: "folder" })
    if (!opened || "error" in result) throw new Error("no archive")
    expect(result.bytes).toBe(opened.length)
    expect(result.sha256).toBe(sha(opened))
    const listed = spawnSync("tar", ["-tzf", "-"], { input: opened }).stdout.toString().split("\n").sort()
    expect(listed).toEqual(["", "./", "./a", "./sub/", "./sub/empty/", "./sub/r"])
    const inner = spawnSync("bash", ["-c", "tar -xzOf - ./sub/r | sha256sum"], { input: opened })
    expect(inner.stdout.toString().slice(0, 64)).toBe(
      (await sh("sha256sum < /workspace/tree/sub/r")).slice(0, 64),
    )
  })

  it("get takes up to the limit and refuses one byte more, storing nothing", async () => {
    await sh(
      "head -c 1000 /dev/urandom > /workspace/k; mkdir -p /workspace/kdir; head -c 5000 /dev/urandom > /workspace/kdir/f",
    )
    expect((await getPath("k", 1000)).result).toMatchObject({ kind: "file", bytes: 1000 })
    const over = await getPath("k", 999)
    expect(over.result).toEqual({ error: "/workspace/k is larger than 999 bytes (the most a get returns)" })
    expect(over.opened).toBeUndefined()
    // A folder's size is only known while its archive streams.
    const folder = await getPath("kdir", 2000)
    expect(folder.result).toEqual({
      error: "/workspace/kdir is larger than 2000 bytes (the most a get returns)",
    })
    expect(folder.opened).toBeUndefined()
  })

  it("get answers with an error for a missing path", async () => {
    expect((await getPath("nothing/here")).result).toEqual({
      error: "/workspace/nothing/here: no such file or folder",
    })
  })
})

import { spawnSync } from "node:child_process"
import { randomBytes } from "node:crypto"
import { gzipSync } from "node:zlib"
import { Effect, Exit, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { SealStream } from "../../core/SealStream.ts"
import { storageRuntime } from "../../test/harness/NatsServer.ts"
import { uniqueName } from "../../test/harness/names.ts"
import { checkManifest, InputFailed, unpack } from "./Inputs.ts"
import { archive, entry, store, type TestGuest, testGuest } from "./testing.ts"

const ACC = "acc_0000000000000000000000000a"
const DISK = 32 * 1024 * 1024
let t: TestGuest
const runtime = storageRuntime()

beforeAll(async () => {
  t = await testGuest("in", { diskBytes: DISK })
}, 15 * 60_000)

afterAll(async () => {
  await runtime.dispose()
  expect(await t.close()).toEqual([])
})

const sh = async (command: string) => (await Effect.runPromise(t.guest.bash({ command }))).output

// Seals `bytes` into the inputs store and unpacks it into the machine.
const unpackBytes = (bytes: Buffer) =>
  runtime.runPromiseExit(
    Effect.gen(function* () {
      const inputs = yield* store("inputs")
      const seal = yield* SealStream
      const name = uniqueName("file")
      const pieces: Array<Buffer> = []
      for (let at = 0; at < bytes.length; at += 100_000) pieces.push(bytes.subarray(at, at + 100_000))
      yield* inputs.put(name, Stream.fromIterable(pieces).pipe(seal.seal(ACC, name)))
      return yield* unpack(t.guest, { store: inputs, account: ACC, name }, { diskBytes: DISK })
    }),
  )

// Runs `unpack` and returns the input failure's detail; /workspace/in must be gone afterwards and
// nothing written outside /workspace/in.
const refused = async (bytes: Buffer) => {
  await sh("rm -rf /workspace/in /workspace/escape /escape /tmp/escape /abs")
  const exit = await unpackBytes(bytes)
  expect(Exit.isFailure(exit)).toBe(true)
  if (Exit.isSuccess(exit)) return ""
  const error = exit.cause._tag === "Fail" ? exit.cause.error : undefined
  expect(error).toBeInstanceOf(InputFailed)
  expect(await sh("ls -d /workspace/in /workspace/escape /escape /tmp/escape /abs 2>/dev/null; true")).toBe(
    "",
  )
  return (error as InputFailed).detail
}

const gz = (...entries: ReadonlyArray<Buffer>) => gzipSync(archive(...entries))
const ok = entry("first.txt", "0", Buffer.from("written before the bad entry\n"))

describe("inputs", () => {
  it("unpacks a good archive with nested folders into /workspace/in", async () => {
    const big = randomBytes(300_000)
    const made = spawnSync(
      "bash",
      [
        "-c",
        `set -e; d=$(mktemp -d); trap 'rm -rf $d' EXIT; mkdir -p $d/a/b/c $d/empty "$d/with space"
         echo hello > $d/a/b/c/deep.txt; cat > $d/a/big.bin; echo x > "$d/with space/f"; tar -C $d -czf - .`,
      ],
      { input: big },
    )
    expect(made.status).toBe(0)
    const exit = await unpackBytes(made.stdout)
    expect(exit).toEqual(Exit.succeed({ entries: 8, bytes: 6 + 300_000 + 2 }))
    expect(await sh("cd /workspace/in && find . | sort")).toBe(
      [
        ".",
        "./a",
        "./a/b",
        "./a/b/c",
        "./a/b/c/deep.txt",
        "./a/big.bin",
        "./empty",
        "./with space",
        "./with space/f",
        "",
      ].join("\n"),
    )
    expect(await sh("cat /workspace/in/a/b/c/deep.txt; stat -c %U /workspace/in/a/big.bin")).toBe(
      "hello\nroot\n",
    )
    expect(await sh("sha256sum < /workspace/in/a/big.bin | cut -c1-64")).toBe(
      `${(await import("node:crypto")).createHash("sha256").update(big).digest("hex")}\n`,
    )
  })

  it("checks the input manifest: existence, kind and size at max_bytes", async () => {
    // After the previous test: a/b/c/deep.txt is 6 bytes, a/ holds 300,006 bytes, empty/ is empty.
    const check = (manifest: ReadonlyArray<{ path: string; max_bytes: number }>) =>
      Effect.runPromiseExit(checkManifest(t.guest, manifest))
    expect(
      await check([
        { path: "a/b/c/deep.txt", max_bytes: 6 },
        { path: "a/", max_bytes: 300_006 },
        { path: "empty/", max_bytes: 0 },
      ]),
    ).toEqual(Exit.void)
    const problems = await check([
      { path: "a/b/c/deep.txt", max_bytes: 5 },
      { path: "a/", max_bytes: 300_005 },
      { path: "missing.txt", max_bytes: 10 },
      { path: "nofolder/", max_bytes: 10 },
      { path: "a/b/", max_bytes: 10 },
      { path: "a/b/c/deep.txt/", max_bytes: 10 },
      { path: "a/b", max_bytes: 10 },
    ])
    expect(problems).toEqual(
      Exit.fail(
        new InputFailed({
          detail:
            "the input does not match the input manifest: a/b/c/deep.txt: is 6 bytes, more than its max_bytes 5; " +
            "a/: holds 300006 bytes, more than its max_bytes 300005; missing.txt: missing; nofolder/: folder missing; " +
            "a/b/c/deep.txt/: is a file, not a folder; a/b: is a folder, not a file",
        }),
      ),
    )
  })

  it("refuses links, devices, fifos, escaping and absolute paths", async () => {
    expect(await refused(gz(ok, entry("link", "2", undefined, { linkname: "/etc/passwd" })))).toContain(
      '"link": symbolic links are refused',
    )
    expect(await refused(gz(ok, entry("hard", "1", undefined, { linkname: "first.txt" })))).toContain(
      '"hard": hard links are refused',
    )
    expect(await refused(gz(ok, entry("null", "3", undefined, { devmajor: 1, devminor: 3 })))).toContain(
      '"null": device files are refused',
    )
    expect(await refused(gz(entry("fifo", "6")))).toContain("fifos are refused")
    expect(await refused(gz(ok, entry("../escape", "0", Buffer.from("x"))))).toBe(
      '"../escape": paths with .. are refused',
    )
    expect(await refused(gz(entry("/abs/escape", "0", Buffer.from("x"))))).toBe(
      '"/abs/escape": absolute paths are refused',
    )
    expect(await refused(gz(entry("x", "0", Buffer.from("x"), {}, { path: "../../escape" })))).toContain("..")
  })

  it("refuses a plain .tar, garbage, an empty upload and a cut-off gzip", async () => {
    expect(await refused(archive(ok))).toBe("the input is a plain .tar; it must be gzip-compressed (.tar.gz)")
    expect(await refused(randomBytes(5000))).toBe("the input is not gzip-compressed; it must be a .tar.gz")
    expect(await refused(Buffer.alloc(0))).toBe("the input is empty; it must be a .tar.gz")
    const whole = gz(entry("f", "0", randomBytes(100_000)))
    expect(await refused(whole.subarray(0, whole.length - 5000))).toContain("not a readable .tar.gz: gzip")
    expect(await refused(gzipSync(randomBytes(3000)))).toContain("not a readable tar archive")
  })

  it("refuses a gzip bomb declaring more than the disk, and one whose data fills the disk", async () => {
    const declared = gzipSync(archive(entry("bomb", "0", Buffer.alloc(DISK + 1))))
    expect(declared.length).toBeLessThan(100_000)
    expect(await refused(declared)).toContain(`more than the /workspace disk holds (${DISK} bytes)`)
    // Fits the declared limit but not the ext4's free space: the guest's own ENOSPC.
    const free = Number(await sh("df -B1 --output=avail /workspace | tail -1"))
    expect(free).toBeLessThan(DISK)
    const filling = gzipSync(
      archive(
        entry("a", "0", Buffer.alloc(Math.floor(free / 2))),
        entry("b", "0", Buffer.alloc(Math.floor(free / 2) + 1024 * 1024)),
      ),
    )
    expect(await refused(filling)).toBe(
      `the input unpacks to more than the /workspace disk holds (${DISK} bytes)`,
    )
    // The disk is free again.
    expect(Number(await sh("df -B1 --output=avail /workspace | tail -1"))).toBeGreaterThan(free - 1024 * 1024)
  })

  it("a missing upload is an input failure", async () => {
    const exit = await runtime.runPromiseExit(
      Effect.flatMap(store("inputs"), (inputs) =>
        unpack(t.guest, { store: inputs, account: ACC, name: uniqueName("none") }, { diskBytes: DISK }),
      ),
    )
    expect(String(exit)).toContain("is missing")
  })
})

import { spawnSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { BLOCK, TarFilter, TarRefused } from "./Tar.ts"
import { archive, entry, paxHeader } from "./testing.ts"

// Runs the filter over `input` cut into pieces of `piece` bytes.
const filter = (input: Buffer, piece = 777, max?: number) => {
  const f = new TarFilter(max)
  const out: Array<Uint8Array> = []
  for (let at = 0; at < input.length && !f.done; at += piece)
    out.push(...f.push(input.subarray(at, at + piece)))
  out.push(...f.end())
  return { bytes: Buffer.concat(out), filter: f }
}

const refusal = (input: Buffer, max?: number) => {
  try {
    filter(input, 300, max)
  } catch (e) {
    if (e instanceof TarRefused) return e.detail
    throw e
  }
  return "accepted"
}

// Lists an archive with the host's GNU tar: "type size name" lines.
const tarList = (bytes: Buffer) => {
  const r = spawnSync("tar", ["-tvf", "-"], { input: bytes })
  expect(r.status).toBe(0)
  return r.stdout.toString("utf8")
}

describe("TarFilter", () => {
  it("passes files and folders (GNU tar output, long and UTF-8 names) as a fresh archive", () => {
    const dir = mkdtempSync(join(tmpdir(), "hangar-tar-"))
    try {
      const long = `${"d".repeat(120)}/${"f".repeat(150)}.txt`
      const script = `set -e; cd ${dir}; mkdir -p src/a/b src/empty "src/${"d".repeat(120)}"; echo one > src/a/one.txt
        head -c 5000 /dev/urandom > src/a/b/bin; echo long > "src/${long}"; echo ü > "src/ünï cödé"
        chmod 4755 src/a/one.txt
        tar -C src -cf gnu.tar . ; tar -C src --format=pax -cf pax.tar .`
      expect(spawnSync("bash", ["-c", script]).status).toBe(0)
      for (const name of ["gnu.tar", "pax.tar"]) {
        const input = readFileSync(join(dir, name))
        for (const piece of [1, 511, 512, 4096, 1 << 20]) {
          const { bytes, filter: f } = filter(input, piece)
          expect(f.entries).toBe(8)
          expect(f.bytes).toBe(4 + 5000 + 5 + 3)
          const listed = tarList(bytes)
          expect(listed).toContain(`a/b/bin`)
          expect(listed).toContain(long)
          expect(listed).toContain("ünï cödé")
          expect(listed).toContain("empty/")
          // Ownership and setuid are not carried.
          expect(listed).toMatch(/-rwxr-xr-x 0\/0 +4 [^\n]* a\/one.txt/)
          expect(listed).not.toContain("./")
        }
      }
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  it("refuses links, devices, fifos, sparse files and unknown entry types, naming the entry", () => {
    const ok = entry("fine.txt", "0", Buffer.from("x"))
    expect(refusal(archive(ok, entry("ln", "2", undefined, { linkname: "/etc/passwd" })))).toBe(
      '"ln": symbolic links are refused (only regular files and folders)',
    )
    expect(refusal(archive(entry("hard", "1", undefined, { linkname: "fine.txt" })))).toContain(
      '"hard": hard links are refused',
    )
    expect(refusal(archive(entry("null", "3", undefined, { devmajor: 1, devminor: 3 })))).toContain(
      '"null": device files are refused',
    )
    expect(refusal(archive(entry("disk", "4")))).toContain("device files are refused")
    expect(refusal(archive(entry("pipe", "6")))).toContain('"pipe": fifos are refused')
    expect(refusal(archive(entry("sp", "S")))).toContain("sparse files are refused")
    expect(refusal(archive(entry("x", "0", Buffer.from("x"), {}, { "GNU.sparse.major": "1" })))).toContain(
      "sparse",
    )
    expect(refusal(archive(entry("vol", "V")))).toContain('entries of type "V" are refused')
  })

  it("refuses absolute and .. paths, also when they come in PAX headers", () => {
    const data = Buffer.from("x")
    expect(refusal(archive(entry("../escape", "0", data)))).toBe('"../escape": paths with .. are refused')
    expect(refusal(archive(entry("a/../../escape", "0", data)))).toContain("paths with .. are refused")
    expect(refusal(archive(entry("/etc/cron.d/x", "0", data)))).toBe(
      '"/etc/cron.d/x": absolute paths are refused',
    )
    expect(refusal(archive(entry("harmless", "0", data, {}, { path: "/root/x" })))).toContain(
      "absolute paths are refused",
    )
    expect(refusal(archive(entry("dir/", "5", undefined, {}, { path: "../up/" })))).toContain("..")
    expect(refusal(archive(entry("./", "5"), entry("./ok", "0", data)))).toBe("accepted")
  })

  it("refuses a damaged header and an archive cut off inside an entry", () => {
    const good = archive(entry("f", "0", Buffer.alloc(1000, 1)))
    const damaged = Buffer.from(good)
    damaged[10] = 0x41
    expect(refusal(damaged)).toContain("bad header checksum")
    expect(refusal(good.subarray(0, BLOCK + 600))).toContain("cut off")
    expect(refusal(paxHeader({ path: "x" }))).toContain("cut off")
  })

  it("accepts file data up to the limit and refuses one byte more", () => {
    const two = archive(entry("a", "0", Buffer.alloc(600)), entry("b", "0", Buffer.alloc(400)))
    expect(refusal(two, 1000)).toBe("accepted")
    expect(refusal(two, 999)).toBe(
      'the archive unpacks to more than the /workspace disk holds (999 bytes): "b" brings it to 1000 bytes',
    )
  })

  it("stops at the end-of-archive block and ignores what follows", () => {
    const input = Buffer.concat([archive(entry("a", "0", Buffer.from("hi"))), Buffer.alloc(100_000, 7)])
    const { bytes, filter: f } = filter(input, 2048)
    expect(f.done).toBe(true)
    expect(tarList(bytes)).toContain(" a\n")
  })
})

describe("TarFilter against mutated archives", () => {
  // A seeded generator (mulberry32), so a failure names the case that reproduces it.
  const random = (seed: number) => () => {
    seed = (seed + 0x6d2b79f5) | 0
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }

  it("refuses or passes a readable archive of files and folders, never throws anything else or hangs", () => {
    const dir = mkdtempSync(join(tmpdir(), "hangar-tar-fuzz-"))
    try {
      const script = `set -e; cd ${dir}; mkdir -p src/a/b; echo one > src/a/one.txt; head -c 3000 /dev/urandom > src/a/b/bin
        echo long > "src/a/${"l".repeat(130)}"
        tar -C src -cf gnu.tar . ; tar -C src --format=pax -cf pax.tar .`
      expect(spawnSync("bash", ["-c", script]).status).toBe(0)
      const seeds = [
        readFileSync(join(dir, "gnu.tar")),
        readFileSync(join(dir, "pax.tar")),
        archive(entry("x", "0", Buffer.from("x"), {}, { path: "y".repeat(300), size: "1" })),
      ]
      let refused = 0
      let passed = 0
      for (let n = 0; n < 600; n++) {
        const next = random(n)
        const input = Buffer.from(seeds[n % seeds.length]!)
        // Flip bytes (headers are the first and most interesting blocks), sometimes cut it short.
        for (let k = 1 + Math.floor(next() * 6); k > 0; k--) {
          const at =
            next() < 0.7
              ? Math.floor(next() * Math.min(input.length, 4 * BLOCK))
              : Math.floor(next() * input.length)
          input[at] = Math.floor(next() * 256)
        }
        // Mostly with each header's checksum made right again, so the parser reads the mutated
        // fields instead of stopping at the checksum.
        if (next() < 0.8)
          for (let at = 0; at + BLOCK <= input.length; at += BLOCK)
            if (input.subarray(at + 257, at + 262).toString("latin1") === "ustar") {
              input.fill(0x20, at + 148, at + 156)
              let sum = 0
              for (let i = at; i < at + BLOCK; i++) sum += input[i]!
              input.write(`${sum.toString(8).padStart(6, "0")}\0 `, at + 148, 8, "ascii")
            }
        const cut = next() < 0.2 ? input.subarray(0, Math.floor(next() * input.length)) : input
        const piece = 1 + Math.floor(next() * 2000)
        let out: Buffer
        try {
          out = filter(cut, piece).bytes
        } catch (e) {
          expect(e, `case ${n}`).toBeInstanceOf(TarRefused)
          refused++
          continue
        }
        passed++
        // What passed is an archive GNU tar reads, of regular files and folders only.
        const listed = spawnSync("tar", ["-tvf", "-"], { input: out })
        expect(listed.status, `case ${n}: ${listed.stderr}`).toBe(0)
        for (const line of listed.stdout
          .toString("utf8")
          .split("\n")
          .filter((l) => l !== ""))
          expect(line[0], `case ${n}: ${line}`).toMatch(/[-d]/)
      }
      console.log(`mutated archives: ${refused} refused, ${passed} passed`)
      // Both outcomes happen: the mutations are neither all fatal nor all harmless.
      expect(refused).toBeGreaterThan(50)
      expect(passed).toBeGreaterThan(50)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 120_000)
})

import { spawn } from "node:child_process"
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import ssh2 from "ssh2"
import { afterEach, beforeEach, describe, expect, it } from "vitest"
import { machineFolder, makingName, newKeyPair, ownedIn } from "./MachineDriver.ts"

it("every key pair made for a machine reads back in ssh2, which ~1 in 256 of ssh2's own do not", () => {
  // 2,000 pairs meet a malformed one of ssh2's generator with near certainty (1 − (255/256)^2000).
  const pairs = Array.from({ length: 2000 }, () => newKeyPair())
  for (const pair of pairs) {
    expect(ssh2.utils.parseKey(pair.public)).not.toBeInstanceOf(Error)
    expect(ssh2.utils.parseKey(pair.private)).not.toBeInstanceOf(Error)
  }
  expect(new Set(pairs.map((p) => p.public)).size).toBe(pairs.length)
})

describe("machine folders", () => {
  let dir: string
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), "hangar-folders-"))
  })
  afterEach(() => rmSync(dir, { recursive: true, force: true }))
  const owned = (owner: string) => Effect.runPromise(ownedIn(dir, owner))

  it("a folder made for an owner names it, and nothing is left under another name", async () => {
    const made = await machineFolder(dir, "m_1", "host_a")
    expect(made).toBe(join(dir, "m_1"))
    expect(readFileSync(join(made, "owner"), "utf8")).toBe("host_a")
    expect(readdirSync(dir)).toEqual(["m_1"])
    expect(await owned("host_a")).toEqual(["m_1"])
    expect(await owned("host_b")).toEqual([])
  })

  it("an id in use fails EEXIST and leaves its folder as it was; a claim of the same owner is taken", async () => {
    mkdirSync(join(dir, "empty"))
    await machineFolder(dir, "theirs", "host_b")
    await machineFolder(dir, "claimed", "host_a")
    writeFileSync(join(dir, "claimed", "kept.json"), "{}")
    await machineFolder(dir, "running", "host_a")
    writeFileSync(join(dir, "running", "reserved"), "1")
    for (const id of ["empty", "theirs", "running"])
      await expect(machineFolder(dir, id, "host_a")).rejects.toMatchObject({ code: "EEXIST" })
    await expect(machineFolder(dir, "empty", undefined)).rejects.toMatchObject({ code: "EEXIST" })
    expect(readdirSync(join(dir, "empty"))).toEqual([])
    expect(readFileSync(join(dir, "theirs", "owner"), "utf8")).toBe("host_b")
    expect(await machineFolder(dir, "claimed", "host_a")).toBe(join(dir, "claimed"))
    expect(readdirSync(join(dir, "claimed")).sort()).toEqual(["kept.json", "owner"])
    expect(readdirSync(dir).sort()).toEqual(["claimed", "empty", "running", "theirs"])
  })

  it("a folder its owner's earlier life left half made is removed by the owner's next look, and no one else's", async () => {
    for (const [id, owner] of [
      ["a_1", "host_a"],
      ["a_2", "host_a"],
      ["b_1", "host_b"],
    ] as const)
      mkdirSync(join(dir, makingName(id, owner)))
    writeFileSync(join(dir, makingName("a_2", "host_a"), "owner"), "")
    await machineFolder(dir, "a_3", "host_a")
    expect(await owned("host_a")).toEqual(["a_3"])
    expect(readdirSync(dir).sort()).toEqual([makingName("b_1", "host_b"), "a_3"].sort())
    expect(await owned("host_b")).toEqual([])
    expect(readdirSync(dir)).toEqual(["a_3"])
  })

  it("a host agent killed at any point while making folders leaves none its next life cannot find", async () => {
    // A process making folder after folder, killed unawares, as a chaos test or an operator does.
    const script = `
      const { machineFolder } = await import(${JSON.stringify(new URL("./MachineDriver.ts", import.meta.url).href)})
      console.log("ready")
      for (let i = 0; ; i++) await machineFolder(${JSON.stringify(dir)}, "m_" + i, "host_a")`
    for (let round = 0; round < 4; round++) {
      const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "--eval", script], {
        stdio: ["ignore", "pipe", "inherit"],
      })
      const gone = new Promise((r) => child.once("exit", r))
      try {
        await new Promise((ready) => child.stdout.once("data", ready))
        await new Promise((r) => setTimeout(r, 20 + round * 15))
      } finally {
        child.kill("SIGKILL")
        await gone
      }
    }
    const found = await owned("host_a")
    expect(found.length).toBeGreaterThan(0)
    expect(readdirSync(dir).sort()).toEqual([...found].sort())
  })
})

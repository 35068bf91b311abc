import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import ssh2 from "ssh2"
import { expect, it } from "vitest"
import { claimedOnly, claimIn, newKeyPair } from "./MachineDriver.ts"

it("every key pair made for a machine reads back in ssh2, which ~1 in 256 of ssh2's own do not", () => {
  // 2,000 pairs meet a malformed one of ssh2's generator with near certainty (1 − (255/256)^2000).
  const pairs = Array.from({ length: 2000 }, () => newKeyPair())
  for (const pair of pairs) {
    expect(ssh2.utils.parseKey(pair.public)).not.toBeInstanceOf(Error)
    expect(ssh2.utils.parseKey(pair.private)).not.toBeInstanceOf(Error)
  }
  expect(new Set(pairs.map((p) => p.public)).size).toBe(pairs.length)
})

// A warm machine's run keeps a folder of its own holding only the claim: its end removes just
// that folder, without looking for processes, devices or rules of an id no machine ever had.
it("a folder holding only a claim (owner, note) reads as claimed only; anything more does not", async () => {
  const root = mkdtempSync(join(tmpdir(), "hangar-claim-test-"))
  try {
    const claim = claimIn(root)
    await Effect.runPromise(claim("run_claimed", "host_a", "{}"))
    expect(readdirSync(join(root, "run_claimed")).sort()).toEqual(["kept.json", "owner"])
    expect(claimedOnly(join(root, "run_claimed"))).toBe(true)
    // Made by a driver in a claimed folder: its first files are written there.
    writeFileSync(join(root, "run_claimed", "reserved"), "1")
    expect(claimedOnly(join(root, "run_claimed"))).toBe(false)
    expect(claimedOnly(join(root, "run_missing"))).toBe(false)
  } finally {
    rmSync(root, { recursive: true, force: true })
  }
})

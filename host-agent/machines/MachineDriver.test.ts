import ssh2 from "ssh2"
import { expect, it } from "vitest"
import { newKeyPair } from "./MachineDriver.ts"

it("every key pair made for a machine reads back in ssh2, which ~1 in 256 of ssh2's own do not", () => {
  // 2,000 pairs meet a malformed one of ssh2's generator with near certainty (1 − (255/256)^2000).
  const pairs = Array.from({ length: 2000 }, () => newKeyPair())
  for (const pair of pairs) {
    expect(ssh2.utils.parseKey(pair.public)).not.toBeInstanceOf(Error)
    expect(ssh2.utils.parseKey(pair.private)).not.toBeInstanceOf(Error)
  }
  expect(new Set(pairs.map((p) => p.public)).size).toBe(pairs.length)
})

import { describe, expect, it } from "vitest"
import { computeRateUsdNanosPerGibHour, minutePriceUsdNanos, sizes } from "./Limits.ts"

describe("sizes", () => {
  // The spec's table: vCPUs, memory, /workspace disk, and price per started minute in dollars.
  it.each([
    ["s", 1, 2, 16, 0.005],
    ["m", 2, 4, 32, 0.01],
    ["l", 4, 8, 64, 0.02],
    ["xl", 8, 16, 128, 0.04],
  ] as const)("%s has %i vCPU, %i GiB, %i GiB disk, $%d a minute", (size, vcpus, gib, diskGib, dollars) => {
    const spec = sizes[size]
    expect(spec.vcpus).toBe(vcpus)
    expect(spec.memoryMib).toBe(gib * 1024)
    expect(spec.diskBytes).toBe(diskGib * 1024 ** 3)
    expect(minutePriceUsdNanos(spec.memoryMib)).toBe(Math.round(dollars * 1e9))
  })

  it("prices a GiB-hour at $0.15", () => {
    expect(computeRateUsdNanosPerGibHour).toBe(150_000_000)
    expect(minutePriceUsdNanos(1024) * 60).toBe(150_000_000)
  })
})

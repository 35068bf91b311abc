import { spawnSync } from "node:child_process"
import { readdirSync, statSync, writeFileSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { basename, join } from "node:path"
import { afterEach, beforeEach, describe, expect, it } from "vitest"
import { run } from "../namespace/exec.ts"
import { KEPT_TEMPLATES, workspaceTemplate } from "./Disks.ts"

const MiB = 1024 * 1024
let dir: string

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "hangar-templates-"))
})
afterEach(async () => {
  await rm(dir, { recursive: true, force: true })
})

const sizeOf = (k: number) => 8 * MiB + k * 4096
const names = () => readdirSync(dir).sort()

describe("the empty workspace disk of a size", () => {
  it("is made once, read-only and sparse, an ext4 labelled workspace without the resize inode", async () => {
    const path = await workspaceTemplate(dir, 64 * MiB)
    const st = statSync(path)
    expect(st.size).toBe(64 * MiB)
    expect(st.mode & 0o777).toBe(0o444)
    expect(st.blocks * 512).toBeLessThan(8 * MiB)
    const header = await run("dumpe2fs", ["-h", path])
    expect(header).toMatch(/Filesystem volume name:\s+workspace\n/)
    expect(header).toMatch(/Filesystem features:.*extent/)
    expect(header).not.toContain("resize_inode")
    // Asked again, and twice at once for a new size: the same file, one mkfs each.
    expect(await workspaceTemplate(dir, 64 * MiB)).toBe(path)
    expect(statSync(path).ino).toBe(st.ino)
    const [first, second] = [workspaceTemplate(dir, 32 * MiB), workspaceTemplate(dir, 32 * MiB)]
    expect(second).toBe(first) // the one making, awaited by both
    const [a, b] = await Promise.all([first, second])
    expect(a).toBe(b)
    expect(names()).toEqual([basename(a), basename(path)].sort())
  })

  it("removes what a process that ended left half made, not what a running one is making", async () => {
    const ended = spawnSync("true").pid
    const abandoned = join(dir, `workspace-${sizeOf(1)}-0123456789.ext4.tmp-${ended}-00ff00ff`)
    const underWay = join(dir, `workspace-${sizeOf(2)}-0123456789.ext4.tmp-${process.pid}-00ff00ff`)
    writeFileSync(abandoned, "")
    writeFileSync(underWay, "")
    const made = await workspaceTemplate(dir, sizeOf(0))
    expect(names()).toEqual([basename(made), basename(underWay)].sort())
  })

  it(`keeps the ${KEPT_TEMPLATES} last used, the least recently used removed first`, async () => {
    const made: Array<string> = []
    for (let k = 0; k < KEPT_TEMPLATES; k++) made.push(await workspaceTemplate(dir, sizeOf(k)))
    expect(names()).toEqual(made.map((p) => basename(p)).sort())
    // The first made is used again: the second is now the least recently used.
    await new Promise((r) => setTimeout(r, 20))
    expect(await workspaceTemplate(dir, sizeOf(0))).toBe(made[0])
    const last = await workspaceTemplate(dir, sizeOf(KEPT_TEMPLATES))
    expect(names()).toEqual([...made.filter((p) => p !== made[1]), last].map((p) => basename(p)).sort())
    // One removed is made again when a machine of its size comes.
    expect(await workspaceTemplate(dir, sizeOf(1))).toBe(made[1])
    expect(names()).toHaveLength(KEPT_TEMPLATES)
  })
})

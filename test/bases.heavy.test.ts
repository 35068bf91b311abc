/**
 * Every base `GET /v1/bases` lists meets the spec's list ("The machine"), checked in a machine of
 * each on the whole stack (`test/harness/Stack.ts`) with the host agent offering the full bases
 * (`HANGAR_BASES`), the model played by the OpenAI fake: each tool answers its version, the display
 * is 1440x900, Chromium renders a local page to a PNG, and the `screenshot` tool brings a PNG of
 * the display back to the model; the newer base has a desktop background, the older a plain one.
 * And a function whose base is still being built waits in the queue, then runs once it is built.
 *
 * The full bases are built on first use (about two minutes each, side by side) into the shared
 * cache; the stack's bases folder links to them, so the base this file fakes as building stays
 * out of the shared cache.
 */
import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type Base, BasesSettings, ensureFullBases } from "../host-agent/bases/Bases.ts"
import * as OpenAiFake from "./fakes/OpenAiFake.ts"
import {
  call,
  closeStack,
  command,
  createAccount,
  expectStatus,
  type Json,
  publish,
  publishProvider,
  type Stack,
  startRun,
  startStack,
  type TestAccount,
  waitRun,
} from "./harness/Stack.ts"

const KEY = "sk-test-basesKEY0123456789abcdefWXYZ"

let full: ReadonlyArray<Base>
let dir: string
let stack: Stack
let acct: TestAccount
let openai: OpenAiFake.OpenAiFake
let provider: string
const scope = Effect.runSync(Scope.make())

beforeAll(async () => {
  full = await ensureFullBases()
  dir = await mkdtemp(join(tmpdir(), "hangar-bases-test-"))
  for (const base of full) await symlink(join(BasesSettings.defaults.dir, base.name), join(dir, base.name))
  openai = await Effect.runPromise(
    OpenAiFake.make({ keys: [KEY], models: ["gpt-fake"] }).pipe(Scope.extend(scope)),
  )
  stack = await startStack({
    logFlushMs: 500,
    settings: {
      OPENAI_BASE_URL: openai.url,
      BASES_DIR: dir,
      BASES: BasesSettings.defaults.recipes.join(","),
      SCHEDULER_TICK_MS: 500,
    },
  })
  acct = await createAccount(stack, { creditUsd: 100 })
  provider = await publishProvider(
    stack,
    acct,
    "fake-openai",
    { provider: "openai", model: "gpt-fake", compact_at_tokens: 50_000 },
    KEY,
  )
}, 20 * 60_000)

afterAll(async () => {
  try {
    await closeStack(stack)
  } finally {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    if (dir !== undefined) await rm(dir, { recursive: true, force: true })
  }
}, 120_000)

/** An agent function on `base` with the OpenAI fake as its model. */
const agentFunction = (base: string) =>
  publish(stack, acct, {
    provider,
    base,
    tools: ["bash", "read", "screenshot"],
    output_manifest: [{ path: "result.txt" }],
    timeout_minutes: 10,
  })

const submit = [
  {
    id: "w",
    name: "bash",
    arguments: { command: "mkdir -p /workspace/out && echo done > /workspace/out/result.txt" },
  },
  { id: "s", name: "submit_result", arguments: { summary: "checked" } },
]

const ended = async (run: string) => {
  const r = await waitRun(stack, acct, run, { timeoutMs: 120_000 })
  expect(r.state, JSON.stringify(r)).toBe("succeeded")
  return r
}

// Every tool of the spec's list by its version, the display's size, and a page Chromium rendered
// (a red page, 800x600: the colour of its middle pixel). `convert` is ImageMagick (6 or 7).
const CHECK = [
  "set -e",
  'echo "display $DISPLAY"',
  'echo "python $(python3 --version)"',
  'echo "git $(git --version)"',
  'echo "curl $(curl --version | sed -n 1p)"',
  'echo "jq $(jq --version)"',
  'echo "ripgrep $(rg --version | sed -n 1p)"',
  'echo "xz $(xz --version | sed -n 1p)"',
  'echo "zstd $(zstd --version)"',
  'echo "ssh $(ssh -V 2>&1)"',
  'echo "chromium $(chromium --version)"',
  "display-up",
  "echo \"screen $(xdpyinfo | sed -n 's/^ *dimensions: *\\([0-9x]*\\) pixels.*/\\1/p')\"",
  "printf '<html><body style=\"margin:0;background:#ff0000\"></body></html>' > /tmp/page.html",
  "chromium --headless --screenshot=/tmp/page.png --window-size=800,600 file:///tmp/page.html >/dev/null 2>&1",
  "echo \"page $(convert /tmp/page.png -format '%m %w %h %[pixel:p{400,300}]' info:)\"",
].join("\n")

/** The output of a `bash` tool result (the command's record as the model sees it). */
const outputOf = (text: string): string => JSON.parse(text).output

/** `key rest` lines of an output as a map. */
const fields = (output: string) =>
  new Map(
    output
      .split("\n")
      .map((l) => l.trim())
      .filter((l) => /^[a-z]+ /.test(l))
      .map((l) => [l.slice(0, l.indexOf(" ")), l.slice(l.indexOf(" ") + 1)] as const),
  )

/** Width and height of a PNG from its IHDR chunk. */
const pngSize = (png: Buffer) => {
  expect(png.subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]))
  return [png.readUInt32BE(16), png.readUInt32BE(20)]
}

describe("the bases GET /v1/bases lists", () => {
  it("are the full bases, the newer release first, and not the slim test base", async () => {
    const listed = expectStatus(await call(stack, "GET", "/v1/bases", acct.admin), 200, "GET /v1/bases")
    // Built the same day here, so trixie (the newer release) is the newest base.
    expect(listed.bases.map((b: Json) => b.name)).toEqual(full.map((b) => b.name))
    expect(listed.bases.map((b: Json) => b.name)).not.toContain(stack.base.name)
    for (const b of listed.bases) expect(full).toContainEqual(expect.objectContaining(b))
  })

  it.each([
    ["trixie", "a desktop background"],
    ["bookworm", "a plain background"],
  ])(
    "debian %s: the spec's tools, a 1440x900 display, a browser, and a screenshot with %s",
    async (release) => {
      const base = full.find((b) => b.name.startsWith(`debian-${release}-`))!
      const fn = await agentFunction(base.name)
      const from = openai.chats().length
      openai.replyToolCalls([{ id: "check", name: "bash", arguments: { command: CHECK } }])
      openai.replyToolCalls([{ id: "shot", name: "screenshot", arguments: {} }])
      openai.replyToolCalls([
        {
          id: "colours",
          name: "bash",
          arguments: { command: "convert /tmp/screen.png -format '%w %h %k' info:" },
        },
      ])
      openai.replyToolCalls(submit)
      const run = await startRun(stack, acct, fn.function)
      await ended(run.id)
      const chats = openai.chats().slice(from)
      expect(chats).toHaveLength(4)

      const check = chats[1]!.toolResults.find((t) => t.id === "check")!
      expect(check.isError, check.text).toBe(false)
      const seen = fields(outputOf(check.text))
      expect(seen.get("display"), check.text).toBe(":99")
      expect(seen.get("python")).toMatch(/^Python 3\.\d+/)
      expect(seen.get("git")).toMatch(/^git version \d/)
      expect(seen.get("curl")).toMatch(/^curl \d/)
      expect(seen.get("jq")).toMatch(/^jq-1\.\d/)
      expect(seen.get("ripgrep")).toMatch(/^ripgrep \d/)
      expect(seen.get("xz")).toMatch(/^xz \(XZ Utils\) \d/)
      expect(seen.get("zstd")).toMatch(/Zstandard CLI .* v1\.\d/)
      expect(seen.get("ssh")).toMatch(/^OpenSSH_\d/)
      expect(seen.get("chromium")).toMatch(/^Chromium \d+/)
      expect(seen.get("screen")).toBe("1440x900")
      expect(seen.get("page")).toBe("PNG 800 600 srgb(255,0,0)")

      // The screenshot reached the model as a PNG of the whole display.
      const shot = chats[2]!.toolResults.find((t) => t.id === "shot")!
      expect(shot.isError).toBe(false)
      expect(shot.images).toHaveLength(1)
      expect(pngSize(Buffer.from(shot.images[0]!, "base64"))).toEqual([1440, 900])

      // The newer base shows its wallpaper (a gradient: many colours); the older a plain background.
      const colourCheck = chats[3]!.toolResults.find((t) => t.id === "colours")!
      const [width, height, colours] = outputOf(colourCheck.text).trim().split(" ")
      expect([width, height]).toEqual(["1440", "900"])
      if (release === "trixie") expect(Number(colours)).toBeGreaterThan(100)
      else expect(Number(colours)).toBe(1)
    },
    180_000,
  )
})

describe("a base still being built", () => {
  it("is offered to functions; their runs wait in the queue, and run once it is built", async () => {
    // A build under way as the host agent sees one: the lock naming the base, held by a live process.
    const trixie = full.find((b) => b.name.startsWith("debian-trixie-"))!
    const name = "debian-trixie-20991231-feedfacefeed"
    const lock = join(dir, ".lock-feedfacefeed")
    await mkdir(lock)
    await writeFile(
      join(lock, "owner.json"),
      JSON.stringify({ name, recipe: "debian-trixie-full", pid: process.pid, started: Date.now() }),
    )
    // The host record lists it after its next heartbeat (1 s in the stack).
    const deadline = Date.now() + 10_000
    let fn: Json | undefined
    while (fn === undefined) {
      fn = await publish(stack, acct, { name: "later", base: name }).catch((e) => {
        if (Date.now() > deadline) throw e
        return new Promise<undefined>((r) => setTimeout(() => r(undefined), 250))
      })
    }
    const listed = expectStatus(await call(stack, "GET", "/v1/bases", acct.admin), 200, "GET /v1/bases")
    expect(listed.bases.map((b: Json) => b.name)).not.toContain(name)

    const run = await startRun(stack, acct, fn.function)
    // Offered and refused at every scheduler tick (0.5 s here) while the base builds.
    await new Promise((r) => setTimeout(r, 4000))
    expect((await waitRun(stack, acct, run.id, { until: () => true })).state).toBe("queued")

    // The build finishes: the base appears (this one shows the trixie base's files) and the lock goes.
    await mkdir(join(dir, name))
    await symlink(trixie.rootfs, join(dir, name, "rootfs"))
    await writeFile(join(dir, name, "base.json"), JSON.stringify({ ...trixie, name, rootfs: undefined }))
    await rm(lock, { recursive: true })
    const started = await waitRun(stack, acct, run.id, {
      until: (r) => r.state !== "queued",
      timeoutMs: 30_000,
    })
    expect(started.state).toBe("running")
    expect(started.base).toBe(name)
    await command(stack, acct, run.id, "finish", { state: "failed", detail: "checked" })
    expect((await waitRun(stack, acct, run.id)).state).toBe("failed")
  }, 120_000)
})

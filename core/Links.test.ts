import { createHmac, randomBytes } from "node:crypto"
import { mkdtemp, rm, stat } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Redacted } from "effect"
import * as UploadLinks from "../gateway/uploads/Links.ts"
import { linkValidMs } from "../schema/Limits.ts"
import { lengthPrefixed } from "./Aead.ts"
import * as Links from "./Links.ts"

const tempDir = Effect.acquireRelease(
  Effect.promise(() => mkdtemp(join(tmpdir(), "hangar-links-test-"))),
  (dir) => Effect.promise(() => rm(dir, { recursive: true, force: true })),
)

const keyBytes = randomBytes(32)
const keyB64 = keyBytes.toString("base64")

const fromSettings = (settings: Partial<typeof Links.LinkSettings.defaults>) =>
  Links.Links.pipe(Effect.provide(Links.layer), Effect.provide(Links.LinkSettings.layer(settings)))

// The parts of a link as the gateway reads them back.
const parse = (link: string) => {
  const url = new URL(link)
  const [, v1, downloads, store, object] = url.pathname.split("/")
  expect([v1, downloads]).toEqual(["v1", "downloads"])
  return {
    origin: url.origin,
    fields: {
      store: store as Links.DownloadStore,
      object: decodeURIComponent(object!),
      account: url.searchParams.get("account")!,
      filename: url.searchParams.get("filename")!,
      expires: Number(url.searchParams.get("expires")),
    },
    sig: url.searchParams.get("sig")!,
  }
}

const request = {
  store: "outputs",
  object: "run_0000000000000000000000000a",
  account: "acc_0000000000000000000000000a",
  filename: "run_0000000000000000000000000a.tar.gz",
} as const

describe("Links (download links)", () => {
  it.effect("a link carries every part, verifies, and lasts 15 minutes by default", () =>
    Effect.gen(function* () {
      const links = yield* fromSettings({ key: Redacted.make(keyB64), publicUrl: "https://api.example.com/" })
      const before = Date.now()
      const link = links.download(request)
      const { origin, fields, sig } = parse(link)
      expect(origin).toBe("https://api.example.com")
      expect(fields).toMatchObject({ ...request })
      expect(fields.expires * 1000).toBeGreaterThanOrEqual(before + linkValidMs)
      expect(fields.expires * 1000).toBeLessThanOrEqual(Date.now() + linkValidMs + 1000)
      expect(links.verify(fields, sig)).toBe("valid")
      // Exactly at the expiry second it still works; one millisecond after, it has expired.
      expect(links.verify(fields, sig, fields.expires * 1000)).toBe("valid")
      expect(links.verify(fields, sig, fields.expires * 1000 + 1)).toBe("expired")
    }),
  )

  it.effect("changing any part, or the signature, makes it invalid (checked before the expiry)", () =>
    Effect.gen(function* () {
      const links = yield* fromSettings({ key: Redacted.make(keyB64) })
      const { fields, sig } = parse(links.download(request))
      const tampered = [
        { ...fields, store: "files" as const },
        { ...fields, object: `${fields.object}x` },
        { ...fields, account: "acc_0000000000000000000000000b" },
        { ...fields, filename: "other.tar.gz" },
        { ...fields, expires: fields.expires + 1 },
      ]
      for (const f of tampered) expect(links.verify(f, sig)).toBe("invalid")
      const flipped = `${sig.slice(0, -2)}${sig.at(-2) === "A" ? "B" : "A"}${sig.at(-1)}`
      expect(links.verify(fields, flipped)).toBe("invalid")
      expect(links.verify(fields, "")).toBe("invalid")
      expect(links.verify(fields, sig.slice(0, 20))).toBe("invalid")
      // A forged expired link is invalid, not expired: nothing is learned about the key.
      expect(links.verify({ ...fields, expires: 1 }, sig, Date.now())).toBe("invalid")
      // Parts cannot be shifted across boundaries (length prefixes).
      const shifted = links.sign({ ...fields, object: "ab", account: "c" })
      expect(links.verify({ ...fields, object: "a", account: "bc" }, shifted)).toBe("invalid")
    }),
  )

  it.effect("another key does not verify; a download signature is never an upload signature", () =>
    Effect.gen(function* () {
      const links = yield* fromSettings({ key: Redacted.make(keyB64) })
      const other = yield* fromSettings({ key: Redacted.make(randomBytes(32).toString("base64")) })
      const { fields, sig } = parse(links.download(request))
      expect(other.verify(fields, sig)).toBe("invalid")
      // Independent HMAC of the documented message: the link is exactly that.
      const expected = createHmac("sha256", keyBytes)
        .update(
          lengthPrefixed(
            "hangar/download-link",
            "GET",
            fields.store,
            fields.object,
            fields.account,
            fields.filename,
            String(fields.expires),
          ),
        )
        .digest("base64url")
      expect(sig).toBe(expected)
      // Upload links under the same key sign another label.
      const upload = yield* UploadLinks.make.pipe(
        Effect.provide(Links.LinkSettings.layer({ key: Redacted.make(keyB64) })),
      )
      const uploadFields = {
        id: fields.object,
        account: fields.account,
        bytes: 0,
        sha256: fields.filename,
        expires: fields.expires,
      }
      expect(upload.sign(uploadFields)).not.toBe(sig)
      expect(upload.verify(uploadFields, sig)).toBe(false)
    }),
  )

  it.effect("validMs and base per link; object names are encoded in the path", () =>
    Effect.gen(function* () {
      const links = yield* fromSettings({ key: Redacted.make(keyB64), validMs: 60_000 })
      const short = parse(links.download(request))
      expect(short.fields.expires * 1000).toBeLessThanOrEqual(Date.now() + 61_000)
      const long = parse(links.download({ ...request, validMs: 3_600_000 }))
      expect(long.fields.expires * 1000).toBeGreaterThan(Date.now() + 3_500_000)
      const odd = links.download({
        ...request,
        store: "logs",
        object: "run_x.1",
        filename: "a b&c=d.ndjson",
        base: "http://10.0.0.1:9000/",
      })
      expect(odd.startsWith("http://10.0.0.1:9000/v1/downloads/logs/run_x.1?")).toBe(true)
      const parsed = parse(odd)
      expect(parsed.fields.filename).toBe("a b&c=d.ndjson")
      expect(links.verify(parsed.fields, parsed.sig)).toBe("valid")
    }),
  )

  it("the base: the public URL, else http:// and the listen address", () => {
    expect(Links.baseOf({ publicUrl: "https://x.example//", httpAddr: "0.0.0.0:1" })).toBe(
      "https://x.example",
    )
    expect(Links.baseOf({ publicUrl: "", httpAddr: "127.0.0.1:8080" })).toBe("http://127.0.0.1:8080")
    expect(Links.baseOf({ publicUrl: "", httpAddr: "0.0.0.0:8080" })).toBe("http://127.0.0.1:8080")
    expect(Links.baseOf({ publicUrl: "", httpAddr: "[::]:8080" })).toBe("http://[::1]:8080")
  })

  it.scoped("the key file is created once (0600) and shared by download and upload links", () =>
    Effect.gen(function* () {
      const dir = yield* tempDir
      const keyFile = join(dir, "upload-link.key")
      const a = yield* fromSettings({ keyFile })
      expect((yield* Effect.promise(() => stat(keyFile))).mode & 0o777).toBe(0o600)
      const b = yield* fromSettings({ keyFile })
      const { fields, sig } = parse(a.download(request))
      expect(b.verify(fields, sig)).toBe("valid")
      const upload = yield* UploadLinks.make.pipe(Effect.provide(Links.LinkSettings.layer({ keyFile })))
      const fromEnvKey = yield* UploadLinks.make.pipe(
        Effect.provide(
          Links.LinkSettings.layer({ keyFile: join(dir, "absent.key"), key: Redacted.make(keyB64) }),
        ),
      )
      const uf = { id: "file_x", account: "acc_x", bytes: 1, sha256: "00", expires: 2 }
      expect(
        upload.verify(
          uf,
          (yield* UploadLinks.make.pipe(Effect.provide(Links.LinkSettings.layer({ keyFile })))).sign(uf),
        ),
      ).toBe(true)
      expect(fromEnvKey.verify(uf, upload.sign(uf))).toBe(false)
    }),
  )

  it.effect("an env key of the wrong length refuses to start", () =>
    Effect.gen(function* () {
      const result = yield* Effect.either(
        fromSettings({ key: Redacted.make(randomBytes(31).toString("base64")) }),
      )
      expect(Either.isLeft(result) && result.left._tag).toBe("MasterKeyInvalid")
    }),
  )
})

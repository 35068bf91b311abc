/**
 * Signed download links through HTTP against the whole stack (no host): objects sealed the way
 * the host agent seals them, links signed with the stack's link key (as the actors role and host
 * agents sign them), served by the gateway with no credential. Every way of breaking a link is
 * refused and reveals nothing; a good link streams exactly the plaintext with its length and type.
 */
import { createHash, randomBytes } from "node:crypto"
import { Effect, Layer, Stream } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Keyring from "../../core/Keyring.ts"
import * as Links from "../../core/Links.ts"
import * as MasterKey from "../../core/MasterKey.ts"
import * as ObjectStore from "../../core/ObjectStore.ts"
import * as SealStream from "../../core/SealStream.ts"
import { Storage } from "../../core/Storage.ts"
import * as WrappedKeyStore from "../../core/WrappedKeyStore.ts"
import { createAccount, type Stack, startStack, type TestAccount, upload } from "../../test/harness/Stack.ts"
import { contentDisposition, plainSize } from "./routes.ts"

let stack: Stack
let a: TestAccount
let b: TestAccount

const services = Layer.mergeAll(
  SealStream.layer.pipe(
    Layer.provide(Keyring.layer),
    Layer.provide(Layer.merge(MasterKey.layer, WrappedKeyStore.layerStorage)),
    Layer.provide(MasterKey.MasterKeySettings.layerFromEnv),
  ),
  Links.layer.pipe(Layer.provide(Links.LinkSettings.layerFromEnv)),
)

/** Seals `plain` for `account` into `store` under `object` with plaintext chunks of `chunk` bytes. */
const put = (
  store: Links.DownloadStore,
  account: string,
  object: string,
  plain: Uint8Array,
  chunk?: number,
) =>
  stack.run(
    Effect.gen(function* () {
      const { names } = yield* Storage
      const seal = yield* SealStream.SealStream
      const os = yield* ObjectStore.make(names.objects[store].name)
      const pieces = Stream.fromIterable(
        Array.from({ length: Math.ceil(plain.byteLength / 100_000) }, (_, i) =>
          plain.subarray(i * 100_000, (i + 1) * 100_000),
        ),
      )
      yield* os.put(object, pieces.pipe(seal.seal(account, object, chunk)))
    }).pipe(Effect.provide(services)),
  )

const links = () => stack.run(Effect.provide(Links.Links, services))

const link = async (request: Omit<Links.DownloadRequest, "base">) => (await links()).download(request)

const parts = (url: string) => {
  const u = new URL(url)
  return { path: u.pathname, query: Object.fromEntries(u.searchParams) }
}

const withQuery = (url: string, change: Record<string, string | undefined>) => {
  const u = new URL(url)
  for (const [k, v] of Object.entries(change)) {
    if (v === undefined) u.searchParams.delete(k)
    else u.searchParams.set(k, v)
  }
  return u.toString()
}

const expectRefused = async (url: string, status: number, code: string, message?: RegExp) => {
  const res = await fetch(url)
  const body = (await res.json()) as { code: string; error: string }
  expect({ status: res.status, code: body.code }).toEqual({ status, code })
  if (message) expect(body.error).toMatch(message)
}

const sha = (data: Uint8Array) => createHash("sha256").update(data).digest("hex")

beforeAll(async () => {
  stack = await startStack({ noHost: true })
  a = await createAccount(stack, { name: "alpha" })
  b = await createAccount(stack, { name: "beta" })
}, 120_000)

afterAll(async () => {
  const left = await stack?.close()
  expect(left ?? []).toEqual([])
})

describe("a good link", () => {
  it("streams an output archive: plaintext, length, gzip type, attachment name, no caching", async () => {
    const plain = randomBytes(300_000)
    await put("outputs", a.id, "run_0000000000000000000000000a", plain)
    const url = await link({
      store: "outputs",
      object: "run_0000000000000000000000000a",
      account: a.id,
      filename: "run_0000000000000000000000000a.tar.gz",
    })
    expect(url.startsWith(`${stack.url}/v1/downloads/outputs/run_0000000000000000000000000a?`)).toBe(true)
    const res = await fetch(url)
    expect(res.status).toBe(200)
    expect(res.headers.get("content-type")).toBe("application/gzip")
    expect(res.headers.get("content-length")).toBe(String(plain.byteLength))
    expect(res.headers.get("content-disposition")).toBe(
      `attachment; filename="run_0000000000000000000000000a.tar.gz"; filename*=UTF-8''run_0000000000000000000000000a.tar.gz`,
    )
    expect(res.headers.get("cache-control")).toBe("private, no-store")
    expect(res.headers.get("x-content-type-options")).toBe("nosniff")
    expect(Buffer.from(await res.arrayBuffer()).equals(plain)).toBe(true)
  })

  it("a log part is JSON lines; credentials sent along are ignored", async () => {
    const plain = Buffer.from('{"at":"2025-01-01T00:00:00Z","kind":"setup"}\n')
    await put("logs", a.id, "run_0000000000000000000000000a.1", plain)
    const url = await link({
      store: "logs",
      object: "run_0000000000000000000000000a.1",
      account: a.id,
      filename: "run_0000000000000000000000000a.1.ndjson",
    })
    const res = await fetch(url, { headers: b.admin })
    expect(res.status).toBe(200)
    expect(res.headers.get("content-type")).toBe("application/x-ndjson")
    expect(await res.text()).toBe(plain.toString())
  })

  it("sizes at chunk boundaries, empty objects and 1 MiB chunks have the exact length", async () => {
    const cases: Array<[number, number | undefined]> = [
      [0, undefined],
      [1, undefined],
      [65_536, undefined],
      [65_537, undefined],
      [131_072, undefined],
      [0, 1024 * 1024],
      [3 * 1024 * 1024, 1024 * 1024],
      [3 * 1024 * 1024 + 5, 1024 * 1024],
    ]
    for (const [i, [bytes, chunk]] of cases.entries()) {
      const plain = randomBytes(bytes)
      const object = `file_${String(i).padStart(26, "0")}`
      await put("files", a.id, object, plain, chunk)
      const res = await fetch(await link({ store: "files", object, account: a.id, filename: "blob.bin" }))
      expect(res.status).toBe(200)
      expect(res.headers.get("content-type")).toBe("application/octet-stream")
      expect(res.headers.get("content-length")).toBe(String(bytes))
      expect(sha(Buffer.from(await res.arrayBuffer()))).toBe(sha(plain))
      expect(plainSize(SealStream.sealedSize(bytes, chunk), chunk ?? SealStream.DEFAULT_CHUNK_SIZE)).toBe(
        bytes,
      )
    }
  })

  it("an upload (PUT through its signed link) downloads back the same bytes", async () => {
    const plain = randomBytes(2_500_000)
    const id = await upload(stack, a, plain)
    const res = await fetch(await link({ store: "files", object: id, account: a.id, filename: "in.tar.gz" }))
    expect(res.status).toBe(200)
    expect(res.headers.get("content-length")).toBe(String(plain.byteLength))
    // Read piece by piece, as a client streaming to disk would.
    const hash = createHash("sha256")
    const reader = res.body!.getReader()
    for (;;) {
      const { done, value } = await reader.read()
      if (done) break
      hash.update(value)
    }
    expect(hash.digest("hex")).toBe(sha(plain))
  })

  it("a name outside ASCII is offered in both forms", async () => {
    await put("files", a.id, "file_0000000000000000000000000u", Buffer.from("x"))
    const filename = 'résumé "final".txt'
    const res = await fetch(
      await link({ store: "files", object: "file_0000000000000000000000000u", account: a.id, filename }),
    )
    expect(res.headers.get("content-disposition")).toBe(contentDisposition(filename))
    expect(res.headers.get("content-disposition")).toBe(
      `attachment; filename="r_sum_ _final_.txt"; filename*=UTF-8''r%C3%A9sum%C3%A9%20%22final%22.txt`,
    )
    expect(await res.text()).toBe("x")
  })
})

describe("a broken link", () => {
  let good: string
  beforeAll(async () => {
    await put("outputs", a.id, "run_0000000000000000000000000b", Buffer.from("secret output"))
    good = await link({
      store: "outputs",
      object: "run_0000000000000000000000000b",
      account: a.id,
      filename: "out.tar.gz",
    })
    expect((await fetch(good)).status).toBe(200)
  })

  it("any query part changed or missing: 401 not valid", async () => {
    const { query } = parts(good)
    const changes: Array<Record<string, string | undefined>> = [
      { account: b.id },
      { filename: "other.tar.gz" },
      { expires: String(Number(query.expires) + 1) },
      { expires: "soon" },
      { sig: `${query.sig!.slice(0, -1)}${query.sig!.endsWith("A") ? "B" : "A"}` },
      { sig: "" },
      { sig: undefined },
      { account: undefined },
      { filename: undefined },
      { expires: undefined },
    ]
    for (const change of changes) {
      await expectRefused(withQuery(good, change), 401, "unauthenticated", /not valid/)
    }
  })

  it("another object or store in the path: 401 not valid", async () => {
    await put("files", a.id, "run_0000000000000000000000000b", Buffer.from("other"))
    for (const path of [
      "/v1/downloads/outputs/run_0000000000000000000000000c",
      "/v1/downloads/files/run_0000000000000000000000000b",
      "/v1/downloads/inputs/run_0000000000000000000000000b",
      "/v1/downloads/secrets/run_0000000000000000000000000b",
    ]) {
      const u = new URL(good)
      u.pathname = path
      await expectRefused(u.toString(), 401, "unauthenticated", /not valid/)
    }
  })

  it("an upload link's signature is not a download signature", async () => {
    const { query } = parts(good)
    const res = await fetch(
      `${stack.url}/v1/downloads/files/file_x?account=${a.id}&filename=x&expires=${query.expires}&sig=${query.sig}`,
    )
    expect(res.status).toBe(401)
  })

  it("expired: 401 expired (a real signature with a past expiry)", async () => {
    const signer = await links()
    const fields = {
      store: "outputs" as const,
      object: "run_0000000000000000000000000b",
      account: a.id,
      filename: "out.tar.gz",
      expires: Math.floor(Date.now() / 1000) - 1,
    }
    const url = withQuery(good, { expires: String(fields.expires), sig: signer.sign(fields) })
    await expectRefused(url, 401, "unauthenticated", /expired/)
  })

  it("a valid link to an object that is gone: 404", async () => {
    const url = await link({
      store: "outputs",
      object: "run_00000000000000000000000gone",
      account: a.id,
      filename: "out.tar.gz",
    })
    await expectRefused(url, 404, "not_found")
  })

  it("a valid link naming another account than the sealer's never yields a byte of plaintext", async () => {
    const url = await link({
      store: "outputs",
      object: "run_0000000000000000000000000b",
      account: b.id,
      filename: "out.tar.gz",
    })
    const res = await fetch(url).catch((e: unknown) => e as Error)
    if (res instanceof Error) return
    // The status may have left; the body is then cut short, never the plaintext.
    const text = await res.text().catch(() => "")
    expect(text.includes("secret output")).toBe(false)
  })
})

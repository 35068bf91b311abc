/**
 * Uploads end to end over real HTTP and a real nats-server: `POST /v1/files` behind a real admin
 * key, the signed `PUT` link, and what ends up in the `files` object store (opened with the upload
 * id as object id). The PUT limit is lowered to 4 MiB by the settings so its boundary is reachable.
 */
import { createHash, createSecretKey, randomBytes } from "node:crypto"
import { mkdtemp, rm } from "node:fs/promises"
import net from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Option, Redacted } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import { uniquePrefix } from "../../test/harness/names.ts"
import { publicBase } from "./Create.ts"
import { fromKey, uploadPath } from "./Links.ts"
import { accountWithKey, startUploadGateway, type UploadGateway } from "./testing.ts"

const MiB = 1024 * 1024
const LIMIT = 4 * MiB
const linkKey = randomBytes(32)
const links = fromKey(createSecretKey(linkKey))

// biome-ignore lint/suspicious/noExplicitAny: response bodies are inspected loosely
type Json = any

let nats: StartedNatsServer
let dir: string
let gw: UploadGateway
let a: { readonly account: string; readonly token: string }
let b: { readonly account: string; readonly token: string }

const sha = (data: Uint8Array) => createHash("sha256").update(data).digest("hex")

const create = async (token: string, body: unknown): Promise<{ status: number; body: Json }> => {
  const res = await fetch(`${gw.url}/v1/files`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  })
  return { status: res.status, body: await res.json() }
}

/** A link for `data` made by account `who`. */
const linkFor = async (who: { readonly token: string }, data: Uint8Array, bytes = data.byteLength) => {
  const made = await create(who.token, { bytes, sha256: sha(data) })
  expect(made.status).toBe(201)
  return made.body as { id: string; url: string; method: "PUT"; headers: Record<string, string> }
}

const put = async (
  url: string,
  body: Uint8Array | ReadableStream<Uint8Array>,
  headers: Record<string, string> = { "content-type": "application/octet-stream" },
): Promise<{ status: number; body: Json }> => {
  const res = await fetch(url, {
    method: "PUT",
    headers,
    body,
    ...(body instanceof Uint8Array ? {} : { duplex: "half" }),
  } as RequestInit)
  return { status: res.status, body: await res.json() }
}

// A chunked body (no content-length) of `data`, in 64 KiB pieces.
const chunked = (data: Uint8Array): ReadableStream<Uint8Array> => {
  let at = 0
  return new ReadableStream({
    pull(controller) {
      if (at >= data.byteLength) return controller.close()
      controller.enqueue(data.slice(at, at + 64 * 1024))
      at += 64 * 1024
    },
  })
}

const recordOf = async (id: string) =>
  Option.getOrThrow(await Effect.runPromise(gw.uploads.get(id).pipe(Effect.orDie))).value

const until = async (what: string, check: () => boolean | Promise<boolean>) => {
  for (let i = 0; i < 1000; i++) {
    if (await check()) return
    await new Promise((r) => setTimeout(r, 20))
  }
  throw new Error(`gave up waiting for ${what}`)
}

/** The refusal of a PUT that must leave no object and the record pending. */
const expectNothingStored = async (id: string, messagesBefore: number) => {
  expect(Option.isNone(await gw.stored((await recordOf(id)).account, id))).toBe(true)
  expect(await gw.storedMessages()).toBe(messagesBefore)
  expect((await recordOf(id)).state).toBe("pending")
}

beforeAll(async () => {
  nats = await startNatsServer()
  dir = await mkdtemp(join(tmpdir(), "hangar-uploads-"))
  gw = await startUploadGateway({
    natsUrl: nats.url,
    prefix: uniquePrefix(),
    dir,
    upload: { maxBytes: LIMIT },
    links: { key: Redacted.make(linkKey.toString("base64")) },
  })
  a = await accountWithKey(gw.accounts, "alpha")
  b = await accountWithKey(gw.accounts, "beta")
})

afterAll(async () => {
  await gw?.close()
  await nats?.stop()
  if (dir) await rm(dir, { recursive: true, force: true })
})

describe("POST /v1/files", () => {
  it("answers a signed PUT link of this gateway with exactly the headers to send", async () => {
    const data = randomBytes(10)
    const made = await create(a.token, { bytes: 10, sha256: sha(data) })
    expect(made.status).toBe(201)
    expect(Object.keys(made.body).sort()).toEqual(["headers", "id", "method", "url"])
    expect(made.body.id).toMatch(/^file_[0-9a-hjkmnp-tv-z]{26}$/)
    expect(made.body.method).toBe("PUT")
    expect(made.body.headers).toEqual({ "content-type": "application/octet-stream", "content-length": "10" })
    const url = new URL(made.body.url)
    expect(`${url.protocol}//${url.host}`).toBe(gw.url)
    expect(url.pathname).toBe(uploadPath(made.body.id))
    expect([...url.searchParams.keys()]).toEqual(["expires", "sig"])
    const expires = Number(url.searchParams.get("expires"))
    expect(expires - Date.now() / 1000).toBeGreaterThan(3500)
    expect(expires - Date.now() / 1000).toBeLessThanOrEqual(3600)
    expect(await recordOf(made.body.id)).toMatchObject({
      id: made.body.id,
      account: a.account,
      bytes: 10,
      sha256: sha(data),
      state: "pending",
      expires_at: new Date(expires * 1000).toISOString(),
    })
  })

  it("needs a credential of the account", async () => {
    const res = await fetch(`${gw.url}/v1/files`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ bytes: 1, sha256: sha(new Uint8Array(1)) }),
    })
    expect(res.status).toBe(401)
    expect(((await res.json()) as Json).code).toBe("unauthenticated")
  })

  it("bytes: 5 GB is accepted, one more byte is refused naming bytes; both fields are required", async () => {
    const hash = sha(new Uint8Array(0))
    const at = await create(a.token, { bytes: 5_000_000_000, sha256: hash })
    expect(at.status).toBe(201)
    expect(at.body.headers).toEqual({ "content-type": "application/octet-stream" })
    const below = await create(a.token, { bytes: 999_999_999, sha256: hash })
    expect(below.body.headers).toEqual({
      "content-type": "application/octet-stream",
      "content-length": "999999999",
    })
    const over = await create(a.token, { bytes: 5_000_000_001, sha256: hash })
    expect(over.status).toBe(400)
    expect(over.body.code).toBe("invalid_request")
    expect(over.body.error).toMatch(/^bytes: /)
    for (const [body, field] of [
      [{ bytes: -1, sha256: hash }, "bytes"],
      [{ bytes: 1.5, sha256: hash }, "bytes"],
      [{ sha256: hash }, "bytes"],
      [{ bytes: 1 }, "sha256"],
      [{ bytes: 1, sha256: hash.toUpperCase() }, "sha256"],
      [{ bytes: 1, sha256: "abc" }, "sha256"],
    ] as const) {
      const res = await create(a.token, body)
      expect(res.status).toBe(400)
      expect(res.body.error).toMatch(new RegExp(`^${field}: `))
    }
  })

  it("the link base is the public URL setting, else the request's host, else localhost", () => {
    expect(publicBase("https://api.example.com/", "h:1")).toBe("https://api.example.com")
    expect(publicBase("", "127.0.0.1:5000")).toBe("http://127.0.0.1:5000")
    expect(publicBase("", "[::1]:5000")).toBe("http://[::1]:5000")
    expect(publicBase("", "evil.com/x?")).toBe("http://localhost")
    expect(publicBase("", undefined)).toBe("http://localhost")
  })
})

describe("PUT to the link", () => {
  it.each([
    ["1 byte", 1],
    ["0 bytes", 0],
    ["exactly the limit", LIMIT],
  ])("%s is stored sealed under the upload id and opens to the same bytes", async (_, size) => {
    const data = randomBytes(size)
    const link = await linkFor(a, data)
    const res = await put(link.url, data, link.headers)
    expect(res).toEqual({ status: 200, body: { id: link.id, bytes: size, sha256: sha(data) } })
    const stored = Option.getOrThrow(await gw.stored(a.account, link.id))
    expect(stored.info.name).toBe(link.id)
    expect(stored.plain.equals(data)).toBe(true)
    // Sealed at rest: the stored size is the plaintext plus the header and one tag per chunk.
    expect(stored.info.size).toBeGreaterThan(size)
    expect((await recordOf(link.id)).state).toBe("complete")
  })

  it("one byte past the limit is 413 payload_too_large, with nothing stored", async () => {
    const data = randomBytes(LIMIT + 1)
    const link = await linkFor(a, data)
    const before = await gw.storedMessages()
    const res = await put(link.url, data, link.headers)
    expect(res.status).toBe(413)
    expect(res.body).toEqual({ code: "payload_too_large", error: `request body over ${LIMIT} bytes` })
    await expectNothingStored(link.id, before)
  })

  it("a chunked body at the limit is stored too", async () => {
    const data = randomBytes(LIMIT)
    const link = await linkFor(a, data)
    const res = await put(link.url, chunked(data))
    expect(res.status).toBe(200)
    expect(Option.getOrThrow(await gw.stored(a.account, link.id)).plain.equals(data)).toBe(true)
  })

  it("another SHA-256 is 400 naming sha256, and what was written is gone", async () => {
    const data = randomBytes(3 * MiB)
    const link = await linkFor(a, data)
    const before = await gw.storedMessages()
    data[12345] = (data[12345]! + 1) & 255
    const res = await put(link.url, data, link.headers)
    expect(res.status).toBe(400)
    expect(res.body.code).toBe("invalid_request")
    expect(res.body.error).toMatch(/^sha256: /)
    await expectNothingStored(link.id, before)
  })

  it("a body shorter or longer than announced is 400 naming bytes, with content-length or chunked", async () => {
    const data = randomBytes(2 * MiB)
    const before = await gw.storedMessages()
    const cases = [
      { body: data.subarray(0, data.byteLength - 1), error: /^bytes: content-length 2097151 is not/ },
      { body: Buffer.concat([data, Buffer.from("x")]), error: /^bytes: content-length 2097153 is not/ },
      { body: chunked(data.subarray(0, data.byteLength - 1)), error: /^bytes: the body has 2097151 bytes/ },
      { body: chunked(Buffer.concat([data, Buffer.from("x")])), error: /^bytes: the body is longer/ },
    ]
    for (const { body, error } of cases) {
      const link = await linkFor(a, data)
      const res = await put(link.url, body)
      expect(res.status).toBe(400)
      expect(res.body.code).toBe("invalid_request")
      expect(res.body.error).toMatch(error)
      await expectNothingStored(link.id, before)
    }
  })

  it("another content-type is 400 naming content-type", async () => {
    const data = randomBytes(5)
    const link = await linkFor(a, data)
    const res = await put(link.url, data, { "content-type": "text/plain" })
    expect(res.status).toBe(400)
    expect(res.body.error).toMatch(/^content-type: /)
  })

  it("an expired link, or one whose expiry was moved, is 401 unauthenticated", async () => {
    const data = randomBytes(5)
    const link = await linkFor(a, data)
    const fields = { id: link.id, account: a.account, bytes: 5, sha256: sha(data) }
    const past = Math.floor(Date.now() / 1000) - 1
    const expired = await put(
      `${gw.url}${uploadPath(link.id)}?expires=${past}&sig=${links.sign({ ...fields, expires: past })}`,
      data,
    )
    expect(expired.status).toBe(401)
    expect(expired.body).toEqual({ code: "unauthenticated", error: "the upload link has expired" })
    const url = new URL(link.url)
    url.searchParams.set("expires", String(Number(url.searchParams.get("expires")) + 3600))
    const moved = await put(url.toString(), data)
    expect(moved.status).toBe(401)
    // The real link still works afterwards.
    expect((await put(link.url, data)).status).toBe(200)
  })

  it("a forged, missing or malformed signature, or an unknown upload, is 401", async () => {
    const data = randomBytes(5)
    const link = await linkFor(a, data)
    const url = new URL(link.url)
    const sig = url.searchParams.get("sig")!
    const variants = [
      (u: URL) => u.searchParams.set("sig", `${sig[0] === "A" ? "B" : "A"}${sig.slice(1)}`),
      (u: URL) => u.searchParams.delete("sig"),
      (u: URL) => u.searchParams.set("sig", "not-a-signature"),
      (u: URL) => u.searchParams.delete("expires"),
      (u: URL) => {
        u.pathname = uploadPath("file_0000000000000000000000000a")
      },
      (u: URL) => {
        u.pathname = uploadPath("nonsense")
      },
    ]
    for (const change of variants) {
      const forged = new URL(link.url)
      change(forged)
      const res = await put(forged.toString(), data)
      expect(res.status).toBe(401)
      expect(res.body.code).toBe("unauthenticated")
    }
    expect((await recordOf(link.id)).state).toBe("pending")
  })

  it("a link of account A cannot store into account B's upload, even re-signed for A", async () => {
    const data = randomBytes(5)
    const mine = await linkFor(a, data)
    const theirs = await linkFor(b, data)
    // A's query string on B's upload id.
    const swapped = new URL(mine.url)
    swapped.pathname = uploadPath(theirs.id)
    expect((await put(swapped.toString(), data)).status).toBe(401)
    // A signature over B's upload id with A as the account (as if A could sign): the record says B.
    const expires = Math.floor(Date.now() / 1000) + 600
    const asA = links.sign({ id: theirs.id, account: a.account, bytes: 5, sha256: sha(data), expires })
    expect((await put(`${gw.url}${uploadPath(theirs.id)}?expires=${expires}&sig=${asA}`, data)).status).toBe(
      401,
    )
    expect((await recordOf(theirs.id)).state).toBe("pending")
    // B's own link works, and the object is sealed for B: it does not open as A's.
    expect((await put(theirs.url, data)).status).toBe(200)
    expect(Option.getOrThrow(await gw.stored(b.account, theirs.id)).plain.equals(data)).toBe(true)
    await expect(gw.stored(a.account, theirs.id)).rejects.toThrow()
  })

  it("a second upload to a completed id is 409 conflict and leaves the object as it was", async () => {
    const data = randomBytes(1000)
    const link = await linkFor(a, data)
    expect((await put(link.url, data)).status).toBe(200)
    const first = Option.getOrThrow(await gw.stored(a.account, link.id)).info
    const again = await put(link.url, data)
    expect(again.status).toBe(409)
    expect(again.body.code).toBe("conflict")
    expect(Option.getOrThrow(await gw.stored(a.account, link.id)).info.revision).toBe(first.revision)
  })

  it("a client that disconnects mid-body leaves no object and no chunks; the record stays pending", async () => {
    const data = randomBytes(LIMIT)
    const link = await linkFor(a, data)
    const before = await gw.storedMessages()
    const url = new URL(link.url)
    const socket = net.connect(Number(url.port), url.hostname)
    await new Promise<void>((resolve, reject) => {
      socket.once("connect", resolve)
      socket.once("error", reject)
    })
    socket.on("error", () => undefined)
    socket.write(
      `PUT ${url.pathname}${url.search} HTTP/1.1\r\nhost: ${url.host}\r\ncontent-type: application/octet-stream\r\ncontent-length: ${LIMIT}\r\nx-request-id: cut-1\r\n\r\n`,
    )
    socket.write(data.subarray(0, 3 * MiB))
    // Some sealed chunks have reached the store before the client goes away.
    await until("chunks stored", async () => (await gw.storedMessages()) > before)
    socket.destroy()
    await until("the request's end", () =>
      gw.lines.some((l) => l.includes('"cut-1"') && l.includes('"msg":"request"')),
    )
    const line = JSON.parse(gw.lines.find((l) => l.includes('"cut-1"') && l.includes('"msg":"request"'))!)
    expect(line).toMatchObject({ aborted: true, status: 499, route: "/v1/uploads/:id" })
    await expectNothingStored(link.id, before)
    // The link still works for a complete upload.
    expect((await put(link.url, data, link.headers)).status).toBe(200)
  })
})

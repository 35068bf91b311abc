/**
 * `v1a` signatures: the published Standard Webhooks test vector, and an independent verifier
 * (node:crypto Ed25519 over the raw `whpk_` public key, written here from the spec, not from
 * `Signing.ts`).
 *
 * The vector is `TestAsymmetricWebhookSign` of the reference Go library,
 * https://github.com/standard-webhooks/standard-webhooks/blob/5fb2ce9369bd9533ed635c0c84f8d7b0dac3a5bf/libraries/go/webhook_asymmetric_test.go
 * (key = a 32-byte Ed25519 seed in base64, as `whsk_` keys are serialized; the Go library builds the
 * private key with `ed25519.NewKeyFromSeed`). The signed content `{id}.{timestamp}.{payload}` is
 * from the spec, `spec/standard-webhooks.md`, "Signature scheme".
 */
import { createPrivateKey, createPublicKey, generateKeyPairSync, verify } from "node:crypto"
import { describe, expect, it } from "@effect/vitest"
import { signHeaders } from "./Signing.ts"

const vector = {
  key: "VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=",
  msgId: "msg_p5jXN8AQM9LWM0D4loKWxJek",
  timestamp: 1614265330,
  payload: '{"test": 2432232314}',
  expected: "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7KaaBRdM5WqyeFiL8Ag==",
}

/** A PKCS#8 Ed25519 private key from a 32-byte seed (RFC 8410 prefix + seed). */
const keyFromSeed = (seedBase64: string) =>
  createPrivateKey({
    key: Buffer.concat([
      Buffer.from("302e020100300506032b657004220420", "hex"),
      Buffer.from(seedBase64, "base64"),
    ]),
    format: "der",
    type: "pkcs8",
  })

/**
 * An independent receiver-side check, written from the spec: `whpk_<base64 raw key>`, headers,
 * body as received. Any one `v1a,` entry of the space-separated list may match.
 */
const receiverVerifies = (whpk: string, headers: Record<string, string>, body: string): boolean => {
  const raw = Buffer.from(whpk.replace(/^whpk_/, ""), "base64")
  const publicKey = createPublicKey({
    key: { kty: "OKP", crv: "Ed25519", x: raw.toString("base64url") },
    format: "jwk",
  })
  const content = Buffer.from(`${headers["webhook-id"]}.${headers["webhook-timestamp"]}.${body}`)
  return (headers["webhook-signature"] ?? "")
    .split(" ")
    .filter((s) => s.startsWith("v1a,"))
    .some((s) => verify(null, content, publicKey, Buffer.from(s.slice(4), "base64")))
}

const whpkOf = (publicKey: ReturnType<typeof createPublicKey>) =>
  `whpk_${Buffer.from(publicKey.export({ format: "jwk" }).x!, "base64url").toString("base64")}`

describe("v1a signing", () => {
  it("matches the Standard Webhooks v1a test vector", () => {
    const headers = signHeaders(keyFromSeed(vector.key), vector.msgId, vector.timestamp, vector.payload)
    expect(headers).toEqual({
      "webhook-id": vector.msgId,
      "webhook-timestamp": String(vector.timestamp),
      "webhook-signature": vector.expected,
    })
  })

  it("the vector's signature verifies with the independent verifier", () => {
    const whpk = whpkOf(createPublicKey(keyFromSeed(vector.key)))
    const headers = {
      "webhook-id": vector.msgId,
      "webhook-timestamp": String(vector.timestamp),
      "webhook-signature": vector.expected,
    }
    expect(receiverVerifies(whpk, headers, vector.payload)).toBe(true)
    expect(receiverVerifies(whpk, headers, '{"test": 2432232315}')).toBe(false)
  })

  it("a fresh key's signatures verify, and any change to id, timestamp or body breaks them", () => {
    const { publicKey, privateKey } = generateKeyPairSync("ed25519")
    const whpk = whpkOf(publicKey)
    const body = JSON.stringify({ id: "evt_1", type: "run.succeeded", data: { é: "ü ✓" } })
    const headers = { ...signHeaders(privateKey, "evt_1", 1_700_000_000, body) }
    expect(headers["webhook-signature"]).toMatch(/^v1a,[A-Za-z0-9+/]{86}==$/)
    expect(receiverVerifies(whpk, headers, body)).toBe(true)
    expect(receiverVerifies(whpk, { ...headers, "webhook-id": "evt_2" }, body)).toBe(false)
    expect(receiverVerifies(whpk, { ...headers, "webhook-timestamp": "1700000001" }, body)).toBe(false)
    expect(receiverVerifies(whpk, headers, `${body} `)).toBe(false)
    const other = whpkOf(generateKeyPairSync("ed25519").publicKey)
    expect(receiverVerifies(other, headers, body)).toBe(false)
  })

  it("refuses an id with a '.' and a fractional timestamp", () => {
    const { privateKey } = generateKeyPairSync("ed25519")
    expect(() => signHeaders(privateKey, "evt.1", 1, "{}")).toThrow()
    expect(() => signHeaders(privateKey, "evt_1", 1.5, "{}")).toThrow()
  })
})

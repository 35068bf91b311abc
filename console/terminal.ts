/**
 * The spec's terminal session protocol in the browser, with WebCrypto only: the ECDH P-256 key
 * pair is made here with a private key that cannot be exported, the session keys are derived here,
 * and every frame is sealed and opened here, so the keys never leave the browser and the relay sees
 * only kinds, sequences and sealed bytes (the same end-to-end property as the CLI's `core/Terminal.ts`).
 *
 *   keys    HKDF-SHA-256 over the ECDH secret, salt = SHA-256("service-terminal-v1", 0x00, caller
 *           public key, host public key), info = "service-terminal-v1 keys", 64 bytes: the first 32
 *           seal what the caller sends, the last 32 what the host sends.
 *   frame   kind (1) · sequence (8, big-endian, from 0 each way) · AES-256-GCM data and tag;
 *           nonce = 4 zero bytes · sequence; associated data = kind · sequence; 32 KiB at most.
 */
import { api } from "./api.ts"

const LABEL = "service-terminal-v1"
const FRAME_MAX_BYTES = 32 * 1024
const DATA_MAX_BYTES = FRAME_MAX_BYTES - 9 - 16
export const Kind = { input: 1, output: 2, resize: 3, exit: 4 } as const

const utf8 = new TextEncoder()

const base64url = (bytes: Uint8Array): string =>
  btoa(String.fromCharCode(...bytes))
    .replace(/\+/g, "-")
    .replace(/\//g, "_")
    .replace(/=+$/, "")

const fromBase64url = (text: string): Uint8Array<ArrayBuffer> => {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/")
  const raw = atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4))
  const out = new Uint8Array(raw.length)
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i)
  return out
}

const concat = (...parts: ReadonlyArray<Uint8Array>): Uint8Array<ArrayBuffer> => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0))
  let at = 0
  for (const p of parts) {
    out.set(p, at)
    at += p.byteLength
  }
  return out
}

const header = (kind: number, sequence: bigint): Uint8Array<ArrayBuffer> => {
  const h = new Uint8Array(9)
  h[0] = kind
  new DataView(h.buffer).setBigUint64(1, sequence)
  return h
}
const nonceOf = (h: Uint8Array) => concat(new Uint8Array(4), h.subarray(1, 9))

/** What a session tells its page. */
export interface SessionEvents {
  readonly output: (data: Uint8Array) => void
  readonly exit: (status: number) => void
  readonly closed: (reason: string) => void
}

/** An open terminal session. */
export interface Session {
  readonly input: (text: string) => void
  readonly resize: (rows: number, cols: number) => void
  readonly close: () => void
}

/** Waits for a command to end (the spec's `wait`, repeated). */
const ended = async (run: string, id: string) => {
  for (;;) {
    const c = await api("GET", `/v1/runs/${run}/commands/${id}?wait=25`)
    if (c.state !== "queued" && c.state !== "running") return c
  }
}

/** Opens a terminal on `run`: a `terminal` command with our public key, then the relay. */
export const openSession = async (
  run: string,
  size: { readonly rows: number; readonly cols: number },
  on: SessionEvents,
): Promise<Session> => {
  const subtle = crypto.subtle
  // The private key is not extractable: nothing, not even this page, can read it out.
  const pair = (await subtle.generateKey({ name: "ECDH", namedCurve: "P-256" }, false, [
    "deriveBits",
  ])) as CryptoKeyPair
  const callerPublic = new Uint8Array(await subtle.exportKey("raw", pair.publicKey))
  const sent = await api("POST", `/v1/runs/${run}/commands`, {
    kind: "terminal",
    arguments: { rows: size.rows, cols: size.cols, public_key: base64url(callerPublic) },
  })
  const done = await ended(run, sent.id)
  if (done.state !== "succeeded" || done.result?.route === undefined)
    throw new Error(`the terminal could not open: ${JSON.stringify(done.error ?? done.result ?? done.state)}`)
  const {
    relay_url: relayUrl,
    route,
    public_key: hostKeyText,
  } = done.result as {
    relay_url: string
    route: string
    public_key: string
  }
  const hostPublic = fromBase64url(hostKeyText)
  const hostKey = await subtle.importKey("raw", hostPublic, { name: "ECDH", namedCurve: "P-256" }, false, [])
  const secret = await subtle.deriveBits({ name: "ECDH", public: hostKey }, pair.privateKey, 256)
  const salt = await subtle.digest(
    "SHA-256",
    concat(utf8.encode(LABEL), new Uint8Array([0]), callerPublic, hostPublic),
  )
  const hkdf = await subtle.importKey("raw", secret, "HKDF", false, ["deriveBits"])
  const okm = new Uint8Array(
    await subtle.deriveBits(
      { name: "HKDF", hash: "SHA-256", salt, info: utf8.encode(`${LABEL} keys`) },
      hkdf,
      512,
    ),
  )
  const sealKey = await subtle.importKey("raw", okm.slice(0, 32), "AES-GCM", false, ["encrypt"])
  const openKey = await subtle.importKey("raw", okm.slice(32, 64), "AES-GCM", false, ["decrypt"])
  okm.fill(0)

  const ws = new WebSocket(`${relayUrl}?route=${encodeURIComponent(route)}&side=caller`)
  ws.binaryType = "arraybuffer"
  let sendSeq = 0n
  let receiveSeq = 0n
  let exited = false
  // Frames are sealed and opened in order: each waits for the one before it.
  let sending: Promise<unknown> = new Promise((resolve) =>
    ws.addEventListener("open", resolve, { once: true }),
  )
  let receiving: Promise<unknown> = Promise.resolve()

  const send = (kind: number, data: Uint8Array) => {
    sending = sending.then(async () => {
      const h = header(kind, sendSeq++)
      const sealed = new Uint8Array(
        await subtle.encrypt(
          { name: "AES-GCM", iv: nonceOf(h), additionalData: h },
          sealKey,
          data as Uint8Array<ArrayBuffer>,
        ),
      )
      if (ws.readyState === WebSocket.OPEN) ws.send(concat(h, sealed))
    })
  }

  ws.addEventListener("message", (e) => {
    const frame = new Uint8Array(e.data as ArrayBuffer)
    receiving = receiving.then(async () => {
      if (frame.byteLength < 25 || frame.byteLength > FRAME_MAX_BYTES) return ws.close(1008, "bad frame")
      const h = frame.slice(0, 9)
      const sequence = new DataView(h.buffer).getBigUint64(1)
      if (sequence !== receiveSeq) return ws.close(1008, "frame out of sequence")
      receiveSeq++
      let data: Uint8Array
      try {
        data = new Uint8Array(
          await subtle.decrypt(
            { name: "AES-GCM", iv: nonceOf(h), additionalData: h },
            openKey,
            frame.slice(9),
          ),
        )
      } catch {
        return ws.close(1008, "frame does not open")
      }
      if (h[0] === Kind.output) on.output(data)
      else if (h[0] === Kind.exit && data.byteLength === 4) {
        exited = true
        on.exit(new DataView(data.buffer).getInt32(0))
      }
    })
  })
  ws.addEventListener("close", (e) => {
    void receiving.then(() => on.closed(exited ? "" : e.reason || `closed (${e.code})`))
  })

  return {
    input: (text) => {
      const bytes = utf8.encode(text)
      for (let at = 0; at < bytes.byteLength; at += DATA_MAX_BYTES)
        send(Kind.input, bytes.subarray(at, at + DATA_MAX_BYTES))
    },
    resize: (rows, cols) => {
      const d = new Uint8Array(4)
      new DataView(d.buffer).setUint16(0, rows)
      new DataView(d.buffer).setUint16(2, cols)
      send(Kind.resize, d)
    },
    close: () => ws.close(1000, "closed by the caller"),
  }
}

/**
 * The terminal session protocol (spec "Terminal session protocol"): keys and frames, shared by the
 * host agent (the host end), the relay (which only reads a frame's kind, sequence and size) and the
 * CLI (the caller end).
 *
 *   keys    ECDH P-256; HKDF-SHA-256 over the shared secret, salt = SHA-256("service-terminal-v1",
 *           0x00, caller public key, host public key), info = "service-terminal-v1 keys", 64 bytes:
 *           the first 32 seal what the caller sends, the last 32 what the host sends.
 *   frame   kind (1 byte) · sequence (8 bytes, big-endian, from 0 in each direction) · AES-256-GCM
 *           sealed data and its 16-byte tag; nonce = 4 zero bytes · sequence; associated data =
 *           kind · sequence. 32 KiB at most.
 *   kinds   1 input and 3 resize (rows, cols as big-endian 16-bit) from the caller; 2 output and
 *           4 exit status (big-endian 32-bit, sent last) from the host.
 *
 * Between a relay and the host end (both NATS clients) a route has three core NATS subjects
 * (`names.subjects.terminal`): `join` (the relay asks the host end whether a caller may join; no
 * answer means no such route), `in` (the caller's frames, and the relay's own notes, kind 0) and
 * `out` (the host's frames, and its notes, kind 0). A note is kind 0 followed by UTF-8 text:
 * `credit <n>` (the relay has passed on n more of the host's frames; the host keeps at most a
 * window of frames not yet passed on), `close <code> <reason>` (the session is over), `alive`
 * (a heartbeat: once a caller joined, each side sends it every `heartbeatMs`; any message from the
 * other side counts as heard, and a side that heard nothing for three heartbeats ends the session
 * as if told `close`: the host end 1001 "the caller's relay is gone", the relay 1011 "the host end
 * is gone"). A relay never passes a note on to its caller.
 *
 * This module needs nothing but `node:crypto`, so the CLI loads it without the service's runtime;
 * the settings of the relay and the host end are in `TerminalSettings.ts`.
 */
import { createCipheriv, createDecipheriv, createECDH, createHash, type ECDH, hkdfSync } from "node:crypto"

/** The protocol's label. */
export const LABEL = "service-terminal-v1"
/** The largest frame, header and tag included. */
export const FRAME_MAX_BYTES = 32 * 1024
const HEADER_BYTES = 9
const TAG_BYTES = 16
/** The most data one frame carries. */
export const FRAME_DATA_MAX_BYTES = FRAME_MAX_BYTES - HEADER_BYTES - TAG_BYTES

/** Frame kinds; 0 is a note between the relay and the host end, never sent to a caller. */
export const Kind = { note: 0, input: 1, output: 2, resize: 3, exit: 4 } as const
export type Kind = (typeof Kind)[keyof typeof Kind]

/** The kinds a caller sends. */
export const callerKinds: ReadonlySet<number> = new Set([Kind.input, Kind.resize])

/** A fresh ECDH P-256 key pair; `publicKey` is the uncompressed point (65 bytes). */
export const newKeyPair = (): { readonly ecdh: ECDH; readonly publicKey: Buffer } => {
  const ecdh = createECDH("prime256v1")
  return { ecdh, publicKey: ecdh.generateKeys() }
}

/** The session's two keys, from one side's pair and the other's public key. */
export const sessionKeys = (
  own: ECDH,
  peerPublicKey: Uint8Array,
  callerPublicKey: Uint8Array,
  hostPublicKey: Uint8Array,
): { readonly callerToHost: Buffer; readonly hostToCaller: Buffer } => {
  const secret = own.computeSecret(peerPublicKey)
  const salt = createHash("sha256")
    .update(LABEL)
    .update(Buffer.from([0]))
    .update(callerPublicKey)
    .update(hostPublicKey)
    .digest()
  const okm = Buffer.from(hkdfSync("sha256", secret, salt, `${LABEL} keys`, 64))
  return { callerToHost: okm.subarray(0, 32), hostToCaller: okm.subarray(32, 64) }
}

const headerOf = (kind: number, sequence: bigint) => {
  const header = Buffer.alloc(HEADER_BYTES)
  header[0] = kind
  header.writeBigUInt64BE(sequence, 1)
  return header
}
const nonceOf = (header: Buffer) => Buffer.concat([Buffer.alloc(4), header.subarray(1, HEADER_BYTES)])

/** Seals `data` (at most `FRAME_DATA_MAX_BYTES`) as frame `sequence` of `kind`. */
export const seal = (key: Uint8Array, kind: number, sequence: bigint, data: Uint8Array): Buffer => {
  if (data.byteLength > FRAME_DATA_MAX_BYTES) throw new RangeError("frame data over 32 KiB")
  const header = headerOf(kind, sequence)
  const cipher = createCipheriv("aes-256-gcm", key, nonceOf(header))
  cipher.setAAD(header)
  return Buffer.concat([header, cipher.update(data), cipher.final(), cipher.getAuthTag()])
}

/** A frame's kind and sequence, read without its key (what the relay may see). */
export const peek = (
  frame: Uint8Array,
):
  | { readonly kind: number; readonly sequence: bigint }
  | { readonly problem: string; readonly code: number } => {
  if (frame.byteLength > FRAME_MAX_BYTES) return { problem: "frame over 32 KiB", code: CloseCode.tooBig }
  if (frame.byteLength < HEADER_BYTES)
    return { problem: "frame shorter than its header", code: CloseCode.protocol }
  const bytes = Buffer.from(frame.buffer, frame.byteOffset, frame.byteLength)
  return { kind: bytes[0] as number, sequence: bytes.readBigUInt64BE(1) }
}

/** Opens frame `expected` of a direction; a problem (a sentence) when it does not open as that frame. */
export const open = (
  key: Uint8Array,
  frame: Uint8Array,
  expected: bigint,
): { readonly kind: number; readonly data: Buffer } | { readonly problem: string } => {
  const head = peek(frame)
  if ("problem" in head) return head
  if (frame.byteLength < HEADER_BYTES + TAG_BYTES) return { problem: "frame shorter than its tag" }
  if (head.sequence !== expected)
    return { problem: `frame ${head.sequence} out of sequence (expected ${expected})` }
  const bytes = Buffer.from(frame.buffer, frame.byteOffset, frame.byteLength)
  const header = bytes.subarray(0, HEADER_BYTES)
  try {
    const decipher = createDecipheriv("aes-256-gcm", key, nonceOf(header))
    decipher.setAAD(header)
    decipher.setAuthTag(bytes.subarray(bytes.length - TAG_BYTES))
    const data = Buffer.concat([
      decipher.update(bytes.subarray(HEADER_BYTES, bytes.length - TAG_BYTES)),
      decipher.final(),
    ])
    return { kind: head.kind, data }
  } catch {
    return { problem: "frame does not open" }
  }
}

/** The data of an exit status frame. */
export const exitData = (status: number): Buffer => {
  const data = Buffer.alloc(4)
  data.writeInt32BE(status, 0)
  return data
}

/** A note between the relay and the host end. */
export type Note =
  | { readonly _tag: "credit"; readonly frames: number }
  | { readonly _tag: "close"; readonly code: number; readonly reason: string }
  | { readonly _tag: "alive" }

const textOf = (note: Note): string => {
  switch (note._tag) {
    case "credit":
      return `credit ${note.frames}`
    case "close":
      return `close ${note.code} ${note.reason}`
    case "alive":
      return "alive"
  }
}

/** A note as bytes (kind 0, then its text). */
export const encodeNote = (note: Note): Buffer =>
  Buffer.concat([Buffer.from([Kind.note]), Buffer.from(textOf(note), "utf8")])

/** The note a kind-0 message holds, if it reads as one. */
export const decodeNote = (message: Uint8Array): Note | undefined => {
  if (message[0] !== Kind.note) return undefined
  const text = Buffer.from(message.buffer, message.byteOffset + 1, message.byteLength - 1).toString("utf8")
  if (text === "alive") return { _tag: "alive" }
  const credit = /^credit (\d{1,6})$/.exec(text)
  if (credit) return { _tag: "credit", frames: Number(credit[1]) }
  const close = /^close (\d{4}) ?(.*)$/s.exec(text)
  if (close) return { _tag: "close", code: Number(close[1]), reason: (close[2] ?? "").slice(0, 120) }
  return undefined
}

/**
 * Heartbeats with nothing heard from the other side after which a side takes it as gone. Counted
 * in beats, not wall time: an event loop stalled for a while misses one beat, not three.
 */
export const SILENT_HEARTBEATS_MAX = 3

/** WebSocket close codes a session ends with. */
export const CloseCode = {
  /** The shell exited, or the run ended. */
  normal: 1000,
  /** A frame broke the protocol (did not open, out of sequence, unknown kind). */
  protocol: 1008,
  /** A frame over 32 KiB. */
  tooBig: 1009,
  /** The other end went away (the caller closed, or the host end heard nothing from its relay). */
  goingAway: 1001,
  /** The relay heard nothing from the host end for three heartbeats. */
  internalError: 1011,
} as const

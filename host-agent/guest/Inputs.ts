/**
 * Unpacks a run's input into `/workspace/in`. The sealed upload is read from the object store,
 * opened, gunzipped and filtered by `TarFilter` on the host while it streams, and only the
 * filter's re-emitted tar goes to the guest's `tar -x`; so an archive is refused (failure `input`)
 * when it is not gzip, is a plain `.tar`, holds anything but regular files and folders, has an
 * absolute or `..` path, or declares more file data than the disk holds. A gzip bomb that declares
 * little but expands past the disk fills only the machine's own `/workspace` ext4, whose ENOSPC
 * becomes the same `input` failure. On any failure `/workspace/in` is removed again.
 */
import { once } from "node:events"
import { Readable } from "node:stream"
import { createGunzip } from "node:zlib"
import { type Cause, Data, Effect, Option, Stream } from "effect"
import type { KeyringError } from "../../core/Keyring.ts"
import type { NatsError } from "../../core/Nats.ts"
import type { ObjectCorrupt, ObjectStore } from "../../core/ObjectStore.ts"
import { type DecryptFailed, SealStream } from "../../core/SealStream.ts"
import { type ChannelExit, collect } from "./Channel.ts"
import type { GuestSession, GuestUnavailable, RawChannel } from "./GuestSession.ts"
import * as Manifest from "./Manifest.ts"
import { TarFilter, TarRefused } from "./Tar.ts"

/** Where the input is unpacked. */
export const INPUT_DIR = "/workspace/in"

/** The input breaks a rule: the run's `input` failure, with `detail` for people. */
export class InputFailed extends Data.TaggedError("InputFailed")<{ readonly detail: string }> {}

/** A sealed object: its store, the account whose key sealed it, and its name (also the seal's object id). */
export interface SealedObject {
  readonly store: ObjectStore
  readonly account: string
  readonly name: string
}

/** What was unpacked. */
export interface Unpacked {
  /** Files and folders written. */
  readonly entries: number
  /** Bytes of file data written. */
  readonly bytes: number
}

/** Infrastructure errors: reading or opening the object, or reaching the guest. */
export type SourceError = NatsError | ObjectCorrupt | KeyringError | DecryptFailed

const USTAR_AT = 257

// Holds back the first bytes until the gzip magic (or a plain tar's `ustar`) can be told apart.
async function* sniffed(source: AsyncIterable<Uint8Array>): AsyncGenerator<Uint8Array> {
  let head = Buffer.alloc(0)
  let checked = false
  const check = () => {
    checked = true
    if (head[0] === 0x1f && head[1] === 0x8b) return
    if (head.subarray(USTAR_AT, USTAR_AT + 5).toString("latin1") === "ustar")
      throw new TarRefused("the input is a plain .tar; it must be gzip-compressed (.tar.gz)")
    throw new TarRefused("the input is not gzip-compressed; it must be a .tar.gz")
  }
  for await (const chunk of source) {
    if (checked) {
      yield chunk
      continue
    }
    head = Buffer.concat([head, chunk])
    if (head.length >= USTAR_AT + 5) {
      check()
      yield head
    }
  }
  if (!checked) {
    if (head.length === 0) throw new TarRefused("the input is empty; it must be a .tar.gz")
    check()
    yield head
  }
}

class GuestTarEnded extends Error {}

// tar reports a full disk as ENOSPC, or as a short write when a write got only part of the way.
const diskFull = (stderr: string) =>
  /No space left on device|Disk quota exceeded|Wrote only \d+ of \d+ bytes/i.test(stderr)

const lastLines = (text: string, n = 5) => text.trim().split("\n").slice(-n).join("\n")

// Streams `source` (opened plaintext) into the guest's tar; resolves with the guest tar's exit.
const stream = async (
  source: AsyncIterable<Uint8Array>,
  raw: RawChannel,
  filter: TarFilter,
  signal: AbortSignal,
): Promise<{ readonly exit: ChannelExit; readonly stderr: string }> => {
  const { channel: ch, exit } = raw
  let stderr = ""
  ch.stderr.on("data", (b: Buffer) => {
    if (stderr.length < 64 * 1024) stderr += b.toString("utf8")
  })
  ch.resume() // tar -x prints nothing on stdout
  let exited = false
  void exit.then(() => {
    exited = true
  })
  const plain = Readable.from(sniffed(source))
  const gunzip = createGunzip()
  plain.on("error", (e) => gunzip.destroy(e))
  plain.pipe(gunzip)
  const abort = () => {
    plain.destroy()
    ch.close()
  }
  signal.addEventListener("abort", abort)
  // Once the guest's tar has ended, or reported a full disk (it would read on to the end), stop.
  const over = () => exited || diskFull(stderr)
  const write = async (bytes: Uint8Array) => {
    if (over()) throw new GuestTarEnded()
    if (!ch.write(bytes)) await Promise.race([once(ch, "drain"), exit])
    if (over()) throw new GuestTarEnded()
  }
  try {
    for await (const chunk of gunzip as AsyncIterable<Buffer>) {
      for (const out of filter.push(chunk)) await write(out)
      if (filter.done) break
    }
    for (const out of filter.end()) await write(out)
    ch.end()
  } catch (e) {
    // End of input (not a close) so the guest's tar stops and exits before anything is cleaned up.
    ch.end()
    if (!(e instanceof GuestTarEnded)) {
      await exit
      throw e
    }
  } finally {
    signal.removeEventListener("abort", abort)
    plain.destroy()
    gunzip.destroy()
  }
  return { exit: await exit, stderr }
}

/**
 * Unpacks the sealed `.tar.gz` `input` into `/workspace/in`, refusing more than `diskBytes` of file
 * data; fails with `InputFailed` when the archive breaks a rule or does not fit.
 */
export const unpack = (
  guest: GuestSession,
  input: SealedObject,
  options: { readonly diskBytes: number },
): Effect.Effect<Unpacked, InputFailed | SourceError | GuestUnavailable, SealStream> =>
  Effect.gen(function* () {
    const seal = yield* SealStream
    const found = yield* input.store.get(input.name)
    if (Option.isNone(found))
      return yield* new InputFailed({ detail: `the input upload ${input.name} is missing` })
    // The source's own failure is kept aside: the async iterable only throws an opaque error.
    let sourceFailure: Cause.Cause<SourceError> | undefined
    const iterable = yield* found.value.data.pipe(
      seal.open(input.account, input.name),
      Stream.tapErrorCause((cause) =>
        Effect.sync(() => {
          sourceFailure = cause
        }),
      ),
      Stream.toAsyncIterableEffect,
    )
    const raw = yield* guest.channel(
      `mkdir -p ${INPUT_DIR} && tar -x --no-same-owner -C ${INPUT_DIR} -f -; rc=$?; [ $rc -eq 0 ] || rm -rf ${INPUT_DIR}; exit $rc`,
    )
    const filter = new TarFilter(options.diskBytes)
    const outcome = yield* Effect.tryPromise({
      try: (signal) => stream(iterable, raw, filter, signal),
      catch: (e) => e,
    }).pipe(
      Effect.catchAll((e): Effect.Effect<never, InputFailed | SourceError> => {
        if (sourceFailure !== undefined) return Effect.failCause(sourceFailure)
        if (e instanceof TarRefused) return Effect.fail(new InputFailed({ detail: e.message }))
        const code = (e as { code?: unknown }).code
        if (typeof code === "string" && code.startsWith("Z_"))
          return Effect.fail(
            new InputFailed({ detail: `the input is not a readable .tar.gz: gzip: ${(e as Error).message}` }),
          )
        return Effect.die(e)
      }),
    )
    if (outcome.exit.code !== 0) {
      return yield* new InputFailed({
        detail: diskFull(outcome.stderr)
          ? `the input unpacks to more than the /workspace disk holds (${options.diskBytes} bytes)`
          : `unpacking the input failed: ${lastLines(outcome.stderr) || `tar exited ${outcome.exit.code}`}`,
      })
    }
    return { entries: filter.entries, bytes: filter.bytes }
  }).pipe(
    Effect.tapErrorCause(() => collect(guest, `rm -rf ${INPUT_DIR}`).pipe(Effect.ignore)),
    Effect.withSpan("Inputs.unpack"),
  )

/** Checks `/workspace/in` against the input manifest; fails with `InputFailed` listing every problem. */
export const checkManifest = (
  guest: GuestSession,
  manifest: ReadonlyArray<Manifest.ManifestEntryLike>,
): Effect.Effect<void, InputFailed | GuestUnavailable> =>
  Effect.flatMap(Manifest.check(guest, INPUT_DIR, manifest), (problems) =>
    problems.length === 0
      ? Effect.void
      : Effect.fail(
          new InputFailed({
            detail: `the input does not match the input manifest: ${problems.map((p) => p.detail).join("; ")}`,
          }),
        ),
  )

/**
 * The `put` and `get` command kinds: a sealed upload streamed from the `files` object store into
 * the guest, and a guest file (or a folder as `.tar.gz`) streamed into the object store sealed, at
 * most 5 GiB. Neither holds more than a chunk in memory.
 *
 * `put` writes a hidden temporary file beside the target and renames it over the target only after
 * every byte arrived and the guest confirmed them, so a broken transfer never leaves a half file at
 * `path`. As with the file kinds, a problem with the path or the upload is the command's answer
 * (`{error}`); only infrastructure failures fail the effect.
 */
import { createHash } from "node:crypto"
import { once } from "node:events"
import { Data, Effect, Option, Stream } from "effect"
import type { KeyringError } from "../../core/Keyring.ts"
import type { NatsError } from "../../core/Nats.ts"
import type { ObjectCorrupt, ObjectInfo } from "../../core/ObjectStore.ts"
import { type DecryptFailed, SealStream } from "../../core/SealStream.ts"
import { chunksOf, collect, quote, stderrTail } from "./Channel.ts"
import { resolvePath } from "./Files.ts"
import { type GuestSession, GuestUnavailable } from "./GuestSession.ts"
import type { SealedObject } from "./Inputs.ts"

/** Largest file or folder archive a `get` returns: 5 GiB. */
export const GET_MAX_BYTES = 5 * 1024 ** 3

export interface PutArgs {
  /** The upload, `file_<id>`: its name in the `files` store and its seal's object id. */
  readonly file: string
  readonly path: string
}
export type PutResult = { readonly bytes: number } | { readonly error: string }

export interface GetArgs {
  readonly path: string
}
export type GetResult =
  | {
      /** The stored object (the gateway signs its download link). */
      readonly object: ObjectInfo
      /** `file`, or `folder` when the object is the folder as a `.tar.gz`. */
      readonly kind: "file" | "folder"
      /** Bytes of the file or archive, and their SHA-256 (lowercase hex). */
      readonly bytes: number
      readonly sha256: string
    }
  | { readonly error: string }

const tooLarge = (max: number) =>
  `is larger than ${max} bytes (${max === GET_MAX_BYTES ? "5 GiB, " : ""}the most a get returns)`

class TooLarge extends Data.TaggedError("TooLarge")<{}> {}

/** The most of the put script's stdout held while its first line, the temporary file's name, comes. */
const TEMP_NAME_MAX_BYTES = 8 * 1024

const guestError = (stderr: string) => stderr.trim().split("\n").slice(-3).join("\n")

/** Streams upload `file` (in `files`, sealed for `account`) to `path`, replacing it and making parent folders. */
export const put = (
  guest: GuestSession,
  files: Pick<SealedObject, "store" | "account">,
  args: PutArgs,
): Effect.Effect<
  PutResult,
  GuestUnavailable | NatsError | ObjectCorrupt | KeyringError | DecryptFailed,
  SealStream
> =>
  Effect.gen(function* () {
    const seal = yield* SealStream
    const path = resolvePath(args.path)
    const found = yield* files.store.get(args.file)
    if (Option.isNone(found)) return { error: `${args.file}: no such upload` }
    // Step 1: a temporary file beside the target; the guest prints its name, then takes the bytes.
    const { channel: ch, exit } = yield* guest.channel(`set -u
p=${quote(path)}; d=$(dirname -- "$p")
mkdir -p -- "$d" || exit 3
[ -d "$p" ] && { echo "$p: is a folder" >&2; exit 4; }
t=$(mktemp -- "$d/.$(basename -- "$p").put-XXXXXX") || exit 3
echo "$t"
cat > "$t" || { rm -f -- "$t"; exit 5; }
`)
    // Only its first line is read (a path: at most 4,095 bytes); no more of stdout is held.
    let stdout = ""
    ch.on("data", (b: Buffer) => {
      if (stdout.length < TEMP_NAME_MAX_BYTES) stdout += b.toString("utf8")
    })
    const stderr = stderrTail(ch)
    let exited = false
    void exit.then(() => {
      exited = true
    })
    // The temporary file's name comes first, so a failure from here on can always remove it.
    const temp = yield* Effect.promise(
      () =>
        new Promise<string>((ok) => {
          const look = () => {
            const nl = stdout.indexOf("\n")
            if (nl !== -1) ok(stdout.slice(0, nl))
            else if (stdout.length >= TEMP_NAME_MAX_BYTES) ok("")
          }
          ch.on("data", look)
          void exit.then(() => ok(""))
          look()
        }),
    )
    if (!temp) return { error: guestError(stderr()) || `${path}: could not be written` }
    let sent = 0
    const streamed = yield* found.value.data.pipe(
      seal.open(files.account, args.file),
      // Once the guest's side ended (say its disk is full) nothing more is read.
      Stream.takeWhile(() => !exited),
      Stream.runForEach((chunk) =>
        Effect.promise(async () => {
          sent += chunk.length
          if (!ch.write(chunk)) await Promise.race([once(ch, "drain"), exit])
        }),
      ),
      Effect.either,
    )
    if (streamed._tag === "Left") {
      // `cat` cannot tell a broken source from the end of the file: the partial file is removed here.
      ch.close()
      yield* Effect.promise(() => exit)
      yield* collect(guest, `rm -f -- ${quote(temp)}`).pipe(Effect.ignore)
      // An upload sealed for another account does not open at its first chunk: it is answered as
      // an unknown id is, so a run cannot learn which ids exist in other accounts.
      if (streamed.left._tag === "DecryptFailed" && sent === 0)
        return { error: `${args.file}: no such upload` }
      return yield* Effect.fail(streamed.left)
    }
    ch.end()
    const status = yield* Effect.promise(() => exit)
    if (status.code !== 0) {
      yield* collect(guest, `rm -f -- ${quote(temp)}`).pipe(Effect.ignore)
      return { error: guestError(stderr()) || `${path}: could not be written (exit ${status.code})` }
    }
    // Step 2: every byte is in; check the count, keep an existing file's mode, rename over the target.
    const done = yield* collect(
      guest,
      `set -u
t=${quote(temp)}; p=${quote(path)}
n=$(stat -c %s -- "$t") || exit 1
[ "$n" = ${sent} ] || { rm -f -- "$t"; echo "$p: $n of ${sent} bytes arrived" >&2; exit 1; }
if [ -f "$p" ]; then chmod --reference="$p" -- "$t"; else chmod 644 -- "$t"; fi
mv -fT -- "$t" "$p" || { rm -f -- "$t"; exit 1; }
`,
    )
    if (done.code !== 0) return { error: guestError(done.stderr) || `${path}: could not be replaced` }
    return { bytes: sent }
  }).pipe(Effect.withSpan("Transfer.put"))

/**
 * Streams the file at `path`, or the folder as a `.tar.gz` (fastest level), into `target` sealed;
 * `{error}` when it is missing, neither a file nor a folder, or larger than `maxBytes` (5 GiB).
 */
export const get = (
  guest: GuestSession,
  target: SealedObject,
  args: GetArgs,
  maxBytes: number = GET_MAX_BYTES,
): Effect.Effect<GetResult, GuestUnavailable | NatsError | KeyringError, SealStream> =>
  Effect.gen(function* () {
    const seal = yield* SealStream
    const path = resolvePath(args.path)
    const probe = yield* collect(
      guest,
      `p=${quote(path)}; if [ -d "$p" ]; then echo d; elif [ -f "$p" ]; then stat -c 'f %s' -- "$p"; elif [ -e "$p" ]; then echo o; else echo n; fi`,
    )
    const [kindCode, sizeText] = probe.stdout.toString("utf8").trim().split(" ")
    if (kindCode === "n") return { error: `${path}: no such file or folder` }
    if (kindCode === "o") return { error: `${path}: not a regular file or folder` }
    if (kindCode !== "d" && kindCode !== "f")
      return yield* new GuestUnavailable({ detail: `get probe failed: ${probe.stderr.slice(-500)}` })
    const kind: "file" | "folder" = kindCode === "d" ? "folder" : "file"
    if (kind === "file" && Number(sizeText) > maxBytes) return { error: `${path} ${tooLarge(maxBytes)}` }
    const { channel: ch, exit } = yield* guest.channel(
      kind === "folder"
        ? `set -o pipefail; tar -C ${quote(path)} -cf - . | gzip -1`
        : `exec cat -- ${quote(path)}`,
    )
    const stderr = stderrTail(ch)
    ch.end()
    const hash = createHash("sha256")
    let bytes = 0
    const checked = Stream.fromEffect(
      Effect.promise(() => exit).pipe(
        Effect.flatMap((x) =>
          x.code === 0
            ? Effect.void
            : Effect.fail(
                new GuestUnavailable({
                  detail: `get ${path} exited ${x.code}${x.signal ? ` (${x.signal})` : ""}: ${guestError(stderr())}`,
                }),
              ),
        ),
      ),
    ).pipe(Stream.drain)
    const data = chunksOf(ch, (e) => new GuestUnavailable({ detail: `reading ${path}: ${String(e)}` })).pipe(
      Stream.mapEffect((c) => {
        bytes += c.length
        if (bytes > maxBytes) return Effect.fail(new TooLarge())
        hash.update(c)
        return Effect.succeed(c)
      }),
      Stream.concat(checked),
      seal.seal(target.account, target.name),
    )
    const stored = yield* target.store.put(target.name, data).pipe(
      Effect.onExit(() => Effect.sync(() => ch.close())),
      Effect.either,
    )
    if (stored._tag === "Left") {
      if (stored.left instanceof TooLarge) return { error: `${path} ${tooLarge(maxBytes)}` }
      return yield* Effect.fail(stored.left)
    }
    return { object: stored.right, kind, bytes, sha256: hash.digest("hex") }
  }).pipe(Effect.withSpan("Transfer.get"))

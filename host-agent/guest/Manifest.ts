/**
 * Checks a folder of the guest against a manifest (`[{path, max_bytes}]`): only existence and size,
 * never content. A path ending in `/` names a folder, which must exist and whose size is the sum of
 * the regular files anywhere inside it; any other path names a regular file.
 */
import { Effect } from "effect"
import { collect, quote } from "./Channel.ts"
import { type GuestSession, GuestUnavailable } from "./GuestSession.ts"

/** One manifest entry as the check needs it. */
export interface ManifestEntryLike {
  readonly path: string
  readonly max_bytes: number
}

/** One way the folder does not match an entry; `detail` is a sentence naming the path. */
export interface ManifestProblem {
  readonly path: string
  readonly detail: string
}

// Reads NUL-separated relative paths on stdin and answers one line per path: `n` (nothing there),
// `l` (a link), `o` (neither file nor folder), `f <size>` or `d <sum of the files inside>`.
const script = (root: string) => `set -u
root=${quote(root)}
while IFS= read -r -d '' p; do
  f="$root/\${p%/}"
  if [ -L "$f" ]; then echo l
  elif [ -d "$f" ]; then
    s=0; while IFS= read -r n; do s=$((s + n)); done < <(find "$f" -type f -printf '%s\\n')
    echo "d $s"
  elif [ -f "$f" ]; then echo "f $(stat -c %s -- "$f")"
  elif [ -e "$f" ]; then echo o
  else echo n; fi
done
`

/**
 * What is wrong with `entry` given what is at its path: `n` (nothing), `l` (a link), `o` (neither
 * file nor folder), `f <size>`, `d <sum of the files inside>`; undefined when it matches.
 */
const problemOf = (entry: ManifestEntryLike, answer: string): string | undefined => {
  const folder = entry.path.endsWith("/")
  const [kind, sizeText] = answer.split(" ")
  const size = Number(sizeText)
  if (kind === "n") return folder ? "folder missing" : "missing"
  if (kind === "l") return `is a link, not a ${folder ? "folder" : "file"}`
  if (kind === "o") return `is not a regular ${folder ? "folder" : "file"}`
  if (folder && kind === "f") return "is a file, not a folder"
  if (!folder && kind === "d") return "is a folder, not a file"
  if (size > entry.max_bytes)
    return folder
      ? `holds ${size} bytes, more than its max_bytes ${entry.max_bytes}`
      : `is ${size} bytes, more than its max_bytes ${entry.max_bytes}`
  return undefined
}

/** Fails unless every path of `manifest` stays in its folder (the schema refuses others already). */
export const relative = (
  manifest: ReadonlyArray<ManifestEntryLike>,
): Effect.Effect<void, GuestUnavailable> => {
  for (const e of manifest) {
    // A path leaving the folder must never be looked at.
    const parts = e.path.split("/")
    if (e.path.startsWith("/") || e.path.includes("\0") || parts.includes(".."))
      return new GuestUnavailable({ detail: `manifest path ${JSON.stringify(e.path)} is not relative` })
  }
  return Effect.void
}

/** The problems of folder `root` against `manifest`, in manifest order; empty when it matches. */
export const check = (
  guest: GuestSession,
  root: string,
  manifest: ReadonlyArray<ManifestEntryLike>,
): Effect.Effect<ReadonlyArray<ManifestProblem>, GuestUnavailable> =>
  Effect.gen(function* () {
    if (manifest.length === 0) return []
    yield* relative(manifest)
    const input = Buffer.from(manifest.map((e) => `${e.path}\0`).join(""), "utf8")
    const r = yield* collect(guest, script(root), input)
    const answers = r.stdout.toString("utf8").split("\n")
    if (r.code !== 0 || answers.length < manifest.length)
      return yield* new GuestUnavailable({
        detail: `manifest check exited ${r.code}: ${r.stderr.slice(-500)}`,
      })
    return problemsOf(manifest, (_, i) => answers[i] ?? "n")
  })

/** The problems of `manifest` given each entry's answer (`problemOf`), in manifest order. */
export const problemsOf = (
  manifest: ReadonlyArray<ManifestEntryLike>,
  answerOf: (entry: ManifestEntryLike, index: number) => string,
): ReadonlyArray<ManifestProblem> => {
  const problems: Array<ManifestProblem> = []
  for (const [i, entry] of manifest.entries()) {
    const detail = problemOf(entry, answerOf(entry, i))
    if (detail) problems.push({ path: entry.path, detail: `${entry.path}: ${detail}` })
  }
  return problems
}

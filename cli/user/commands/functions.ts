/** `bases`, `functions` and `publish FILE`. */
import { readFileSync } from "node:fs"
import { extname } from "node:path"
import { parse as parseYaml } from "yaml"
import type { Command } from "../Command.ts"
import { UsageError } from "../Failures.ts"
import * as Print from "../Print.ts"
import { listFunctions, named } from "../Resolve.ts"

interface Base {
  readonly name: string
  readonly sha256: string
  readonly bytes: number
}

export const bases: Command = {
  positionals: [0, 0],
  run: async ({ api, out }) => {
    const answer = await api.call<{ bases: Array<Base> }>("GET", "/v1/bases")
    if (out.json) return Print.json(answer)
    Print.table(
      out,
      ["NAME", "SIZE", "SHA256"],
      answer.bases.map((b) => [b.name, Print.bytes(b.bytes), b.sha256.slice(0, 12)]),
      "no bases",
    )
  },
}

export const functions: Command = {
  positionals: [0, 0],
  run: async ({ api, out }) => {
    if (out.json) return Print.json(await api.call("GET", "/v1/functions"))
    const all = await listFunctions(api)
    Print.table(
      out,
      ["ID", "NAME", "VERSION", "UPDATED", "LAST RUN"],
      all.map((f) => [
        f.id,
        f.name,
        String(f.latest),
        Print.when(f.updated_at),
        f.last ? `${f.last.id} ${Print.state(out, f.last.state)}` : "-",
      ]),
      "no functions yet: publish one with `hangar publish FILE`",
    )
  },
}

/** A definition file: JSON, or YAML (`.yaml`/`.yml`, or anything that is not JSON). */
const readDefinition = (file: string): Record<string, unknown> => {
  let text: string
  try {
    text = readFileSync(file, "utf8")
  } catch (e) {
    throw new UsageError(`cannot read ${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`)
  }
  const ext = extname(file).toLowerCase()
  let parsed: unknown
  try {
    if (ext === ".json") parsed = JSON.parse(text)
    else {
      // YAML is a superset of JSON: one parser reads both when the extension says neither.
      parsed = parseYaml(text, { prettyErrors: true, uniqueKeys: true })
    }
  } catch (e) {
    throw new UsageError(
      `${file} is not valid ${ext === ".json" ? "JSON" : "YAML or JSON"}: ${(e as Error).message}`,
    )
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed))
    throw new UsageError(`${file}: a definition is an object with name, system_prompt, output_manifest, …`)
  return parsed as Record<string, unknown>
}

export const publish: Command = {
  positionals: [1, 1],
  run: async ({ api, out, positionals }) => {
    const file = positionals[0] as string
    const definition = readDefinition(file)
    const { name, ...rest } = definition
    if (typeof name !== "string" || name === "")
      throw new UsageError(`${file}: name is required (the function's name)`)
    const same = named(await listFunctions(api), name)
    if (same.length > 1)
      throw new UsageError(
        `${same.length} functions are named ${name}; publishing cannot tell which gets the version: ${same.map((f) => f.id).join(", ")}`,
      )
    const existing = same[0]
    const version = await api.call<{ function: string; version: number; base?: string; provider?: string }>(
      "POST",
      existing ? `/v1/functions/${existing.id}/versions` : "/v1/functions",
      existing ? rest : definition,
    )
    if (out.json) return Print.json(version)
    Print.line(
      `${existing ? "published" : "created"} ${Print.bold(out, name)} ${version.function} version ${version.version}`,
    )
  },
}

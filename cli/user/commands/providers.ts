/** `providers`, `models VENDOR` and `provider NAME …`; vendor keys come on stdin. */
import { type Command, text } from "../Command.ts"
import { UsageError } from "../Failures.ts"
import * as Print from "../Print.ts"
import { readKey } from "../Secret.ts"

interface Provider {
  readonly id: string
  readonly name: string
  readonly version: number
  readonly model: {
    readonly provider: string
    readonly model: string
    readonly reasoning_effort?: string
    readonly compact_at_tokens: number
    readonly max_output_tokens: number
  }
  readonly created_at?: string
}
interface ProviderItem {
  readonly id: string
  readonly name: string
  readonly latest: number
  readonly versions: ReadonlyArray<Provider>
}

const VENDORS = ["openai", "anthropic", "google"]

const vendor = (value: string | undefined, flag: string) => {
  if (value === undefined) throw new UsageError(`${flag} is required (${VENDORS.join(", ")})`)
  if (!VENDORS.includes(value)) throw new UsageError(`${flag} must be one of ${VENDORS.join(", ")}: ${value}`)
  return value
}

const count = (flag: string, value: string | undefined, fallback: number): number => {
  if (value === undefined) return fallback
  if (!/^\d+$/.test(value)) throw new UsageError(`--${flag} must be a whole number: ${value}`)
  return Number(value)
}

export const providers: Command = {
  positionals: [0, 0],
  run: async ({ api, out }) => {
    const answer = await api.call<{ providers: Array<ProviderItem> }>("GET", "/v1/providers")
    if (out.json) return Print.json(answer)
    Print.table(
      out,
      ["ID", "NAME", "VERSION", "VENDOR", "MODEL", "EFFORT", "COMPACT AT"],
      answer.providers.map((p) => {
        const latest = p.versions.find((v) => v.version === p.latest) ?? p.versions[0]
        return [
          p.id,
          p.name,
          String(p.latest),
          latest?.model.provider ?? "-",
          latest?.model.model ?? "-",
          latest?.model.reasoning_effort || "-",
          String(latest?.model.compact_at_tokens ?? "-"),
        ]
      }),
      "no providers yet: add one with `hangar provider NAME --vendor V --model M < key.txt`",
    )
  },
}

export const models: Command = {
  positionals: [1, 1],
  run: async ({ api, out, positionals }) => {
    const v = vendor(positionals[0], "VENDOR")
    const key = await readKey(`${v} key`)
    const answer = await api.call<{
      models: Array<{
        id: string
        name: string
        context_window: number
        max_output_tokens: number
        efforts: Array<string>
        default_effort: string
      }>
    }>("POST", "/v1/catalog", { provider: v, key })
    if (out.json) return Print.json(answer)
    Print.table(
      out,
      ["MODEL", "NAME", "CONTEXT", "MAX OUTPUT", "EFFORTS"],
      answer.models.map((m) => [
        m.id,
        m.name,
        String(m.context_window),
        String(m.max_output_tokens),
        m.efforts.map((e) => (e === m.default_effort ? `${e}*` : e)).join(",") || "-",
      ]),
      "the vendor lists no models for this key",
    )
  },
}

export const provider: Command = {
  options: {
    vendor: { type: "string" },
    model: { type: "string" },
    effort: { type: "string" },
    compact: { type: "string" },
    "max-output": { type: "string" },
    ref: { type: "string" },
  },
  positionals: [1, 1],
  run: async ({ api, out, values, positionals }) => {
    const name = positionals[0] as string
    const model = text(values, "model")
    if (model === undefined) throw new UsageError("--model is required")
    const body = {
      model: {
        provider: vendor(text(values, "vendor"), "--vendor"),
        model,
        reasoning_effort: text(values, "effort") ?? "",
        compact_at_tokens: count("compact", text(values, "compact"), 200_000),
        max_output_tokens: count("max-output", text(values, "max-output"), 0),
      },
      ...(text(values, "ref") !== undefined ? { external_reference: text(values, "ref") } : {}),
    }
    const all = (await api.call<{ providers: Array<ProviderItem> }>("GET", "/v1/providers")).providers
    const same = all.filter((p) => p.name === name)
    if (same.length > 1)
      throw new UsageError(`${same.length} providers are named ${name}: ${same.map((p) => p.id).join(", ")}`)
    const key = await readKey(`${body.model.provider} key`)
    const existing = same[0]
    const made = await api.call<Provider>(
      "POST",
      existing ? `/v1/providers/${existing.id}/versions` : "/v1/providers",
      existing ? { ...body, key } : { name, ...body, key },
    )
    if (out.json) return Print.json(made)
    Print.line(
      `${existing ? "published" : "created"} ${Print.bold(out, made.name)} ${made.id} version ${made.version}`,
    )
  },
}

/** The account's providers and their versions (the vendor key is never shown back). */
import { useEffect, useState } from "preact/hooks"
import { api, describe, type Json } from "../api.ts"
import { Page, Problem } from "../components.tsx"
import { when } from "../format.ts"

export const ProvidersPage = () => {
  const [providers, setProviders] = useState<ReadonlyArray<Json> | undefined>(undefined)
  const [problem, setProblem] = useState<string | undefined>(undefined)
  useEffect(() => {
    api("GET", "/v1/providers")
      .then((a) => setProviders(a.providers ?? []))
      .catch((e) => setProblem(describe(e)))
  }, [])
  return (
    <Page title="Providers">
      <Problem text={problem} />
      <p class="hint">
        A provider holds a model choice and your vendor key; the key is kept encrypted and never shown again.
        Add one with <code>hangar provider NAME --vendor V --model M &lt; key.txt</code>.
      </p>
      {providers === undefined ? null : providers.length === 0 ? (
        <p class="empty">No providers yet.</p>
      ) : (
        providers.map((p) => (
          <div class="card" key={p.id}>
            <h2>
              {p.name} <span class="dim mono">{p.id}</span> <span class="dim">latest v{p.latest}</span>
            </h2>
            <ul class="plain">
              {(p.versions as Array<Json>).map((v) => (
                <li key={v.version}>
                  v{v.version}: {v.model.provider} {v.model.model}
                  {v.model.reasoning_effort ? ` (${v.model.reasoning_effort})` : ""}, compacts at{" "}
                  {v.model.compact_at_tokens} tokens · {when(v.created_at)} by {v.created_by}
                </li>
              ))}
            </ul>
          </div>
        ))
      )}
    </Page>
  )
}

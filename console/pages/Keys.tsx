/** The account's keys (owners): create one (its token shown once), revoke one. */
import { useEffect, useState } from "preact/hooks"
import { api, describe, type Json } from "../api.ts"
import { Page, Problem } from "../components.tsx"
import { when } from "../format.ts"

export const KeysPage = () => {
  const [keys, setKeys] = useState<ReadonlyArray<Json> | undefined>(undefined)
  const [problem, setProblem] = useState<string | undefined>(undefined)
  const [made, setMade] = useState<{ name: string; token: string } | undefined>(undefined)
  const [name, setName] = useState("")
  const [scope, setScope] = useState("admin")

  const load = () =>
    api("GET", "/v1/keys")
      .then((a) => setKeys(a.keys ?? []))
      .catch((e) => setProblem(describe(e)))
  useEffect(() => {
    void load()
  }, [])

  const create = async (e: Event) => {
    e.preventDefault()
    try {
      const answer = await api("POST", "/v1/keys", { name: name.trim(), scope, functions: ["*"] })
      setMade({ name: answer.key.name, token: answer.token })
      setName("")
      setProblem(undefined)
      await load()
    } catch (err) {
      setProblem(describe(err))
    }
  }
  const revoke = async (key: Json) => {
    if (!confirm(`Revoke the key ${key.name}? Anything using it stops at once.`)) return
    try {
      await api("DELETE", `/v1/keys/${encodeURIComponent(key.id)}`)
      await load()
    } catch (err) {
      setProblem(describe(err))
    }
  }

  return (
    <Page title="Keys">
      <Problem text={problem} />
      {made !== undefined ? (
        <div class="card token" role="status">
          <p>
            The token of <strong>{made.name}</strong>. It is shown this once: copy it now.
          </p>
          <input
            class="mono"
            readOnly
            value={made.token}
            id="new-token"
            onFocus={(e) => (e.currentTarget as HTMLInputElement).select()}
          />
          <button type="button" onClick={() => setMade(undefined)}>
            Done
          </button>
        </div>
      ) : null}
      <form class="inline-form" onSubmit={create}>
        <label>
          Name
          <input
            id="key-name"
            required
            maxLength={100}
            value={name}
            onInput={(e) => setName((e.currentTarget as HTMLInputElement).value)}
          />
        </label>
        <label>
          Scope
          <select value={scope} onChange={(e) => setScope((e.currentTarget as HTMLSelectElement).value)}>
            <option value="admin">admin</option>
            <option value="run">run (every function)</option>
          </select>
        </label>
        <button type="submit" class="primary" id="create-key">
          Create key
        </button>
      </form>
      {keys === undefined ? (
        <p class="loading">Loading…</p>
      ) : (
        <div class="table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Scope</th>
                <th scope="col">Created</th>
                <th scope="col">Revoked</th>
                <th scope="col">
                  <span class="sr">Actions</span>
                </th>
              </tr>
            </thead>
            <tbody>
              {keys.map((k) => (
                <tr key={k.id} data-key={k.name}>
                  <td>
                    {k.name} <span class="dim mono">{k.id}</span>
                  </td>
                  <td>
                    {k.scope}
                    {k.scope === "run" ? <span class="dim"> {k.functions.join(", ")}</span> : null}
                  </td>
                  <td>
                    {when(k.created_at)} <span class="dim">{k.created_by}</span>
                  </td>
                  <td>{k.revoked_at === undefined ? "—" : when(k.revoked_at)}</td>
                  <td>
                    {k.revoked_at === undefined ? (
                      <button type="button" class="danger" onClick={() => revoke(k)}>
                        Revoke
                      </button>
                    ) : null}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </Page>
  )
}

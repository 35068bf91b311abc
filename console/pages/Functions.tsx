/** The account's functions, and one function's versions with their definitions. */
import { useEffect, useState } from "preact/hooks"
import { api, describe, type Json } from "../api.ts"
import { Link, Page, Problem, State } from "../components.tsx"
import { when } from "../format.ts"

export const FunctionsPage = () => {
  const [functions, setFunctions] = useState<ReadonlyArray<Json> | undefined>(undefined)
  const [problem, setProblem] = useState<string | undefined>(undefined)
  useEffect(() => {
    api("GET", "/v1/functions")
      .then((a) => setFunctions(a.functions ?? []))
      .catch((e) => setProblem(describe(e)))
  }, [])
  return (
    <Page title="Functions">
      <Problem text={problem} />
      {functions === undefined ? null : functions.length === 0 ? (
        <p class="empty">
          No functions yet. Publish one with <code>hangar publish FILE</code>.
        </p>
      ) : (
        <div class="table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Latest</th>
                <th scope="col">Updated</th>
                <th scope="col">Last run</th>
              </tr>
            </thead>
            <tbody>
              {functions.map((f) => (
                <tr key={f.id}>
                  <td>
                    <Link href={`/functions/${f.id}`}>{f.name}</Link> <span class="dim mono">{f.id}</span>
                  </td>
                  <td>v{f.latest}</td>
                  <td>{when(f.updated_at)}</td>
                  <td>
                    {f.last === undefined ? (
                      "—"
                    ) : (
                      <Link href={`/runs/${f.last.id}`}>
                        <State state={f.last.state} />
                      </Link>
                    )}
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

export const FunctionPage = (props: { readonly id: string }) => {
  const [fn, setFn] = useState<Json | undefined>(undefined)
  const [problem, setProblem] = useState<string | undefined>(undefined)
  useEffect(() => {
    api("GET", `/v1/functions/${encodeURIComponent(props.id)}`)
      .then(setFn)
      .catch((e) => setProblem(describe(e)))
  }, [props.id])
  if (fn === undefined)
    return <Page title="Function">{problem !== undefined ? <Problem text={problem} /> : null}</Page>
  const versions = [...(fn.versions as Array<Json>)].reverse()
  return (
    <Page title={fn.function.name}>
      <p>
        <Link href={`/runs?function=${fn.function.id}`}>Its runs</Link>
      </p>
      {versions.map((v) => {
        const { function: _f, version, created_at, created_by, external_reference: _r, ...definition } = v
        return (
          <details class="card" key={version} open={version === fn.function.latest}>
            <summary>
              Version {version}{" "}
              <span class="dim">
                {when(created_at)} by {created_by}
              </span>
            </summary>
            <pre class="output">{JSON.stringify(definition, null, 2)}</pre>
          </details>
        )
      })}
    </Page>
  )
}

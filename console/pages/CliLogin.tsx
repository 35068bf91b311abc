/**
 * The page a `hangar login` URL opens: the machine's name and the code, to compare with what the
 * CLI shows, and the account the key will belong to. An owner approves (`POST
 * /v1/cli-logins/{id}/approve` with the code) or refuses; refusing approves nothing, so the login
 * expires unused after its 10 minutes and the CLI gives up (the API has no refusal to record).
 */
import { useEffect, useState } from "preact/hooks"
import { api, describe, type Json } from "../api.ts"
import { Page, Problem, State } from "../components.tsx"
import { useWho } from "../session.ts"

export const CliLoginPage = (props: { readonly id: string; readonly code: string }) => {
  const who = useWho()
  const [login, setLogin] = useState<Json | undefined>(undefined)
  const [problem, setProblem] = useState<string | undefined>(undefined)
  const [refused, setRefused] = useState(false)
  const [busy, setBusy] = useState(false)

  useEffect(() => {
    api("GET", `/v1/cli-logins/${encodeURIComponent(props.id)}`, undefined, { noAccount: true })
      .then(setLogin)
      .catch((e) => setProblem(describe(e)))
  }, [props.id])

  const approve = async () => {
    setBusy(true)
    try {
      setLogin(
        await api("POST", `/v1/cli-logins/${encodeURIComponent(props.id)}/approve`, { code: props.code }),
      )
      setProblem(undefined)
    } catch (e) {
      setProblem(describe(e))
    } finally {
      setBusy(false)
    }
  }
  const accountName = who.accounts.find((a) => a.account === who.account)?.name ?? who.account
  const expires = login === undefined ? "" : new Date(login.expires_at * 1000).toLocaleTimeString()

  return (
    <Page title="Approve a CLI login">
      <Problem text={problem} />
      {login === undefined ? (
        problem === undefined ? (
          <p class="loading">Loading…</p>
        ) : null
      ) : (
        <div class="card cli-login">
          <dl class="facts">
            <dt>Machine</dt>
            <dd class="machine" id="login-machine">
              {login.name}
            </dd>
            <dt>Code</dt>
            <dd class="code" id="login-code">
              {props.code === "" ? "—" : props.code}
            </dd>
            <dt>State</dt>
            <dd>
              <State state={refused && login.state === "pending" ? "refused" : login.state} />
            </dd>
            <dt>Account</dt>
            <dd>{accountName}</dd>
          </dl>
          {login.state === "pending" && !refused ? (
            who.role === "owner" ? (
              <>
                <p>
                  Check that the CLI on <strong>{login.name}</strong> shows the same code. Approving gives
                  that machine an admin key of <strong>{accountName}</strong>. This request expires at{" "}
                  {expires}.
                </p>
                <div class="actions">
                  <button
                    type="button"
                    class="primary"
                    id="approve"
                    disabled={busy || props.code === ""}
                    onClick={approve}
                  >
                    Approve
                  </button>
                  <button type="button" id="refuse" disabled={busy} onClick={() => setRefused(true)}>
                    Refuse
                  </button>
                </div>
              </>
            ) : (
              <p>
                Only an owner of {accountName} can approve a CLI login. Ask an owner, or pick another account
                above.
              </p>
            )
          ) : null}
          {refused && login.state === "pending" ? (
            <p>Refused: nothing was approved. The login expires unused at {expires}.</p>
          ) : null}
          {login.state === "approved" ? (
            <p id="approved">
              Approved: the CLI now holds the key <span class="mono">{login.key}</span>.
            </p>
          ) : null}
          {login.state === "expired" ? (
            <p>
              This login has expired. Run <code>hangar login</code> again.
            </p>
          ) : null}
        </div>
      )}
    </Page>
  )
}

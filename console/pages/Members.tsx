/**
 * The account's members, and for owners its invites: invite by e-mail, cancel an invite, remove a
 * member. A member sees the list only; the API refuses them the rest anyway (`owners_only`).
 */
import { useEffect, useState } from "preact/hooks"
import { api, describe, type Json } from "../api.ts"
import { Page, Problem } from "../components.tsx"
import { when } from "../format.ts"
import { useWho } from "../session.ts"

export const MembersPage = () => {
  const who = useWho()
  const owner = who.role === "owner"
  const [members, setMembers] = useState<ReadonlyArray<Json> | undefined>(undefined)
  const [invites, setInvites] = useState<ReadonlyArray<Json>>([])
  const [problem, setProblem] = useState<string | undefined>(undefined)
  const [email, setEmail] = useState("")
  const [role, setRole] = useState("member")

  const load = async () => {
    try {
      setMembers((await api("GET", "/v1/members")).members ?? [])
      if (owner) setInvites((await api("GET", "/v1/invites")).invites ?? [])
    } catch (e) {
      setProblem(describe(e))
    }
  }
  useEffect(() => {
    void load()
  }, [])
  const act = async (fx: () => Promise<unknown>) => {
    try {
      await fx()
      setProblem(undefined)
      await load()
    } catch (e) {
      setProblem(describe(e))
    }
  }

  return (
    <Page title="Members">
      <Problem text={problem} />
      {members === undefined ? (
        <p class="loading">Loading…</p>
      ) : (
        <div class="table-wrap">
          <table>
            <thead>
              <tr>
                <th scope="col">E-mail</th>
                <th scope="col">Role</th>
                <th scope="col">Joined</th>
                {owner ? (
                  <th scope="col">
                    <span class="sr">Actions</span>
                  </th>
                ) : null}
              </tr>
            </thead>
            <tbody>
              {members.map((m) => (
                <tr key={m.user}>
                  <td>{m.email}</td>
                  <td>{m.role}</td>
                  <td>{when(m.joined_at)}</td>
                  {owner ? (
                    <td>
                      {m.email !== who.email ? (
                        <button
                          type="button"
                          class="danger"
                          onClick={() =>
                            confirm(`Remove ${m.email} from the account?`) &&
                            act(() => api("DELETE", `/v1/members/${encodeURIComponent(m.user)}`))
                          }
                        >
                          Remove
                        </button>
                      ) : null}
                    </td>
                  ) : null}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      {owner ? (
        <>
          <h2>Invites</h2>
          <form
            class="inline-form"
            onSubmit={(e) => {
              e.preventDefault()
              void act(() => api("POST", "/v1/invites", { email: email.trim(), role })).then(() =>
                setEmail(""),
              )
            }}
          >
            <label>
              E-mail
              <input
                type="email"
                required
                value={email}
                onInput={(e) => setEmail((e.currentTarget as HTMLInputElement).value)}
              />
            </label>
            <label>
              Role
              <select value={role} onChange={(e) => setRole((e.currentTarget as HTMLSelectElement).value)}>
                <option value="member">member</option>
                <option value="owner">owner</option>
              </select>
            </label>
            <button type="submit" class="primary">
              Invite
            </button>
          </form>
          {invites.length === 0 ? (
            <p class="empty">No invites waiting.</p>
          ) : (
            <ul class="plain">
              {invites.map((i) => (
                <li key={i.email}>
                  {i.email} ({i.role}), until {new Date(i.expires_at * 1000).toLocaleDateString()}{" "}
                  <button
                    type="button"
                    class="link"
                    onClick={() => act(() => api("DELETE", `/v1/invites/${encodeURIComponent(i.email)}`))}
                  >
                    Cancel
                  </button>
                </li>
              ))}
            </ul>
          )}
        </>
      ) : null}
    </Page>
  )
}

/**
 * The web console (issue 26): a Preact app over the public API. The server answers the same page
 * on every console path; this draws the one the address names, once it knows who is signed in
 * (`GET /console/session`) and in which accounts (`GET /v1/me`).
 */
import "./style.css"
// xterm's styles are small and go with the app's; its script is a chunk of its own (below).
import "@xterm/xterm/css/xterm.css"
import { render } from "preact"
import { useCallback, useEffect, useState } from "preact/hooks"
import { api, configure, describe, type Json } from "./api.ts"
import { Link, Problem } from "./components.tsx"
import { CliLoginPage } from "./pages/CliLogin.tsx"
import { FunctionPage, FunctionsPage } from "./pages/Functions.tsx"
import { KeysPage } from "./pages/Keys.tsx"
import { MembersPage } from "./pages/Members.tsx"
import { ProvidersPage } from "./pages/Providers.tsx"
import { RunPage } from "./pages/Run.tsx"
import { RunsPage } from "./pages/Runs.tsx"
import { SignInPage } from "./pages/SignIn.tsx"
import { UsagePage } from "./pages/Usage.tsx"
import { match, navigate, useLocation } from "./router.ts"
import { type Who, WhoContext } from "./session.ts"

const ACCOUNT_KEY = "hangar.account"

type Signed =
  | { readonly _tag: "Loading" }
  | { readonly _tag: "Out" }
  | { readonly _tag: "Failed"; readonly message: string }
  | { readonly _tag: "In"; readonly email: string; readonly me: Json }

const nav = [
  { href: "/runs", label: "Runs", owner: false },
  { href: "/functions", label: "Functions", owner: false },
  { href: "/providers", label: "Providers", owner: false },
  { href: "/keys", label: "Keys", owner: true },
  { href: "/members", label: "Members", owner: false },
  { href: "/usage", label: "Usage", owner: false },
]

const Body = (props: { readonly path: string; readonly query: URLSearchParams; readonly who: Who }) => {
  const { path, query, who } = props
  if (who.accounts.length === 0 && match("/cli-logins/:id", path) === undefined)
    return (
      <p class="empty">
        {who.email} is not a member of any account yet. Ask an owner to invite this address.
      </p>
    )
  if (path === "/" || path === "/runs") return <RunsPage query={query} />
  const terminal = match("/runs/:id/terminal", path)
  if (terminal) return <LazyTerminal id={terminal.id!} />
  const run = match("/runs/:id", path)
  if (run) return <RunPage id={run.id!} />
  const login = match("/cli-logins/:id", path)
  if (login) return <CliLoginPage id={login.id!} code={query.get("code") ?? ""} />
  if (path === "/keys") return <KeysPage />
  if (path === "/members") return <MembersPage />
  if (path === "/functions") return <FunctionsPage />
  const fn = match("/functions/:id", path)
  if (fn) return <FunctionPage id={fn.id!} />
  if (path === "/providers") return <ProvidersPage />
  if (path === "/usage" || path === "/credit")
    return <UsagePage checkout={query.get("checkout") ?? undefined} />
  return <p class="empty">No such page.</p>
}

/** The terminal page, its script (xterm.js) loaded only when a terminal is opened. */
const LazyTerminal = (props: { readonly id: string }) => {
  const [page, setPage] = useState<typeof import("./pages/Terminal.tsx") | undefined>(undefined)
  const [problem, setProblem] = useState<string | undefined>(undefined)
  useEffect(() => {
    import("./pages/Terminal.tsx").then(setPage, (e) => setProblem(describe(e)))
  }, [])
  if (problem !== undefined) return <Problem text={problem} />
  return page === undefined ? <p class="loading">Loading…</p> : <page.TerminalPage id={props.id} />
}

const App = () => {
  const { path, query } = useLocation()
  const [signed, setSigned] = useState<Signed>({ _tag: "Loading" })
  const [account, setAccount] = useState("")

  const load = useCallback(async () => {
    configure({ onSignedOut: () => setSigned({ _tag: "Out" }) })
    try {
      const res = await fetch("/console/session", { credentials: "same-origin" })
      if (res.status === 401) return setSigned({ _tag: "Out" })
      if (!res.ok)
        return setSigned({ _tag: "Failed", message: `the session could not be read (${res.status})` })
      const session = (await res.json()) as { email: string; csrf: string }
      configure({ csrf: session.csrf })
      const me = await api("GET", "/v1/me", undefined, { noAccount: true })
      const accounts: Array<{ account: string }> = me.accounts ?? []
      const kept = localStorage.getItem(ACCOUNT_KEY)
      const chosen = accounts.find((a) => a.account === kept)?.account ?? accounts[0]?.account ?? ""
      configure({ account: chosen })
      setAccount(chosen)
      setSigned({ _tag: "In", email: session.email, me })
    } catch (e) {
      setSigned({ _tag: "Failed", message: describe(e) })
    }
  }, [])
  useEffect(() => {
    void load()
  }, [load])

  if (path === "/sign-in" || signed._tag === "Out")
    return <SignInPage problem={query.get("problem") ?? undefined} />
  if (signed._tag === "Loading") return <p class="loading">Loading…</p>
  if (signed._tag === "Failed") return <Problem text={signed.message} />

  const accounts = (signed.me.accounts ?? []) as Who["accounts"]
  const role = (accounts.find((a) => a.account === account)?.role ?? "") as Who["role"]
  const who: Who = { email: signed.email, account, role, accounts }
  const choose = (id: string) => {
    localStorage.setItem(ACCOUNT_KEY, id)
    configure({ account: id })
    setAccount(id)
  }
  const signOut = async () => {
    try {
      await api("POST", "/console/sign-out", undefined, { noAccount: true })
    } finally {
      navigate("/sign-in", true)
      setSigned({ _tag: "Out" })
    }
  }
  const section = `/${path.split("/")[1] ?? ""}`
  return (
    <WhoContext.Provider value={who}>
      <header class="top">
        <Link href="/" class="brand">
          Hangar
        </Link>
        <nav aria-label="Main">
          {nav
            .filter((n) => !n.owner || role === "owner")
            .map((n) => (
              <Link
                key={n.href}
                href={n.href}
                class={section === n.href || (section === "/" && n.href === "/runs") ? "current" : ""}
              >
                {n.label}
              </Link>
            ))}
        </nav>
        <div class="who">
          {accounts.length > 1 ? (
            <label>
              <span class="sr">Account</span>
              <select
                id="account"
                value={account}
                onChange={(e) => choose((e.currentTarget as HTMLSelectElement).value)}
              >
                {accounts.map((a) => (
                  <option key={a.account} value={a.account}>
                    {a.name} ({a.role})
                  </option>
                ))}
              </select>
            </label>
          ) : (
            <span class="account-name">{accounts[0]?.name ?? ""}</span>
          )}
          <span class="email" title={`signed in as ${signed.email}`}>
            {signed.email}
          </span>
          <button type="button" class="link" onClick={signOut}>
            Sign out
          </button>
        </div>
      </header>
      <main key={account}>
        <Body path={path} query={query} who={who} />
      </main>
    </WhoContext.Provider>
  )
}

render(<App />, document.getElementById("app")!)

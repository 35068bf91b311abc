/**
 * The sign-in page: with an OIDC issuer configured, a button that starts its sign-in; in local
 * mode, how to get a one-time link. Either way, why the last attempt did not work.
 */
import { useEffect, useState } from "preact/hooks"

const problems: Record<string, string> = {
  used: "That sign-in link was already used. Each link signs in once; ask for a new one.",
  expired: "That sign-in link has expired (links last 10 minutes). Ask for a new one.",
  unknown: "That sign-in link is not known here. Check that it was copied whole.",
  oidc: "Signing in through your identity provider did not work. Try again.",
}

export const SignInPage = (props: { readonly problem: string | undefined }) => {
  const [config, setConfig] = useState<{ oidc: boolean; issuer: string } | undefined>(undefined)
  useEffect(() => {
    fetch("/console/config")
      .then((r) => r.json())
      .then(setConfig, () => setConfig({ oidc: false, issuer: "" }))
  }, [])
  return (
    <main class="sign-in">
      <h1>Sign in to Hangar</h1>
      {props.problem !== undefined ? (
        <p class="problem" role="alert">
          {problems[props.problem] ?? "That sign-in did not work."}
        </p>
      ) : null}
      {config === undefined ? null : config.oidc ? (
        <p>
          {/* A page load: the identity provider's pages are not ours. */}
          <a class="button" href="/console/oidc/start" id="oidc-sign-in">
            Sign in with {new URL(config.issuer).host}
          </a>
        </p>
      ) : (
        <>
          <p>Open a sign-in link made for your e-mail address. An operator of this service makes one with:</p>
          <pre>hangar admin console-link --email you@example.com</pre>
          <p class="hint">A link works once, for 10 minutes.</p>
        </>
      )}
    </main>
  )
}

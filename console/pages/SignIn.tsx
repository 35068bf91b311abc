/** The sign-in page: how to get a link (local mode), and why a link did not work. */
const problems: Record<string, string> = {
  used: "That sign-in link was already used. Each link signs in once; ask for a new one.",
  expired: "That sign-in link has expired (links last 10 minutes). Ask for a new one.",
  unknown: "That sign-in link is not known here. Check that it was copied whole.",
}

export const SignInPage = (props: { readonly problem: string | undefined }) => (
  <main class="sign-in">
    <h1>Sign in to Hangar</h1>
    {props.problem !== undefined ? (
      <p class="problem" role="alert">
        {problems[props.problem] ?? "That sign-in link did not work."}
      </p>
    ) : null}
    <p>Open a sign-in link made for your e-mail address. An operator of this service makes one with:</p>
    <pre>hangar admin console-link --email you@example.com</pre>
    <p class="hint">A link works once, for 10 minutes.</p>
  </main>
)

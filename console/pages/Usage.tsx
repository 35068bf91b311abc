/**
 * The account's balance and the ledger of the last 30 days; for owners, buying credit through the
 * payment processor's page (`POST /v1/credit/checkout`), which sends the person back to `/credit`.
 */
import { useEffect, useState } from "preact/hooks"
import { ApiFailure, api, describe, type Json } from "../api.ts"
import { Link, Page, Problem } from "../components.tsx"
import { usd, when } from "../format.ts"
import { useWho } from "../session.ts"

const Checkout = () => {
  const [dollars, setDollars] = useState("20")
  const [problem, setProblem] = useState<string | undefined>(undefined)
  const [busy, setBusy] = useState(false)
  const buy = async (e: Event) => {
    e.preventDefault()
    setBusy(true)
    try {
      const { url } = await api("POST", "/v1/credit/checkout", {
        amount_usd_cents: Math.round(Number(dollars) * 100),
      })
      location.assign(url)
    } catch (err) {
      setProblem(
        err instanceof ApiFailure && err.code === "purchases_closed"
          ? "Buying credit is not open on this service."
          : describe(err),
      )
      setBusy(false)
    }
  }
  return (
    <>
      <h2>Buy credit</h2>
      <Problem text={problem} />
      <form class="inline-form" onSubmit={buy}>
        <label>
          Amount in dollars (5 to 500)
          <input
            id="credit-amount"
            type="number"
            min={5}
            max={500}
            step={1}
            required
            value={dollars}
            onInput={(e) => setDollars((e.currentTarget as HTMLInputElement).value)}
          />
        </label>
        <button type="submit" class="primary" id="buy-credit" disabled={busy}>
          Go to payment
        </button>
      </form>
    </>
  )
}

export const UsagePage = (props: { readonly checkout?: string | undefined }) => {
  const who = useWho()
  const [usage, setUsage] = useState<Json | undefined>(undefined)
  const [problem, setProblem] = useState<string | undefined>(undefined)
  useEffect(() => {
    api("GET", "/v1/usage")
      .then(setUsage)
      .catch((e) => setProblem(describe(e)))
  }, [])
  const b = usage?.balance
  return (
    <Page title="Usage and credit">
      <Problem text={problem} />
      {props.checkout === "success" ? (
        <p class="card" role="status" id="checkout-done">
          Thank you. The credit is added once the payment processor confirms the payment.
        </p>
      ) : props.checkout === "cancelled" ? (
        <p class="card" role="status">
          The payment was cancelled; nothing was charged.
        </p>
      ) : null}
      {usage === undefined ? (
        problem === undefined ? (
          <p class="loading">Loading…</p>
        ) : null
      ) : (
        <>
          <dl class="facts">
            <dt>Balance</dt>
            <dd id="balance">{usd(b.balance_usd_nanos)}</dd>
            <dt>Available</dt>
            <dd>{usd(b.available_usd_nanos)}</dd>
            <dt>Minimum</dt>
            <dd>{usd(b.minimum_balance_usd_nanos)}</dd>
          </dl>
          {who.role === "owner" ? <Checkout /> : null}
          <h2>Last 30 days</h2>
          {usage.entries.length === 0 ? (
            <p class="empty">No entries.</p>
          ) : (
            <div class="table-wrap">
              <table>
                <thead>
                  <tr>
                    <th scope="col">When</th>
                    <th scope="col">Kind</th>
                    <th scope="col">Run</th>
                    <th scope="col">Minutes</th>
                    <th scope="col" class="num">
                      Amount
                    </th>
                  </tr>
                </thead>
                <tbody>
                  {(usage.entries as Array<Json>).map((e) => (
                    <tr key={e.id}>
                      <td>{when(e.effective_at)}</td>
                      <td>{e.kind}</td>
                      <td>
                        {e.run === undefined ? (
                          "—"
                        ) : (
                          <Link href={`/runs/${e.run}`} class="mono">
                            {e.run}
                          </Link>
                        )}
                      </td>
                      <td>{e.from_minute === undefined ? "—" : `${e.from_minute}–${e.through_minute}`}</td>
                      <td class="num">{usd(e.amount_usd_nanos)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
        </>
      )}
    </Page>
  )
}

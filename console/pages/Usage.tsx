/** The account's balance and the ledger of the last 30 days. */
import { useEffect, useState } from "preact/hooks"
import { api, describe, type Json } from "../api.ts"
import { Link, Page, Problem } from "../components.tsx"
import { usd, when } from "../format.ts"

export const UsagePage = () => {
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

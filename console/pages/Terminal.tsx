/**
 * A terminal on a running run, in its own page (`/runs/:id/terminal`): xterm.js drawing what the
 * session (`terminal.ts`) opens. xterm styles itself with `<style>` elements, so this one page is
 * served with `style-src 'unsafe-inline'`; its scripts stay as strict as on every other page.
 */
import { Terminal as XTerm } from "@xterm/xterm"
import { useEffect, useRef, useState } from "preact/hooks"
import { describe } from "../api.ts"
import { Page, Problem } from "../components.tsx"
import { openSession, type Session } from "../terminal.ts"

const ROWS = 30

/** Columns that fit the element's width (xterm's cell is about 0.6 em at 14 px). */
const colsFor = (el: HTMLElement) => Math.max(40, Math.min(240, Math.floor((el.clientWidth - 24) / 8.5)))

export const TerminalPage = (props: { readonly id: string }) => {
  const box = useRef<HTMLDivElement>(null)
  const [status, setStatus] = useState("connecting…")
  const [problem, setProblem] = useState<string | undefined>(undefined)

  useEffect(() => {
    const el = box.current
    if (el === null) return
    const term = new XTerm({
      rows: ROWS,
      cols: colsFor(el),
      fontSize: 14,
      cursorBlink: true,
      convertEol: false,
    })
    term.open(el)
    let session: Session | undefined
    let gone = false
    const onResize = () => {
      const cols = colsFor(el)
      if (cols !== term.cols) {
        term.resize(cols, ROWS)
        session?.resize(ROWS, cols)
      }
    }
    openSession(
      props.id,
      { rows: ROWS, cols: term.cols },
      {
        output: (data) => term.write(data),
        exit: (code) => setStatus(`the shell exited with status ${code}`),
        closed: (reason) => {
          gone = true
          setStatus((s) =>
            s.startsWith("the shell exited") ? s : `session ended${reason === "" ? "" : `: ${reason}`}`,
          )
        },
      },
    )
      .then((s) => {
        if (gone) return
        session = s
        setStatus("connected")
        term.onData((text) => s.input(text))
        term.focus()
      })
      .catch((e) => setProblem(describe(e)))
    addEventListener("resize", onResize)
    return () => {
      removeEventListener("resize", onResize)
      session?.close()
      term.dispose()
    }
  }, [props.id])

  return (
    <Page title="Terminal">
      <p class="dim">
        <a href={`/runs/${props.id}`}>Back to the run</a> · <span id="terminal-status">{status}</span> · end
        to end encrypted: the keys never leave this browser
      </p>
      <Problem text={problem} />
      <div class="terminal" ref={box} id="terminal" />
    </Page>
  )
}

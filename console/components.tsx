/** Small shared pieces of the pages. */
import type { ComponentChildren } from "preact"
import { onLinkClick } from "./router.ts"

/** An in-app link. */
export const Link = (props: {
  readonly href: string
  readonly children: ComponentChildren
  readonly class?: string
}) => (
  <a href={props.href} class={props.class} onClick={onLinkClick}>
    {props.children}
  </a>
)

/** A run or command state as a coloured badge. */
export const State = (props: { readonly state: string }) => (
  <span class={`state state-${props.state}`} data-state={props.state}>
    {props.state}
  </span>
)

/** A failure to show, or nothing. */
export const Problem = (props: { readonly text: string | undefined }) =>
  props.text === undefined ? null : (
    <p class="problem" role="alert">
      {props.text}
    </p>
  )

/** A page's heading and body. */
export const Page = (props: {
  readonly title: string
  readonly children: ComponentChildren
  readonly actions?: ComponentChildren
}) => (
  <section class="page">
    <header class="page-head">
      <h1>{props.title}</h1>
      {props.actions}
    </header>
    {props.children}
  </section>
)

/**
 * Settings of the terminal's relay and host end, and the refusal of a `terminal` command's
 * arguments; the protocol itself is in `Terminal.ts`.
 */
import { Data } from "effect"
import { defineSettings, env } from "./Config.ts"

/** A terminal could not be opened as asked; `field` names the argument. */
export class TerminalRefused extends Data.TaggedError("TerminalRefused")<{
  readonly field: string
  readonly detail: string
}> {}

export interface TerminalSettingsShape {
  /** Where the relay listens (`host:port`). */
  readonly relayAddr: string
  /** The relay's address as callers reach it; empty: `ws://<relayAddr>/terminal`. */
  readonly relayUrl: string
  /** How long the host end waits for its caller (spec: 2 minutes). */
  readonly joinWaitMs: number
  /** Frames the host end sends ahead of what the relay has passed on to the caller. */
  readonly windowFrames: number
  /**
   * How often, once a caller joined, the host end and the relay each send the other an `alive`
   * note; one that hears nothing for three of these ends the session. Relays and host agents use
   * the same value (a side beating three times slower than the other would be taken as gone).
   */
  readonly heartbeatMs: number
}

/**
 * Terminal settings (`HANGAR_RELAY_ADDR`, `HANGAR_RELAY_URL`, `HANGAR_TERMINAL_JOIN_WAIT_MS`,
 * `HANGAR_TERMINAL_WINDOW_FRAMES`, `HANGAR_TERMINAL_HEARTBEAT_MS`).
 */
export const TerminalSettings = defineSettings(
  "core/TerminalSettings",
  {
    relayAddr: "127.0.0.1:8081",
    relayUrl: "",
    joinWaitMs: 120_000,
    windowFrames: 64,
    heartbeatMs: 10_000,
  } as TerminalSettingsShape,
  (d) => ({
    relayAddr: env.string("RELAY_ADDR", d.relayAddr),
    relayUrl: env.string("RELAY_URL", d.relayUrl),
    joinWaitMs: env.integer("TERMINAL_JOIN_WAIT_MS", d.joinWaitMs),
    windowFrames: env.integer("TERMINAL_WINDOW_FRAMES", d.windowFrames),
    heartbeatMs: env.integer("TERMINAL_HEARTBEAT_MS", d.heartbeatMs),
  }),
)

/** The relay URL callers are given. */
export const relayUrlOf = (s: TerminalSettingsShape): string =>
  s.relayUrl !== "" ? s.relayUrl : `ws://${s.relayAddr.replace(/^0\.0\.0\.0:/, "127.0.0.1:")}/terminal`

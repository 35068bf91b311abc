import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Effect, Option } from "effect"
import { type StartedNatsServer, startNatsServer } from "../../test/harness/NatsServer.ts"
import * as Inbox from "../Inbox.ts"
import { Storage } from "../Storage.ts"
import { getMessage } from "../StreamRead.ts"
import { publishAll } from "./Outbox.ts"
import type { OutboxEntry } from "./Record.ts"
import { withClient } from "./testing/Harness.ts"

let server: StartedNatsServer
beforeAll(async () => {
  server = await startNatsServer()
})
afterAll(() => server?.stop())

const text = (data: Uint8Array) => new TextDecoder().decode(data)

/** The bodies stored on `subject`, in stream order (the mailbox is a work queue: read one by one). */
const bodiesOn = (stream: string, subject: string) =>
  Effect.gen(function* () {
    const out: Array<string> = []
    for (let seq = 1; ; ) {
      const found = yield* getMessage(stream, { seq, nextOf: subject })
      if (Option.isNone(found)) return out
      out.push(text(found.value.data))
      seq = found.value.seq + 1
    }
  })

/** The mailbox stream, and the mailboxes of two actors `a` and `b` of type `t` in `partition`. */
const mailboxes = (partition: number) =>
  Effect.map(Storage, ({ names }) => ({
    stream: names.streams.MAILBOX.name,
    a: names.subjects.mailbox("t", partition, "a"),
    b: names.subjects.mailbox("t", partition, "b"),
  }))

describe("an outbox published", () => {
  it.effect("keeps one subject's sends in order, and answers an ask only once every effect is stored", () =>
    withClient(server.url, () =>
      Effect.gen(function* () {
        const { stream, a, b } = yield* mailboxes(0)
        const send = (subject: string, body: string): OutboxEntry => ({
          _tag: "Send",
          subject,
          msgId: `t.${body}`,
          body,
        })
        // Stored when the reply comes: the last message of each subject, read as the asker hears back.
        // The outbox goes out on a fiber of its own: the asker reads when the reply comes, not
        // when the publishing is over.
        const seen = yield* Inbox.request(
          (inbox) =>
            Effect.asVoid(
              Effect.forkDaemon(
                publishAll(stream, [
                  send(a, "a1"),
                  send(b, "b1"),
                  send(a, "a2"),
                  { _tag: "Reply", inbox, body: "done" },
                  send(a, "a3"),
                ]),
              ),
            ),
          "5 seconds",
        ).pipe(
          Effect.zipWith(
            Effect.suspend(() =>
              Effect.all([getMessage(stream, { lastOf: a }), getMessage(stream, { lastOf: b })]),
            ),
            (reply, last) => ({ reply: text(reply), last }),
          ),
        )
        expect(seen.reply).toBe("done")
        const [lastA, lastB] = seen.last.map((m) => Option.getOrThrow(m))
        expect(text(lastA?.data ?? new Uint8Array())).toBe("a3")
        expect(text(lastB?.data ?? new Uint8Array())).toBe("b1")
        expect(yield* bodiesOn(stream, a)).toEqual(["a1", "a2", "a3"])
      }),
    ),
  )

  it.effect("a send that fails keeps the later sends of its subject out, and fails the outbox", () =>
    withClient(server.url, () =>
      Effect.gen(function* () {
        const { stream, a, b } = yield* mailboxes(1)
        // Over the server's largest message (1 MiB by default): refused before anything is stored.
        const tooBig = "x".repeat(2 * 1024 * 1024)
        const failed = yield* publishAll(stream, [
          { _tag: "Send", subject: a, msgId: "t.big", body: tooBig },
          { _tag: "Send", subject: a, msgId: "t.after", body: "after" },
          { _tag: "Send", subject: b, msgId: "t.beside", body: "beside" },
        ]).pipe(Effect.flip)
        expect(failed._tag).toBe("NatsError")
        // Published one by one, the second send on `a` never left; side by side, it would be stored.
        expect(yield* bodiesOn(stream, a)).toEqual([])
      }),
    ),
  )

  it.effect("purges a cancelled timer before the schedule that follows it on the same subject", () =>
    withClient(server.url, () =>
      Effect.gen(function* () {
        const { names } = yield* Storage
        const stream = names.streams.MAILBOX.name
        const timer = names.subjects.timer("t", 0, "a", "bill")
        const target = names.subjects.mailbox("t", 0, "a")
        const schedule = (body: string): OutboxEntry => ({
          _tag: "Schedule",
          subject: timer,
          target,
          at: Date.now() + 3_600_000,
          timer: "bill",
          msgId: `t.${body}`,
          body,
        })
        yield* publishAll(stream, [schedule("first")])
        yield* publishAll(stream, [
          { _tag: "Send", subject: target, msgId: "t.other", body: "other" },
          { _tag: "Cancel", subject: timer },
          schedule("second"),
        ])
        const last = Option.getOrThrow(yield* getMessage(stream, { lastOf: timer }))
        expect(text(last.data)).toBe("second")
        expect(yield* bodiesOn(stream, timer)).toEqual(["second"])
      }),
    ),
  )
})

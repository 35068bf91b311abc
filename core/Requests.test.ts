import { expect, layer } from "@effect/vitest"
import { headers as natsHeaders } from "@nats-io/transport-node"
import { Effect, Either, Fiber } from "effect"
import { layerAll } from "../test/harness/NatsServer.ts"
import { uniqueName } from "../test/harness/names.ts"
import { Nats } from "./Nats.ts"
import { make } from "./Requests.ts"
import { Storage } from "./Storage.ts"
import * as JsStream from "./Stream.ts"

const text = (data: Uint8Array) => new TextDecoder().decode(data)

layer(layerAll())("Requests (shared inbox)", (it) => {
  it.effect("answers each request with its own reply, many at once", () =>
    Effect.gen(function* () {
      const { connection, requests } = yield* Nats
      const subject = uniqueName("echo")
      const sub = connection.subscribe(subject, {
        callback: (_e, m) => {
          m.respond(`re:${text(m.data)}`)
        },
      })
      yield* Effect.promise(() => connection.flush())
      const answers = yield* Effect.forEach(
        Array.from({ length: 200 }, (_, i) => i),
        (i) => requests.request("echo", subject, `${i}`, undefined, 5_000),
        { concurrency: "unbounded" },
      )
      expect(answers.map((m) => text(m.data))).toEqual(Array.from({ length: 200 }, (_, i) => `re:${i}`))
      sub.unsubscribe()
    }),
  )

  it.effect("send publishes when run; its replies are awaited later, in any order, even once come", () =>
    Effect.gen(function* () {
      const { connection, requests } = yield* Nats
      const subject = uniqueName("echo")
      const heard: Array<string> = []
      const sub = connection.subscribe(subject, {
        callback: (_e, m) => {
          heard.push(text(m.data))
          m.respond(`re:${text(m.data)}`)
        },
      })
      yield* Effect.promise(() => connection.flush())
      const first = yield* requests.send("echo", subject, "1", undefined, 5_000)
      const second = yield* requests.send("echo", subject, "2", undefined, 5_000)
      // Both went out before either was awaited; the second's reply is taken first.
      yield* Effect.promise(() => connection.flush())
      yield* Effect.yieldNow().pipe(Effect.repeat({ until: () => heard.length === 2 }))
      expect(heard).toEqual(["1", "2"])
      expect(text((yield* second).data)).toBe("re:2")
      expect(text((yield* first).data)).toBe("re:1")
      sub.unsubscribe()
    }),
  )

  it.effect("send: no listener, silence and a closed connection are NatsErrors", () =>
    Effect.gen(function* () {
      const { connection, requests } = yield* Nats
      const nobody = yield* Effect.flatten(
        requests.send("send nobody", uniqueName("nobody"), "x", undefined, 5_000),
      ).pipe(Effect.flip)
      expect(nobody).toMatchObject({ _tag: "NatsError", operation: "send nobody", message: "no responders" })
      const subject = uniqueName("silent")
      const sub = connection.subscribe(subject, { callback: () => {} })
      yield* Effect.promise(() => connection.flush())
      const silent = yield* Effect.flatten(requests.send("send silent", subject, "x", undefined, 300)).pipe(
        Effect.flip,
      )
      expect(silent).toMatchObject({ _tag: "NatsError", operation: "send silent", message: "timed out" })
      sub.unsubscribe()
      const own = make(connection)
      own.close()
      const closed = yield* own.send("send closed", subject, "x", undefined, 5_000).pipe(Effect.flip)
      expect(closed).toMatchObject({ _tag: "NatsError", message: "connection closed" })
    }),
  )

  it.effect("no listener is a NatsError at once; silence is a NatsError at the deadline", () =>
    Effect.gen(function* () {
      const { connection, requests } = yield* Nats
      const nobody = yield* requests
        .request("ask nobody", uniqueName("nobody"), "x", undefined, 5_000)
        .pipe(Effect.flip)
      expect(nobody).toMatchObject({ _tag: "NatsError", operation: "ask nobody", message: "no responders" })
      const subject = uniqueName("silent")
      const sub = connection.subscribe(subject, { callback: () => {} })
      yield* Effect.promise(() => connection.flush())
      const silent = yield* requests.request("ask silent", subject, "x", undefined, 300).pipe(Effect.flip)
      expect(silent).toMatchObject({ _tag: "NatsError", operation: "ask silent", message: "timed out" })
      sub.unsubscribe()
    }),
  )

  it.effect(
    "no responder to a JetStream request (a stream leaderless mid-election) counts as trouble; to a core request it does not",
    () =>
      Effect.gen(function* () {
        const { connection } = yield* Nats
        const own = make(connection)
        yield* Effect.addFinalizer(() => Effect.sync(() => own.close()))
        yield* own.request("core", uniqueName("nobody"), "x", undefined, 5_000).pipe(Effect.flip)
        expect(own.lastTimeout()).toBe(0)
        // A stream publish (it carries headers) that no stream captures: nobody answers.
        const h = natsHeaders()
        h.set("Nats-Msg-Id", "m1")
        const before = Date.now()
        const refused = yield* own.request("publish", uniqueName("nostream"), "x", h, 5_000).pipe(Effect.flip)
        expect(refused.message).toBe("no responders")
        expect(own.lastTimeout()).toBeGreaterThanOrEqual(before)
      }).pipe(Effect.scoped),
  )

  it.effect(
    "JetStream answering 'temporarily unavailable' (a frozen or electing cluster) counts as trouble; another error does not",
    () =>
      Effect.gen(function* () {
        const { connection } = yield* Nats
        const own = make(connection)
        yield* Effect.addFinalizer(() => Effect.sync(() => own.close()))
        // An API request of the shape JetStream answers, to a stand-in that answers as it does.
        const api = `$JS.API.${uniqueName("STREAM.MSG.GET")}`
        let answer = ""
        const sub = connection.subscribe(api, {
          callback: (_e, m) => {
            m.respond(answer)
          },
        })
        yield* Effect.promise(() => connection.flush())
        answer =
          '{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","error":{"code":404,"err_code":10037,"description":"no message found"}}'
        yield* own.request("get", api, "{}", undefined, 5_000)
        expect(own.lastTimeout()).toBe(0)
        answer =
          '{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","error":{"code":503,"err_code":10008,"description":"JetStream system temporarily unavailable"}}'
        const before = Date.now()
        const got = yield* own.request("get", api, "{}", undefined, 5_000)
        // The answer is the caller's to read; the store now counts as not settled (`Nats.settled`).
        expect(text(got.data)).toContain("temporarily unavailable")
        expect(own.lastTimeout()).toBeGreaterThanOrEqual(before)
        sub.unsubscribe()
      }).pipe(Effect.scoped),
  )

  it.effect(
    "an inbox keeps a reply that arrives before anyone waits, forgets a released address, and times out",
    () =>
      Effect.gen(function* () {
        const { connection, requests } = yield* Nats
        const inbox = requests.inbox("early", 60_000)
        connection.publish(inbox.subject, "first")
        connection.publish(inbox.subject, "second")
        yield* Effect.promise(() => connection.flush())
        expect(text((yield* inbox.reply).data)).toBe("first")
        // A released address leaves nothing behind: a later reply to it is dropped, not delivered.
        const late = requests.inbox("late", 60_000)
        const fiber = yield* Effect.fork(late.reply)
        yield* Fiber.interrupt(fiber)
        late.release()
        connection.publish(late.subject, "nobody hears this")
        yield* Effect.promise(() => connection.flush())
        // Without an answer, the wait fails with ReplyTimeout once its time is up.
        const silent = yield* requests.inbox("silent", 50).reply.pipe(Effect.flip)
        expect(silent).toMatchObject({ _tag: "ReplyTimeout", timeoutMs: 50 })
      }),
  )

  it.effect("closing fails what waits and refuses what comes after", () =>
    Effect.gen(function* () {
      const { connection } = yield* Nats
      const own = make(connection)
      const subject = uniqueName("silent")
      let heard = 0
      const sub = connection.subscribe(subject, {
        callback: () => {
          heard++
        },
      })
      yield* Effect.promise(() => connection.flush())
      const fiber = yield* Effect.fork(own.request("waits", subject, "x", undefined, 60_000))
      yield* Effect.yieldNow()
      yield* Effect.promise(() => connection.flush())
      expect(heard).toBe(1) // the request went out and now waits
      own.close()
      expect(yield* Fiber.join(fiber).pipe(Effect.flip)).toMatchObject({ message: "connection closed" })
      const after = yield* own.request("after", subject, "x", undefined, 60_000).pipe(Effect.either)
      expect(Either.isLeft(after) && after.left.message).toBe("connection closed")
      sub.unsubscribe()
    }),
  )

  it.effect(
    "a refused JetStream publish carries the server's error code; a subject no stream holds is refused",
    () =>
      Effect.gen(function* () {
        const { names } = yield* Storage
        const subject = names.subjects.events("acc_x", uniqueName("run"))
        const nats = yield* Nats
        const expected = natsHeaders()
        expected.set("Nats-Expected-Last-Subject-Sequence", "41")
        const refused = yield* JsStream.publishVia(nats.requests, "publish", subject, "x", expected).pipe(
          Effect.flip,
        )
        expect(refused).toMatchObject({ _tag: "NatsError", cause: { code: 10071, status: 400 } })
        const nowhere = yield* JsStream.publish(uniqueName("nowhere"), "x", { msgId: uniqueName("m") }).pipe(
          Effect.flip,
        )
        expect(nowhere).toMatchObject({ _tag: "NatsError", message: "no responders" })
      }),
  )
})

/**
 * A node's slot links (node/slot_links.ts) into a real CPU server, against a Router played by
 * the test (the slot protocol by hand): a body that fits one data frame goes into the pipeline
 * whole (no `Request`, no stream), any other as a streamed `Request`, with the same answers and
 * records either way: results, 413, a body past its Content-Length, a cancel while the body is
 * still arriving.
 */
import assert from "node:assert/strict";
import { NodeLink } from "../node/slot_links.ts";
import {
  decodeDataFrame,
  decodeWholeFrame,
  encodeDataFrame,
  encodeMessage,
  encodeWholeFrame,
  type HeaderEntry,
  parseSlotMessage,
  SLOT_PATH,
  type SlotHello,
} from "../link/messages.ts";
import { concatBytes } from "../protocol/bytes.ts";
import { EventLog } from "../http/events.ts";
import { callProgram, multipartBody, testApp } from "./_server.ts";

type _Message = string | ArrayBuffer | { closed: number; reason: string };

/** One slot connection as the Router sees it. */
class _RouterSlot {
  readonly #inbox: _Message[] = [];
  #waiter: (() => void) | null = null;

  constructor(readonly socket: WebSocket) {
    socket.binaryType = "arraybuffer";
    socket.onmessage = (event) => this.#put(event.data);
    socket.onclose = (event) => this.#put({ closed: event.code, reason: event.reason });
  }

  #put(message: _Message): void {
    this.#inbox.push(message);
    const waiter = this.#waiter;
    this.#waiter = null;
    waiter?.();
  }

  async next(): Promise<_Message> {
    const deadline = setTimeout(() => this.#put({ closed: -1, reason: "timed out" }), 30_000);
    while (this.#inbox.length === 0) await new Promise<void>((r) => (this.#waiter = r));
    clearTimeout(deadline);
    return this.#inbox.shift()!;
  }

  /** Sends a request head, `frames` as data frames and, unless told not to, `end`. */
  request(id: string, headers: HeaderEntry[], frames: Uint8Array[], end = true): void {
    const length = headers.find(([name]) => name === "content-length")?.[1];
    this.socket.send(encodeMessage({
      t: "request_head",
      request_id: id,
      headers,
      content_length: length === undefined ? null : Number(length),
    }));
    for (const frame of frames) this.socket.send(encodeDataFrame(id, frame));
    if (end) this.socket.send(encodeMessage({ t: "end", request_id: id }));
  }

  /** Reads the node's answer to `id`: head, data frames, end. */
  async answer(
    id: string,
  ): Promise<
    { status: number; json: Record<string, unknown>; frames: number[]; declared: number }
  > {
    const head = await this.next();
    assert.equal(typeof head, "string", JSON.stringify(head));
    const message = parseSlotMessage(head as string);
    assert.ok(message.t === "response_head" && message.request_id === id);
    const chunks: Uint8Array[] = [];
    for (;;) {
      const next = await this.next();
      if (next instanceof ArrayBuffer) {
        chunks.push(decodeDataFrame(new Uint8Array(next)).bytes);
        continue;
      }
      assert.equal(typeof next, "string", JSON.stringify(next));
      assert.equal(parseSlotMessage(next as string).t, "end");
      break;
    }
    const text = new TextDecoder().decode(concatBytes(chunks));
    const declared = Number(message.headers.find(([name]) => name === "content-length")?.[1]);
    const frames = chunks.map((chunk) => chunk.length);
    return { status: message.status, json: JSON.parse(text), frames, declared };
  }
}

/**
 * A Router that acknowledges every slot's hello (taking whole frames when `whole`, as a Router
 * of this version does; an earlier Router's ack says nothing of them) and hands the slots to the
 * test.
 */
function _fakeRouter(whole = false) {
  const slots: _RouterSlot[] = [];
  const hellos: SlotHello[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
    assert.equal(new URL(request.url).pathname, SLOT_PATH);
    const { socket, response } = Deno.upgradeWebSocket(request);
    socket.onmessage = (event) => {
      const hello = parseSlotMessage(event.data);
      assert.equal(hello.t, "hello");
      hellos.push(hello as SlotHello);
      socket.send(encodeMessage(whole ? { t: "ack", whole: true } : { t: "ack" }));
      slots.push(new _RouterSlot(socket));
    };
    return response;
  });
  return {
    hellos,
    url: `http://127.0.0.1:${server.addr.port}`,
    async slot(index: number): Promise<_RouterSlot> {
      const deadline = performance.now() + 30_000;
      while (slots.length <= index) {
        if (performance.now() > deadline) assert.fail("no slot in time");
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      return slots[index];
    },
    stop: () => server.shutdown(),
  };
}

Deno.test("node link: small bodies go in whole, others streamed; answers and records match", async () => {
  const { app, events } = testApp({ numWorkers: 1, maxRequestBytes: 100_000 });
  await app.start();
  const router = _fakeRouter();
  const kinds: string[] = [];
  const link = new NodeLink({
    routerEndpoint: router.url,
    nodeId: "cpu-a",
    nodeToken: null,
    serverInstanceId: app.health().instance_id,
    slots: 1,
    execute: (request, client) => {
      kinds.push(request instanceof Request ? "streamed" : "whole");
      return app.execute(request, client);
    },
    events: app.events,
    reconnectMinMs: 10,
  });
  link.start();
  const recordsOf = (id: string) => events.filter((e) => e.request_id === id);
  const finished = (id: string) => recordsOf(id).find((e) => e.event === "request_finished")!;
  try {
    let slot = await router.slot(0);
    const { body, contentType } = multipartBody([{
      name: "program",
      contentType: "application/json",
      body: JSON.stringify(callProgram("def f(x):\n    return x * 2\n", "f", [21])),
    }]);
    const headers = (id: string, length: number | null): HeaderEntry[] => [
      ["content-type", contentType],
      ["x-request-id", id],
      ...(length === null ? [] : [["content-length", String(length)] as HeaderEntry]),
    ];

    // Declared and within one frame: whole. Undeclared: streamed, in pieces.
    const whole = crypto.randomUUID();
    slot.request(whole, headers(whole, body.length), [body]);
    const a = await slot.answer(whole);
    const streamed = crypto.randomUUID();
    const pieces = [body.subarray(0, 50), body.subarray(50)];
    slot.request(streamed, headers(streamed, null), pieces);
    const b = await slot.answer(streamed);
    assert.deepEqual(kinds, ["whole", "streamed"]);
    assert.equal(a.status, 200);
    // An answer that declares its length goes out as one data frame of exactly that length.
    assert.deepEqual(a.frames, [a.declared]);
    assert.deepEqual(b.frames, [b.declared]);
    assert.deepEqual(a.json.results, { out: { type: "integer", value: 42 } });
    assert.deepEqual(b.json.results, a.json.results);
    assert.deepEqual(
      recordsOf(whole).map((e) => e.event),
      recordsOf(streamed).map((e) => e.event),
    );
    const received = recordsOf(whole).find((e) => e.event === "request_received")!;
    assert.equal(received.client, "outbound-tunnel");
    assert.equal(received.content_length, String(body.length));
    assert.equal(
      recordsOf(whole).find((e) => e.event === "request_accepted")!.request_bytes,
      body.length,
    );

    // Over the server's limit: declared (whole) is refused before its body, counted (streamed)
    // once read past it. Both 413 request_too_large.
    const big = new Uint8Array(200_000);
    const declared = crypto.randomUUID();
    slot.request(declared, headers(declared, 200_000), [], false);
    const tooLarge = await slot.answer(declared);
    slot.socket.send(encodeDataFrame(declared, big.subarray(0, 200_000)));
    slot.socket.send(encodeMessage({ t: "end", request_id: declared }));
    const counted = crypto.randomUUID();
    slot.request(counted, headers(counted, null), [
      big.subarray(0, 60_000),
      big.subarray(0, 40_001),
    ]);
    const tooLargeToo = await slot.answer(counted);
    assert.deepEqual(kinds.slice(2), ["whole", "streamed"]);
    for (const answer of [tooLarge, tooLargeToo]) {
      assert.equal(answer.status, 413);
      assert.equal((answer.json.error as { kind: string }).kind, "request_too_large");
    }

    // A body past its Content-Length is cut where a streamed one's reader cuts it: the bytes
    // that came, then parsed (here: the program and some junk after the closing delimiter).
    const past = crypto.randomUUID();
    const junk = new TextEncoder().encode("junk");
    slot.request(past, headers(past, body.length), [
      Uint8Array.from([...body, ...junk]),
    ]);
    const pastAnswer = await slot.answer(past);
    assert.equal(kinds.at(-1), "whole");
    assert.equal(finished(past).http_status, pastAnswer.status);
    assert.equal(pastAnswer.status, 200);
    assert.deepEqual(pastAnswer.json.results, a.json.results);

    // A cancel while the body is still arriving: the request is a 400 (its body could not be
    // read), whole or streamed, and the slot reconnects at once.
    let reconnects = 1;
    for (const length of [body.length, null]) {
      const id = crypto.randomUUID();
      slot.request(id, headers(id, length), [body.subarray(0, 10)], false);
      await new Promise((resolve) => setTimeout(resolve, 50));
      slot.socket.send(
        encodeMessage({ t: "cancel", request_id: id, reason: "client_disconnected" }),
      );
      assert.deepEqual(await slot.next(), { closed: 1000, reason: "cancelled" });
      slot = await router.slot(reconnects++);
      const deadline = performance.now() + 10_000;
      while (!recordsOf(id).some((e) => e.event === "request_finished")) {
        if (performance.now() > deadline) assert.fail("no request_finished");
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      const record = finished(id);
      assert.equal(record.http_status, 400);
      assert.equal(
        record.error_message,
        "the request body could not be read: tunnel: client_disconnected",
      );
      assert.ok(recordsOf(id).some((e) => e.event === "tunnel_request_cancelled"));
    }
    assert.deepEqual(kinds.slice(-2), ["whole", "streamed"]);

    // The slot serves on after all that.
    const again = crypto.randomUUID();
    slot.request(again, headers(again, body.length), [body]);
    assert.deepEqual((await slot.answer(again)).json.results, a.json.results);
  } finally {
    await link.stop();
    await router.stop();
    await app.shutdown();
  }
});

Deno.test("node link: with a Router that takes whole frames, a request in one frame is answered in one", async () => {
  const { app } = testApp({ numWorkers: 1 });
  await app.start();
  const router = _fakeRouter(true);
  const link = _linkTo(router.url, app);
  link.start();
  try {
    const slot = await router.slot(0);
    assert.equal(router.hellos[0].whole, true, "the node offers whole frames");
    const { body, contentType } = multipartBody([{
      name: "program",
      contentType: "application/json",
      body: JSON.stringify(callProgram("def f(x):\n    return x * 2\n", "f", [21])),
    }]);
    for (let round = 0; round < 3; round++) {
      const id = crypto.randomUUID();
      slot.socket.send(
        encodeWholeFrame({
          t: "request_head",
          request_id: id,
          headers: [["content-type", contentType], ["content-length", String(body.length)]],
          content_length: body.length,
        }, body)!,
      );
      // One message back: head, body and end together.
      const answer = await slot.next();
      assert.ok(answer instanceof ArrayBuffer, `a whole frame, not ${JSON.stringify(answer)}`);
      const { head, bytes } = decodeWholeFrame(new Uint8Array(answer));
      assert.ok(head.t === "response_head" && head.request_id === id);
      assert.equal(head.status, 200);
      const declared = head.headers.find(([name]) => name === "content-length")?.[1];
      assert.equal(Number(declared), bytes.length);
      const json = JSON.parse(new TextDecoder().decode(bytes));
      assert.deepEqual(json.results, { out: { type: "integer", value: 42 } });
    }
    // A request sent the long way gets its answer whole all the same (the answer is one frame).
    const id = crypto.randomUUID();
    slot.request(id, [["content-type", contentType]], [body]);
    const answer = await slot.next();
    assert.ok(answer instanceof ArrayBuffer);
    assert.equal(decodeWholeFrame(new Uint8Array(answer)).head.request_id, id);
  } finally {
    await link.stop();
    await router.stop();
    await app.shutdown();
  }
});

Deno.test("node link: a whole frame from a Router whose ack did not take them, or a malformed one, ends the slot", async () => {
  const { app, events } = testApp({ numWorkers: 1 });
  await app.start();
  for (
    const [whole, frame, reason] of [
      [
        false,
        (id: string) => encodeWholeFrame(_head(id), new Uint8Array(0))!,
        "the ack did not take",
      ],
      [true, () => new Uint8Array([2, 1, 2, 3]), "malformed whole frame"],
      [true, (id: string) => {
        const frame = encodeWholeFrame(_head(id), new Uint8Array(0))!;
        frame[1] ^= 1; // the frame's request id no longer the head's
        return frame;
      }, "another request"],
    ] as const
  ) {
    const router = _fakeRouter(whole);
    const link = _linkTo(router.url, app);
    link.start();
    const errors = () => events.filter((e) => e.event === "tunnel_protocol_error").length;
    const errorsBefore = errors();
    try {
      const slot = await router.slot(0);
      slot.socket.send(frame(crypto.randomUUID()));
      const closed = await slot.next() as { closed: number; reason: string };
      assert.equal(closed.closed, 4003, JSON.stringify(closed));
      assert.match(closed.reason, new RegExp(reason));
      assert.equal(errors(), errorsBefore + 1, "this case's protocol error was logged");
    } finally {
      await link.stop();
      await router.stop();
    }
  }
  await app.shutdown();
});

/** One slot of `app` linked to the Router at `url`, reconnecting after 10 ms. */
function _linkTo(url: string, app: ReturnType<typeof testApp>["app"]): NodeLink {
  return new NodeLink({
    routerEndpoint: url,
    nodeId: "cpu-a",
    nodeToken: null,
    serverInstanceId: app.health().instance_id,
    slots: 1,
    execute: (request, client) => app.execute(request, client),
    events: app.events,
    reconnectMinMs: 10,
  });
}

function _head(id: string) {
  return { t: "request_head" as const, request_id: id, headers: [], content_length: 0 };
}

Deno.test("node link: an answer that ends after its connection was cancelled is dropped, never sent on the next one", async () => {
  for (const whole of [true, false]) {
    const router = _fakeRouter(whole);
    let finish!: () => void;
    let calls = 0;
    const link = new NodeLink({
      routerEndpoint: router.url,
      nodeId: "cpu-a",
      nodeToken: null,
      serverInstanceId: "i1",
      slots: 1,
      reconnectMinMs: 10,
      // The first program is still running when its client goes away; later ones answer at once.
      execute: async () => {
        if (calls++ === 0) await new Promise<void>((resolve) => (finish = resolve));
        return new Response("late", { headers: { "content-length": "4" } });
      },
      events: new EventLog({ logDir: null, console: false, programs: false }),
    });
    link.start();
    try {
      const first = await router.slot(0);
      const id = crypto.randomUUID();
      first.request(id, [["content-length", "0"]], []);
      await new Promise((resolve) => setTimeout(resolve, 50));
      first.socket.send(
        encodeMessage({ t: "cancel", request_id: id, reason: "client_disconnected" }),
      );
      assert.deepEqual(await first.next(), { closed: 1000, reason: "cancelled" });
      const second = await router.slot(1);
      finish();
      await new Promise((resolve) => setTimeout(resolve, 200));
      // Nothing of the cancelled request came on the new connection; it serves the next one.
      const next = crypto.randomUUID();
      second.request(next, [["content-length", "0"]], []);
      const answer = await second.next();
      const head = answer instanceof ArrayBuffer
        ? decodeWholeFrame(new Uint8Array(answer)).head
        : parseSlotMessage(answer as string);
      assert.equal((head as { request_id: string }).request_id, next, `whole ${whole}`);
    } finally {
      await link.stop();
      await router.stop();
    }
  }
});

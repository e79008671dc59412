/**
 * A node's slot links (node/slot_links.ts, node/tunnelled_request.ts) into a real CPU server,
 * against a Router played by the test (the slot protocol by hand): a body that fits one frame
 * goes into the pipeline whole (no `Request`, no stream), any other as a streamed `Request`, with
 * the same answers and records either way: results, 413, a body past its Content-Length, a cancel
 * while the body is still arriving; a request in one frame is answered in one.
 */
import assert from "node:assert/strict";
import { NodeLink } from "../node/slot_links.ts";
import { decodeResponseFrame, encodeFrame } from "../link/frames.ts";
import {
  encodeMessage,
  type HeaderEntry,
  parseSlotMessage,
  PROTOCOL_VERSION,
  type RequestHead,
  type ResponseHead,
  SLOT_PATH,
  type SlotHello,
} from "../link/messages.ts";
import { concatBytes } from "../protocol/bytes.ts";
import { EventLog } from "../http/events.ts";
import { executeTunnelled } from "../server/app.ts";
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

  /**
   * Sends a request the long way: its head alone, `frames` of bytes and, unless told not to,
   * the end alone.
   */
  request(id: string, headers: HeaderEntry[], frames: Uint8Array[], end = true): void {
    this.socket.send(encodeFrame(id, _requestHead(headers), new Uint8Array(0), false));
    for (const frame of frames) this.socket.send(encodeFrame(id, null, frame, false));
    if (end) this.socket.send(encodeFrame(id, null, new Uint8Array(0), true));
  }

  /** Sends a request in one frame: its head, `body` and the end. */
  requestInOneFrame(id: string, headers: HeaderEntry[], body: Uint8Array): void {
    this.socket.send(encodeFrame(id, _requestHead(headers), body, true));
  }

  /**
   * Reads the node's answer to `id` up to its end; `shapes` lists its frames as
   * `head+<bytes>+end`, `<bytes>`, ...
   */
  async answer(id: string): Promise<
    { status: number; json: Record<string, unknown>; shapes: string[]; declared: number }
  > {
    let head: ResponseHead | null = null;
    const chunks: Uint8Array[] = [];
    const shapes: string[] = [];
    for (let end = false; !end;) {
      const next = await this.next();
      assert.ok(next instanceof ArrayBuffer, `a frame, not ${JSON.stringify(next)}`);
      const frame = decodeResponseFrame(new Uint8Array(next));
      assert.equal(frame.requestId, id);
      assert.equal(frame.head !== null, head === null, "the head comes first, once");
      head ??= frame.head;
      chunks.push(frame.bytes);
      end = frame.end;
      shapes.push(`${frame.head ? "head+" : ""}${frame.bytes.length}${end ? "+end" : ""}`);
    }
    const text = new TextDecoder().decode(concatBytes(chunks));
    const declared = Number(head!.headers.find(([name]) => name === "content-length")?.[1]);
    return { status: head!.status, json: JSON.parse(text), shapes, declared };
  }
}

/** The request head of `headers` (its content_length from their Content-Length). */
function _requestHead(headers: HeaderEntry[]): RequestHead {
  const length = headers.find(([name]) => name === "content-length")?.[1];
  return { headers, content_length: length === undefined ? null : Number(length) };
}

/** A Router that acknowledges every slot's hello and hands the slots to the test. */
function _fakeRouter() {
  const slots: _RouterSlot[] = [];
  const hellos: SlotHello[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
    assert.equal(new URL(request.url).pathname, SLOT_PATH);
    const { socket, response } = Deno.upgradeWebSocket(request);
    socket.onmessage = (event) => {
      const hello = parseSlotMessage(event.data);
      assert.equal(hello.t, "hello");
      hellos.push(hello as SlotHello);
      socket.send(encodeMessage({ t: "ack" }));
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
      return executeTunnelled(app, request, client);
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
    // An answer that declares its length goes out in one frame with its head and end.
    assert.deepEqual(a.shapes, [`head+${a.declared}+end`]);
    assert.deepEqual(b.shapes, [`head+${b.declared}+end`]);
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
    slot.socket.send(encodeFrame(declared, null, big.subarray(0, 200_000), false));
    slot.socket.send(encodeFrame(declared, null, new Uint8Array(0), true));
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

Deno.test("node link: a request in one frame is answered in one", async () => {
  const { app } = testApp({ numWorkers: 1 });
  await app.start();
  const router = _fakeRouter();
  const link = _linkTo(router.url, app);
  link.start();
  try {
    const slot = await router.slot(0);
    assert.equal(router.hellos[0].protocol_version, PROTOCOL_VERSION);
    const { body, contentType } = multipartBody([{
      name: "program",
      contentType: "application/json",
      body: JSON.stringify(callProgram("def f(x):\n    return x * 2\n", "f", [21])),
    }]);
    const headers: HeaderEntry[] = [
      ["content-type", contentType],
      ["content-length", String(body.length)],
    ];
    for (let round = 0; round < 3; round++) {
      const id = crypto.randomUUID();
      slot.requestInOneFrame(id, headers, body);
      // One message back: head, body and end together.
      const answer = await slot.answer(id);
      assert.equal(answer.status, 200);
      assert.deepEqual(answer.shapes, [`head+${answer.declared}+end`]);
      assert.deepEqual(answer.json.results, { out: { type: "integer", value: 42 } });
    }
    // A request sent the long way gets its answer in one frame all the same.
    const id = crypto.randomUUID();
    slot.request(id, [["content-type", contentType]], [body]);
    assert.equal((await slot.answer(id)).shapes.length, 1);
  } finally {
    await link.stop();
    await router.stop();
    await app.shutdown();
  }
});

Deno.test("node link: a malformed frame, or one out of turn, ends the slot", async () => {
  const { app, events } = testApp({ numWorkers: 1 });
  await app.start();
  const empty = new Uint8Array(0);
  const cases: [(id: string) => Uint8Array[], string][] = [
    [() => [new Uint8Array([4, 1, 2, 3])], "malformed frame"],
    [(id) => [encodeFrame(id, null, new Uint8Array([1]), true)], "another request"],
    [(id) => [encodeFrame(id, { status: 200, headers: [] }, empty, true)], "content_length"],
    [(id) => [
      encodeFrame(id, _requestHead([]), empty, false),
      encodeFrame(crypto.randomUUID(), _requestHead([]), empty, true),
    ], "before the previous body ended"],
  ];
  for (const [frames, reason] of cases) {
    const router = _fakeRouter();
    const link = _linkTo(router.url, app);
    link.start();
    const errors = () => events.filter((e) => e.event === "tunnel_protocol_error").length;
    const errorsBefore = errors();
    try {
      const slot = await router.slot(0);
      for (const frame of frames(crypto.randomUUID())) slot.socket.send(frame);
      let closed = await slot.next();
      // An answer may come first (a request that began): the close follows.
      while (closed instanceof ArrayBuffer) closed = await slot.next();
      closed = closed as { closed: number; reason: string };
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
    execute: (request, client) => executeTunnelled(app, request, client),
    events: app.events,
    reconnectMinMs: 10,
  });
}

Deno.test("node link: an answer that ends after its connection was cancelled is dropped, never sent on the next one", async () => {
  for (const oneFrame of [true, false]) {
    const router = _fakeRouter();
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
      if (oneFrame) first.requestInOneFrame(id, [["content-length", "0"]], new Uint8Array(0));
      else first.request(id, [["content-length", "0"]], []);
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
      assert.ok(answer instanceof ArrayBuffer, JSON.stringify(answer));
      assert.equal(decodeResponseFrame(new Uint8Array(answer)).requestId, next, `${oneFrame}`);
    } finally {
      await link.stop();
      await router.stop();
    }
  }
});

/**
 * The Router's side of one slot link (router/slot_link.ts) over a recording stand-in for the
 * node's WebSocket: what a client's upload becomes on the link, what a node's answer becomes for
 * the client, and what happens to each frame's memory once the socket has taken it.
 */
import assert from "node:assert/strict";
import { decodeRequestFrame, encodeFrame } from "../link/frames.ts";
import { MAX_DATA_BYTES, PROTOCOL_VERSION, type ResponseHead } from "../link/messages.ts";
import { RouterSlot } from "../router/slot_link.ts";

/** A node's hello; the request id of every exchange here. */
const _HELLO = {
  t: "hello" as const,
  node_id: "n1",
  server_instance_id: "i1",
  slot_id: "s1",
  protocol_version: PROTOCOL_VERSION,
};
const id = "0f6c2b4e-1111-4222-8333-444455556666";

/** A socket that keeps a copy of everything sent (a real one copies the bytes in `send`). */
class _RecordingSocket {
  readonly copies: (string | Uint8Array)[] = [];
  readonly originals: Uint8Array[] = [];
  send(data: string | Uint8Array): void {
    if (typeof data === "string") return void this.copies.push(data);
    this.copies.push(data.slice());
    this.originals.push(data);
  }
  close(): void {}
}

Deno.test("router slot: upload frames carry the body in order, and each frame's memory goes back once sent", async () => {
  const socket = new _RecordingSocket();
  const slot = new RouterSlot(
    socket as unknown as WebSocket,
    _HELLO,
    () => {},
  );
  const body = new Uint8Array(MAX_DATA_BYTES + 1000).map((_, i) => i % 251);
  const exchange = slot.begin(id, [["content-type", "application/octet-stream"]], body.length);
  await exchange.upload.write(body);
  await exchange.upload.end();

  assert.ok(socket.copies.every((data) => typeof data !== "string"), "no text message");
  const frames = (socket.copies as Uint8Array[]).map((frame) => decodeRequestFrame(frame));
  assert.ok(frames.every((frame) => frame.requestId === id));
  // The head at once, alone (the body streams from the client), then the bytes, the end last.
  assert.deepEqual(frames.map((f) => [f.head !== null, f.bytes.length, f.end]), [
    [true, 0, false],
    [false, MAX_DATA_BYTES, false],
    [false, 1000, true],
  ]);
  assert.equal(frames[0].head?.content_length, body.length);
  assert.deepEqual(new Uint8Array([...frames[1].bytes, ...frames[2].bytes]), body);
  // Detached after the send: nothing waits for a garbage collection to give it back.
  for (const original of socket.originals) assert.equal(original.buffer.byteLength, 0);
});

Deno.test("router slot: a body at hand goes with its head and end in one frame", () => {
  const body = new Uint8Array(MAX_DATA_BYTES).fill(7);
  const socket = new _RecordingSocket();
  const slot = new RouterSlot(socket as unknown as WebSocket, _HELLO, () => {});
  const exchange = slot.begin(id, [["content-type", "x"]], body.length, body);
  assert.ok(exchange.upload.ended);
  assert.equal(exchange.upload.sentBytes, body.length);
  assert.equal(socket.copies.length, 1);
  const frame = decodeRequestFrame(socket.copies[0] as Uint8Array);
  assert.equal(frame.requestId, id);
  assert.deepEqual(frame.head, { headers: [["content-type", "x"]], content_length: body.length });
  assert.equal(frame.bytes.length, body.length);
  assert.ok(frame.end);
  assert.equal(slot.busy, true, "until the node's answer ends");
  // A slot whose connection is gone takes nothing: another slot may.
  slot.closedBySocket("gone");
  assert.throws(() => slot.begin(id, [], 1, new Uint8Array([1])), /tunnel_disconnected/);
});

Deno.test("router slot: an answer in one frame is complete when its head resolves; a streamed one later", async () => {
  const head: ResponseHead = { status: 200, headers: [["content-type", "application/json"]] };
  const answer = new TextEncoder().encode('{"status":"COMPLETED"}');

  const one = new RouterSlot(new _RecordingSocket() as unknown as WebSocket, _HELLO, () => {});
  const first = one.begin(id, [], 1, new Uint8Array([1]));
  one.receive(encodeFrame(id, head, answer, true).buffer);
  assert.deepEqual(await first.head, head);
  // Its bytes and end came with it: the body is complete, and the slot free again.
  assert.ok(first.body.ended);
  assert.deepEqual(await first.body.wholeIfWithin(MAX_DATA_BYTES), answer);
  await first.answered;
  assert.equal(one.busy, false);

  const streamed = new RouterSlot(new _RecordingSocket() as unknown as WebSocket, _HELLO, () => {});
  const second = streamed.begin(id, [], 1, new Uint8Array([1]));
  streamed.receive(encodeFrame(id, head, new Uint8Array(0), false).buffer);
  await second.head;
  assert.ok(!second.body.ended, "head alone: the answer is still to come");
  const whole = second.body.wholeIfWithin(MAX_DATA_BYTES);
  streamed.receive(encodeFrame(id, null, answer, false).buffer);
  assert.equal(streamed.busy, true);
  streamed.receive(encodeFrame(id, null, new Uint8Array(0), true).buffer);
  assert.deepEqual(await whole, answer);
  assert.equal(streamed.busy, false);
});

Deno.test("router slot: anything out of turn from the node fails the exchange with invalid_response", async () => {
  const head: ResponseHead = { status: 200, headers: [] };
  const cases: [string, (slot: RouterSlot) => void, RegExp][] = [
    ["a second head", (slot) => {
      slot.receive(encodeFrame(id, head, new Uint8Array(0), false).buffer);
      slot.receive(encodeFrame(id, head, new Uint8Array(0), true).buffer);
    }, /a second response head/],
    ["bytes before the head", (slot) => {
      slot.receive(encodeFrame(id, null, new Uint8Array(1), false).buffer);
    }, /before the response head/],
    ["another request's frame", (slot) => {
      slot.receive(encodeFrame(crypto.randomUUID(), head, new Uint8Array(0), true).buffer);
    }, /another request/],
    ["a frame after the end", (slot) => {
      slot.receive(encodeFrame(id, head, new Uint8Array(0), false).buffer);
      slot.receive(encodeFrame(id, null, new Uint8Array(1), true).buffer);
      slot.receive(encodeFrame(id, null, new Uint8Array(1), false).buffer);
    }, /after the end/],
    ["a text message other than credit", (slot) => {
      slot.receive(JSON.stringify({ t: "ack" }));
    }, /'ack' from a node/],
  ];
  for (const [name, misbehave, reason] of cases) {
    const slot = new RouterSlot(new _RecordingSocket() as unknown as WebSocket, _HELLO, () => {});
    // A body that streams: the exchange stays open after the node's end.
    const exchange = slot.begin(id, [], null);
    misbehave(slot);
    // The upload fails with the reason (the answer may have ended before the violation).
    await assert.rejects(exchange.upload.write(new Uint8Array(1)), (error: Error) => {
      assert.match(error.message, /^invalid_response: /, name);
      assert.match(error.message, reason, name);
      return true;
    });
    assert.ok(slot.isClosed, name);
  }
});

/**
 * The Router's side of one slot link (router/slot_link.ts) over a recording stand-in for the
 * node's WebSocket: what a client's upload becomes on the link, and what happens to each data
 * frame's memory once the socket has taken it.
 */
import assert from "node:assert/strict";
import {
  decodeDataFrame,
  decodeWholeFrame,
  encodeDataFrame,
  encodeWholeFrame,
  MAX_DATA_BYTES,
} from "../link/messages.ts";
import { RouterSlot } from "../router/slot_link.ts";

/** A node's hello, without whole frames; the request id of every exchange here. */
const _HELLO = {
  t: "hello" as const,
  node_id: "n1",
  server_instance_id: "i1",
  slot_id: "s1",
  protocol_version: 1,
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

  const frames = socket.copies.filter((data) => typeof data !== "string") as Uint8Array[];
  assert.equal(frames.length, 2);
  const payload = frames.map((frame) => decodeDataFrame(frame)).map((frame) => {
    assert.equal(frame.requestId, id);
    return frame.bytes;
  });
  assert.deepEqual([payload[0].length, payload[1].length], [MAX_DATA_BYTES, 1000]);
  assert.deepEqual(new Uint8Array([...payload[0], ...payload[1]]), body);
  const messages = socket.copies.filter((data) => typeof data === "string") as string[];
  assert.deepEqual(messages.map((text) => JSON.parse(text).t), ["request_head", "end"]);
  // Detached after the send: nothing waits for a garbage collection to give it back.
  for (const original of socket.originals) assert.equal(original.buffer.byteLength, 0);
});

Deno.test("router slot: a whole frame only to a node that offered them, and only if it fits one message", () => {
  const body = new Uint8Array(MAX_DATA_BYTES).fill(7);

  const plain = new RouterSlot(new _RecordingSocket() as unknown as WebSocket, _HELLO, () => {});
  assert.equal(plain.takesWhole, false);
  assert.throws(() => plain.beginWhole(id, [], body.length, body), /did not offer whole frames/);

  const socket = new _RecordingSocket();
  const slot = new RouterSlot(socket as unknown as WebSocket, { ..._HELLO, whole: true }, () => {});
  assert.equal(slot.takesWhole, true);
  // Headers whose JSON (every quote escaped) and a full body exceed what a node takes at once.
  const huge: [string, string][] = [["x-quotes", '"'.repeat(400_000)]];
  assert.equal(slot.beginWhole(id, huge, body.length, body), null);
  assert.equal(socket.copies.length, 0, "nothing sent");
  assert.equal(slot.busy, false, "the slot is still free");
  const exchange = slot.beginWhole(id, [["content-type", "x"]], body.length, body)!;
  assert.ok(exchange.upload.ended);
  assert.equal(exchange.upload.sentBytes, body.length);
  assert.equal(socket.copies.length, 1);
  const frame = decodeWholeFrame(socket.copies[0] as Uint8Array);
  assert.equal(frame.head.request_id, id);
  assert.equal(frame.bytes.length, body.length);
  assert.ok(frame.head.t === "request_head" && frame.head.content_length === body.length);
});

Deno.test("router slot: an answer in one whole frame is complete once its head resolves; a streamed one is not", async () => {
  const hello = { ..._HELLO, whole: true as const };
  const head = {
    t: "response_head" as const,
    request_id: id,
    status: 200,
    headers: [["content-type", "application/json"]] as [string, string][],
  };
  const answer = new TextEncoder().encode('{"status":"COMPLETED"}');

  const whole = new RouterSlot(new _RecordingSocket() as unknown as WebSocket, hello, () => {});
  const first = whole.beginWhole(id, [], 1, new Uint8Array([1]))!;
  assert.equal(first.wholeBody, null, "nothing came yet");
  whole.receive(encodeWholeFrame(head, answer)!.buffer);
  await first.head;
  assert.deepEqual(first.wholeBody, answer);
  // The same bytes are the body's too, and the slot is free again.
  assert.deepEqual(await first.body.wholeIfWithin(MAX_DATA_BYTES), answer);
  assert.equal(whole.busy, false);

  const streamed = new RouterSlot(new _RecordingSocket() as unknown as WebSocket, hello, () => {});
  const second = streamed.beginWhole(id, [], 1, new Uint8Array([1]))!;
  streamed.receive(JSON.stringify(head));
  await second.head;
  assert.equal(second.wholeBody, null, "head alone: the answer is still to come");
  streamed.receive(encodeDataFrame(id, answer).buffer);
  streamed.receive(JSON.stringify({ t: "end", request_id: id }));
  assert.equal(second.wholeBody, null);
  assert.deepEqual(await second.body.wholeIfWithin(MAX_DATA_BYTES), answer);
});

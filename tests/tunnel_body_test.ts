/** Bodies through a node-link slot (http/tunnel_body.ts): framing, gathering, credit. */
import assert from "node:assert/strict";
import { BodyReceiver, BodySender, DATA_HEADER_BYTES } from "../http/tunnel_body.ts";
import { CREDIT_WINDOW, decodeDataFrame, MAX_DATA_BYTES } from "../protocol/node_link.ts";

const ID = "0f6c2b4e-1111-4222-8333-444455556666";

function _pattern(length: number, seed: number): Uint8Array {
  return Uint8Array.from({ length }, (_, i) => (i * 7 + seed) & 0xff);
}

Deno.test("tunnel body: writes of any size arrive whole, in frames of at most 256 KiB", async () => {
  const frames: Uint8Array[] = [];
  const sender = new BodySender(ID, (frame) => frames.push(frame.slice()), () => {});
  const writes = [_pattern(10, 1), _pattern(20_000, 2), _pattern(300_000, 3), _pattern(5, 4)];
  // Two frames: within the initial credit window.
  for (const chunk of writes) await sender.write(chunk);
  await sender.end();
  const payloads = frames.map((frame) => decodeDataFrame(frame));
  for (const payload of payloads) {
    assert.equal(payload.requestId, ID);
    assert.ok(payload.bytes.length <= MAX_DATA_BYTES);
  }
  assert.deepEqual(payloads.map((p) => p.bytes.length), [MAX_DATA_BYTES, 320_015 - MAX_DATA_BYTES]);
  const joined = new Uint8Array(payloads.reduce((n, p) => n + p.bytes.length, 0));
  let at = 0;
  for (const p of payloads) (joined.set(p.bytes, at), at += p.bytes.length);
  const expected = new Uint8Array(320_015);
  at = 0;
  for (const w of writes) (expected.set(w, at), at += w.length);
  assert.deepEqual(joined, expected);
  assert.equal(sender.sentBytes, 320_015);
});

Deno.test("tunnel body: a small answer is one small frame", async () => {
  const frames: Uint8Array[] = [];
  const sender = new BodySender(ID, (frame) => frames.push(frame), () => {});
  await sender.write(_pattern(100, 0));
  await sender.write(_pattern(200, 1));
  await sender.end();
  assert.equal(frames.length, 1);
  assert.equal(frames[0].length, DATA_HEADER_BYTES + 300);
  // Staged in a buffer sized to the answer, not a full 256 KiB frame.
  assert.ok(frames[0].buffer.byteLength <= DATA_HEADER_BYTES + 16384);
});

Deno.test("tunnel body: newFrame is sized to the capacity asked, at most 256 KiB", () => {
  const sender = new BodySender(ID, () => {}, () => {});
  assert.equal(sender.newFrame(1).length, DATA_HEADER_BYTES + 1);
  assert.equal(sender.newFrame(10 << 20).length, DATA_HEADER_BYTES + MAX_DATA_BYTES);
  assert.equal(decodeDataFrame(sender.newFrame(0)).requestId, ID);
});

Deno.test("tunnel body: the receiver refuses frames beyond its credit", () => {
  const receiver = new BodyReceiver(() => {});
  for (let i = 0; i < CREDIT_WINDOW; i++) receiver.push(new Uint8Array([i]));
  assert.throws(() => receiver.push(new Uint8Array([0])), /without credit/);
});

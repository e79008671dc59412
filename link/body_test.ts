/**
 * Bodies through a node-link slot (link/body_sender.ts, link/body_receiver.ts): framing with the
 * head and the end, gathering, credit.
 */
import assert from "node:assert/strict";
import { BodyReceiver } from "./body_receiver.ts";
import { BodySender } from "./body_sender.ts";
import { decodeResponseFrame } from "./frames.ts";
import { CREDIT_WINDOW, MAX_DATA_BYTES, type ResponseHead } from "./messages.ts";

const ID = "0f6c2b4e-1111-4222-8333-444455556666";
const HEAD: ResponseHead = { status: 200, headers: [["content-type", "application/json"]] };
/** A frame without a head: flags and the request id. */
const PLAIN_HEADER = 37;

/** A frame as `head+bytes+end`, `bytes+end`, `head+0`, ... */
function _shape(frame: Uint8Array): string {
  const { head, bytes, end } = decodeResponseFrame(frame);
  return `${head ? "head+" : ""}${bytes.length}${end ? "+end" : ""}`;
}

function _pattern(length: number, seed: number): Uint8Array {
  return Uint8Array.from({ length }, (_, i) => (i * 7 + seed) & 0xff);
}

Deno.test("body: writes of any size arrive whole, the head with the first frame, the end with the last", async () => {
  const frames: Uint8Array[] = [];
  const sender = new BodySender(ID, HEAD, (frame) => frames.push(frame.slice()));
  const writes = [_pattern(10, 1), _pattern(20_000, 2), _pattern(300_000, 3), _pattern(5, 4)];
  // Two frames: within the initial credit window.
  for (const chunk of writes) await sender.write(chunk);
  await sender.end();
  const payloads = frames.map((frame) => decodeResponseFrame(frame));
  for (const payload of payloads) {
    assert.equal(payload.requestId, ID);
    assert.ok(payload.bytes.length <= MAX_DATA_BYTES);
  }
  assert.deepEqual(payloads[0].head, HEAD);
  assert.deepEqual(frames.map(_shape), [
    `head+${MAX_DATA_BYTES}`,
    `${320_015 - MAX_DATA_BYTES}+end`,
  ]);
  const joined = new Uint8Array(payloads.reduce((n, p) => n + p.bytes.length, 0));
  let at = 0;
  for (const p of payloads) (joined.set(p.bytes, at), at += p.bytes.length);
  const expected = new Uint8Array(320_015);
  at = 0;
  for (const w of writes) (expected.set(w, at), at += w.length);
  assert.deepEqual(joined, expected);
  assert.equal(sender.sentBytes, 320_015);
});

Deno.test("body: a small answer is one small frame with its head and end", async () => {
  const frames: Uint8Array[] = [];
  const sender = new BodySender(ID, HEAD, (frame) => frames.push(frame));
  await sender.write(_pattern(100, 0));
  await sender.write(_pattern(200, 1));
  await sender.end();
  assert.deepEqual(frames.map(_shape), ["head+300+end"]);
  const { bytes } = decodeResponseFrame(frames[0]);
  assert.deepEqual(bytes, new Uint8Array([..._pattern(100, 0), ..._pattern(200, 1)]));
  // Staged in a buffer sized to the answer, not a full 256 KiB frame.
  assert.ok(frames[0].buffer.byteLength <= frames[0].length - 300 + 16384);
});

Deno.test("body: a complete body is one frame sent at once; only before anything else", async () => {
  const frames: Uint8Array[] = [];
  const sender = new BodySender(ID, HEAD, (frame) => frames.push(frame));
  sender.sendComplete(_pattern(5, 0));
  assert.deepEqual(frames.map(_shape), ["head+5+end"]);
  assert.ok(sender.ended);
  assert.equal(sender.sentBytes, 5);
  assert.throws(() => sender.sendComplete(_pattern(1, 0)), /frame by frame/);
  await sender.end(); // already ended: nothing more
  assert.equal(frames.length, 1);

  const empty = new BodySender(ID, HEAD, (frame) => frames.push(frame));
  empty.sendComplete(new Uint8Array(0));
  assert.equal(_shape(frames[1]), "head+0+end");
  const started = new BodySender(ID, HEAD, () => {});
  await started.write(_pattern(3, 0));
  assert.throws(() => started.sendComplete(_pattern(3, 0)), /frame by frame/);
  const tooLarge = new BodySender(ID, HEAD, () => {});
  assert.throws(() => tooLarge.sendComplete(new Uint8Array(MAX_DATA_BYTES + 1)), RangeError);
  // A slot that failed while the frame was sent: the failure is thrown.
  const failing: BodySender = new BodySender(ID, HEAD, () => failing.fail(new Error("gone")));
  assert.throws(() => failing.sendComplete(_pattern(3, 0)), /gone/);
});

Deno.test("body: the head alone, then frames without it; an end with nothing gathered goes alone", async () => {
  const frames: Uint8Array[] = [];
  const sender = new BodySender(ID, HEAD, (frame) => frames.push(frame.slice()));
  sender.sendHead();
  sender.sendHead(); // once
  await sender.write(_pattern(10, 0));
  await sender.flush();
  await sender.flush(); // nothing gathered, the head gone: nothing
  await sender.end();
  assert.deepEqual(frames.map(_shape), ["head+0", "10", "0+end"]);
  assert.equal(frames[2].length, PLAIN_HEADER);
  // A body with no bytes: its head and end in one frame.
  const none: Uint8Array[] = [];
  await new BodySender(ID, HEAD, (frame) => none.push(frame)).end();
  assert.deepEqual(none.map(_shape), ["head+0+end"]);
});

Deno.test("body: payload buffers are sized to the capacity asked, at most 256 KiB, after the head went", async () => {
  const frames: Uint8Array[] = [];
  const sender = new BodySender(ID, HEAD, (frame) => frames.push(frame.slice()));
  assert.equal(sender.payloadBuffer(1).length, 1);
  assert.deepEqual(frames.map(_shape), ["head+0"], "the head went before the first buffer");
  assert.equal(sender.payloadBuffer(10 << 20).length, MAX_DATA_BYTES);
  const payload = sender.payloadBuffer(8);
  assert.equal(payload.byteOffset, PLAIN_HEADER);
  payload.set(_pattern(8, 5));
  await sender.sendPayload(payload.subarray(0, 6));
  await sender.end();
  assert.deepEqual(frames.map(_shape), ["head+0", "6", "0+end"]);
  assert.deepEqual(decodeResponseFrame(frames[1]).bytes, _pattern(8, 5).subarray(0, 6));
  assert.equal(sender.sentBytes, 6);
});

Deno.test("body: only frames with bytes take credit", async () => {
  const frames: Uint8Array[] = [];
  const sender = new BodySender(ID, HEAD, (frame) => frames.push(frame));
  sender.sendHead();
  for (let i = 0; i < CREDIT_WINDOW; i++) await sender.write(new Uint8Array(MAX_DATA_BYTES));
  assert.equal(frames.length, 1 + CREDIT_WINDOW);
  // No credit left: more bytes wait for it, an end alone does not.
  let wrote = false;
  const blocked = sender.write(new Uint8Array(MAX_DATA_BYTES)).then(() => (wrote = true));
  await Promise.resolve();
  assert.equal(wrote, false);
  assert.equal(frames.length, 1 + CREDIT_WINDOW);
  sender.credit(1);
  await blocked;
  assert.equal(frames.length, 2 + CREDIT_WINDOW);
  const ended = new BodySender(ID, HEAD, (frame) => frames.push(frame));
  for (let i = 0; i < CREDIT_WINDOW; i++) await ended.write(new Uint8Array(MAX_DATA_BYTES));
  await ended.end();
  assert.equal(_shape(frames.at(-1)!), "0+end");
});

Deno.test("body: the receiver refuses frames beyond its credit, and frames after the end", () => {
  const receiver = new BodyReceiver(() => {});
  for (let i = 0; i < CREDIT_WINDOW; i++) receiver.push(new Uint8Array([i]));
  assert.throws(() => receiver.push(new Uint8Array([0])), /without credit/);
  const ended = new BodyReceiver(() => {});
  ended.receive(new Uint8Array([1]), true);
  assert.throws(() => ended.receive(new Uint8Array(0), false), /after the end/);
  assert.throws(() => ended.receive(new Uint8Array(0), true), /after the end/);
  assert.throws(() => ended.receive(new Uint8Array([1]), false), /after the end/);
});

Deno.test("body: a body taken whole, without a stream: frames before and after, credit", async () => {
  const grants: number[] = [];
  const receiver = new BodyReceiver((n) => grants.push(n));
  receiver.push(_pattern(3, 0));
  const whole = receiver.whole(1000);
  // Frames are taken as they come: credit goes back as a stream's reader would return it.
  for (let i = 1; i < CREDIT_WINDOW; i++) receiver.push(_pattern(3, i));
  assert.deepEqual(grants, [CREDIT_WINDOW / 2, CREDIT_WINDOW / 2]);
  receiver.end();
  const body = await whole;
  assert.equal(body.length, 3 * CREDIT_WINDOW);
  assert.deepEqual(body.subarray(3, 6), _pattern(3, 1));
  assert.ok(receiver.ended && !receiver.cancelled);
  assert.throws(() => receiver.stream, /taken whole/);
});

Deno.test("body: one frame taken whole is that frame's bytes; none is an empty body", async () => {
  const one = new BodyReceiver(() => {});
  const frame = _pattern(10, 3);
  one.push(frame);
  one.end();
  assert.equal(await one.whole(10), frame);
  const none = new BodyReceiver(() => {});
  const empty = none.whole(0);
  none.end();
  assert.equal((await empty).length, 0);
});

Deno.test("body: past its limit a whole body resolves at once and the rest is dropped", async () => {
  const receiver = new BodyReceiver(() => {});
  let cancelled = 0;
  receiver.onCancel = () => cancelled++;
  const whole = receiver.whole(4);
  receiver.push(_pattern(3, 0));
  receiver.push(_pattern(3, 1));
  // As the pipeline's reader of a small body: what came, the frame that went past included.
  assert.equal((await whole).length, 6);
  assert.ok(receiver.cancelled);
  assert.equal(cancelled, 1);
  receiver.push(_pattern(3, 2));
  receiver.end();
  assert.equal(receiver.receivedBytes, 9);
});

Deno.test("body: a whole body the slot fails under rejects with the slot's error", async () => {
  const early = new BodyReceiver(() => {});
  early.push(_pattern(3, 0));
  early.fail(new Error("tunnel: client_disconnected"));
  await assert.rejects(early.whole(10), /^Error: tunnel: client_disconnected$/);
  const late = new BodyReceiver(() => {});
  const whole = late.whole(10);
  late.push(_pattern(3, 0));
  late.fail(new Error("tunnel: gone"));
  await assert.rejects(whole, /tunnel: gone/);
  // After the end, a failure changes nothing.
  const ended = new BodyReceiver(() => {});
  ended.push(_pattern(2, 0));
  ended.end();
  ended.fail(new Error("late"));
  assert.equal((await ended.whole(2)).length, 2);
});

Deno.test("body: a discarded body drops what comes and returns no credit; one reader", async () => {
  const grants: number[] = [];
  const receiver = new BodyReceiver((n) => grants.push(n));
  const whole = receiver.whole(10);
  let settled = false;
  whole.then(() => (settled = true), () => (settled = true));
  receiver.discard();
  for (let i = 0; i < CREDIT_WINDOW; i++) receiver.push(_pattern(1, i));
  receiver.fail(new Error("gone"));
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.ok(receiver.cancelled && !settled);
  assert.deepEqual(grants, []);
  assert.throws(() => receiver.whole(10), /already has a reader/);
  const streamed = new BodyReceiver(() => {});
  streamed.stream.getReader();
  assert.throws(() => streamed.whole(10), /already has a reader/);
});

Deno.test("body: a body that turns out small is taken whole at its end; none is an empty body", async () => {
  const receiver = new BodyReceiver(() => {});
  receiver.push(_pattern(3, 0));
  const whole = receiver.wholeIfWithin(6);
  receiver.push(_pattern(3, 1));
  receiver.end();
  assert.deepEqual(await whole, new Uint8Array([..._pattern(3, 0), ..._pattern(3, 1)]));
  const none = new BodyReceiver(() => {});
  const empty = none.wholeIfWithin(6);
  none.end();
  assert.equal((await empty)?.length, 0);
});

Deno.test("body: past its limit a body is not taken whole and its stream delivers every frame", async () => {
  const grants: number[] = [];
  const receiver = new BodyReceiver((n) => grants.push(n));
  const whole = receiver.wholeIfWithin(4);
  receiver.push(_pattern(3, 0));
  receiver.push(_pattern(3, 1));
  assert.equal(await whole, null);
  assert.ok(!receiver.cancelled);
  receiver.push(_pattern(3, 2));
  receiver.end();
  const body = new Uint8Array(await new Response(receiver.stream).arrayBuffer());
  assert.deepEqual(body, new Uint8Array([..._pattern(3, 0), ..._pattern(3, 1), ..._pattern(3, 2)]));
  assert.deepEqual(grants, []); // three frames read: under half a window
});

Deno.test("body: a small body sent in more frames than the window holds goes to the stream (no deadlock)", async () => {
  const grants: number[] = [];
  const receiver = new BodyReceiver((n) => grants.push(n));
  const whole = receiver.wholeIfWithin(1 << 20);
  for (let i = 0; i < CREDIT_WINDOW; i++) receiver.push(_pattern(1, i));
  // The sender has no credit left: waiting for more bytes or the end would wait for good.
  assert.equal(await whole, null);
  const reader = receiver.stream.getReader();
  for (let i = 0; i < CREDIT_WINDOW / 2; i++) {
    assert.deepEqual((await reader.read()).value, _pattern(1, i));
  }
  assert.deepEqual(grants, [CREDIT_WINDOW / 2]);
  reader.releaseLock();
});

Deno.test("body: a body that may be small rejects when the slot fails first; one reader", async () => {
  const receiver = new BodyReceiver(() => {});
  const whole = receiver.wholeIfWithin(10);
  receiver.push(_pattern(3, 0));
  receiver.fail(new Error("tunnel: gone"));
  await assert.rejects(whole, /tunnel: gone/);
  const taken = new BodyReceiver(() => {});
  taken.wholeIfWithin(10);
  assert.throws(() => taken.wholeIfWithin(10), /already has a reader/);
  assert.throws(() => taken.whole(10), /already has a reader/);
});

Deno.test("body: with sendParts, full frames of a large chunk go as header + slice of it, the rest staged", async () => {
  const sent: { kind: "frame" | "parts"; bytes: Uint8Array; parts?: readonly Uint8Array[] }[] = [];
  const sender = new BodySender(
    ID,
    HEAD,
    (frame) => sent.push({ kind: "frame", bytes: frame.slice() }),
    (parts) => {
      const joined = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
      let at = 0;
      for (const part of parts) (joined.set(part, at), at += part.length);
      sent.push({ kind: "parts", bytes: joined, parts });
    },
  );
  // A small tail first (staged), then a large chunk: the stage fills up to a full frame from the
  // chunk, then whole frames go as parts, and the chunk's tail is staged again.
  const writes = [_pattern(100, 1), _pattern(3 * MAX_DATA_BYTES + 7, 2), _pattern(9, 3)];
  for (const chunk of writes) await sender.write(chunk);
  await sender.end();
  assert.deepEqual(sent.map((s) => s.kind), ["frame", "parts", "parts", "frame"]);
  const large = writes[1];
  for (const s of sent.filter((s) => s.kind === "parts")) {
    assert.equal(s.parts!.length, 2);
    assert.equal(s.parts![0].length, PLAIN_HEADER);
    assert.equal(s.parts![1].length, MAX_DATA_BYTES);
    assert.equal(s.parts![1].buffer, large.buffer, "a slice of the written chunk, not a copy");
  }
  const payloads = sent.map((s) => decodeResponseFrame(s.bytes));
  assert.ok(payloads.every((p) => p.requestId === ID));
  assert.deepEqual(sent.map((s) => _shape(s.bytes)), [
    `head+${MAX_DATA_BYTES}`,
    `${MAX_DATA_BYTES}`,
    `${MAX_DATA_BYTES}`,
    `${100 + 7 + 9}+end`,
  ]);
  assert.deepEqual(payloads.map((p) => p.bytes.length), [
    MAX_DATA_BYTES,
    MAX_DATA_BYTES,
    MAX_DATA_BYTES,
    100 + 7 + 9,
  ]);
  const joined = new Uint8Array(payloads.reduce((n, p) => n + p.bytes.length, 0));
  let at = 0;
  for (const p of payloads) (joined.set(p.bytes, at), at += p.bytes.length);
  const expected = new Uint8Array(joined.length);
  at = 0;
  for (const w of writes) (expected.set(w, at), at += w.length);
  assert.deepEqual(joined, expected);
  assert.equal(sender.sentBytes, expected.length);
});

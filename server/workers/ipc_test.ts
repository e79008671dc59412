// Worker frames over a byte stream (server/workers/ipc.ts): length-prefixed JSON, however the pipe
// splits them.
import assert from "node:assert/strict";
import { encodeFrame, type Frame, MAX_FRAME_BYTES, readFrames } from "./ipc.ts";

async function frames(chunks: Uint8Array[]): Promise<Frame[]> {
  const out: Frame[] = [];
  for await (const frame of readFrames(ReadableStream.from(chunks))) out.push(frame);
  return out;
}

function split(bytes: Uint8Array, sizes: number[]): Uint8Array[] {
  const chunks: Uint8Array[] = [];
  let at = 0;
  for (let i = 0; at < bytes.length; i++) {
    const size = sizes[i % sizes.length];
    chunks.push(bytes.slice(at, at + size));
    at += size;
  }
  return chunks;
}

Deno.test("ipc: frames come out whole however the stream splits them", async () => {
  const sent: Frame[] = [
    { t: "ready", c: 1 },
    { t: "outcome", c: 1, text: "x".repeat(100_000), nested: { a: [1, 2, 3] } },
    { t: "exited", c: 1, code: 0 },
  ];
  const bytes = new Uint8Array(sent.map((f) => encodeFrame(f)).flatMap((f) => [...f]));
  for (const sizes of [[bytes.length], [1], [3, 1, 7], [4], [5000, 2], [65536]]) {
    assert.deepEqual(await frames(split(bytes, sizes)), sent, `chunks of ${sizes}`);
  }
  // A stream that ends inside a frame ends the frames (the worker died mid-write).
  assert.deepEqual(await frames([bytes.subarray(0, bytes.length - 1)]), sent.slice(0, 2));
});

Deno.test("ipc: a large frame in many small chunks, and the limits", async () => {
  const big: Frame = { t: "outcome", blob: "y".repeat(8 << 20) };
  assert.deepEqual(await frames(split(encodeFrame(big), [65536])), [big]);
  const tooLarge = new Uint8Array(4);
  new DataView(tooLarge.buffer).setUint32(0, MAX_FRAME_BYTES + 1);
  await assert.rejects(frames([tooLarge]), /worker frame too large/);
  const notObject = encodeFrame({ t: "x" });
  const body = new TextEncoder().encode('"just a string"');
  const framed = new Uint8Array(4 + body.length);
  new DataView(framed.buffer).setUint32(0, body.length);
  framed.set(body, 4);
  await assert.rejects(frames([notObject, framed]), /not an object with a string 't'/);
});

Deno.test("ipc: a run's program travels as the frame's tail, after a NUL, not escaped", () => {
  const program = new TextEncoder().encode('{"instructions":[{"source":"print(\\"é\\")\\n"}]}');
  const bytes = encodeFrame({ t: "run", c: 1, req: { request_id: "r" } }, program);
  const head = new TextEncoder().encode('{"t":"run","c":1,"req":{"request_id":"r"}}');
  assert.equal(new DataView(bytes.buffer).getUint32(0), head.length + 1 + program.length);
  assert.deepEqual(bytes.subarray(4, 4 + head.length), head);
  assert.equal(bytes[4 + head.length], 0);
  assert.deepEqual(bytes.subarray(5 + head.length), program);
});

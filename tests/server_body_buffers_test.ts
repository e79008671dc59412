// Reused receive buffers for large bodies (server/body_buffers.ts).
import assert from "node:assert/strict";
import { BodyBuffers } from "../server/body_buffers.ts";

Deno.test("body buffers: reused smallest-fit, largest kept, oversized and foreign ones dropped", () => {
  const pool = new BodyBuffers(2, 1000);
  const a = pool.take(100);
  assert.ok(a.buffer instanceof SharedArrayBuffer);
  assert.equal(a.length, 100);
  a[0] = 7;
  pool.give(a);
  const again = pool.take(50); // the same memory, a view of the size asked for
  assert.equal(again.buffer, a.buffer);
  assert.equal(again.length, 50);
  assert.equal(again[0], 7);
  const bigger = pool.take(200); // nothing idle fits: a new buffer
  assert.notEqual(bigger.buffer, a.buffer);
  pool.give(again);
  pool.give(bigger);
  pool.give(pool.take(300)); // three idle buffers: the smallest goes
  assert.equal(pool.idle, 2);
  assert.equal(pool.take(100).buffer.byteLength, 200); // smallest fit among those kept
  pool.give(new Uint8Array(new SharedArrayBuffer(5000))); // over maxBytes
  pool.give(new Uint8Array(10)); // not shared
  assert.equal(pool.idle, 1);
  pool.clear();
  assert.equal(pool.idle, 0);
});

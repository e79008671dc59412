// Reused receive buffers for large bodies (http/body_buffers.ts).
import assert from "node:assert/strict";
import { BodyBuffers } from "./body_buffers.ts";

Deno.test("body buffers: reused smallest-fit, largest kept, oversized and detached ones dropped", () => {
  const pool = new BodyBuffers(2, 1000, (size) => new ArrayBuffer(size));
  const a = pool.take(100);
  assert.equal(a.byteLength, 100);
  new Uint8Array(a)[0] = 7;
  pool.give(a);
  const again = pool.take(50); // the same memory (contents kept), at least the size asked for
  assert.equal(again, a);
  assert.equal(new Uint8Array(again)[0], 7);
  const bigger = pool.take(200); // nothing idle fits: a new buffer
  assert.notEqual(bigger, a);
  pool.give(again);
  pool.give(bigger);
  pool.give(pool.take(300)); // three idle buffers: the smallest goes
  assert.equal(pool.idle, 2);
  assert.equal(pool.take(100).byteLength, 200); // smallest fit among those kept
  pool.give(new ArrayBuffer(5000)); // over maxBytes
  const moved = new ArrayBuffer(10);
  moved.transfer(); // detached: its memory belongs to someone else now
  pool.give(moved);
  assert.equal(pool.idle, 1);
  pool.clear();
  assert.equal(pool.idle, 0);
});

Deno.test("body buffers: onUse hears every take and give", () => {
  let uses = 0;
  const pool = new BodyBuffers(1, 1000, (size) => new ArrayBuffer(size), { onUse: () => uses++ });
  const a = pool.take(100);
  const b = pool.take(100);
  assert.equal(uses, 2);
  pool.give(a);
  pool.give(b); // not kept (one idle at most), still a use
  pool.give(new ArrayBuffer(5000)); // oversized, dropped, still a use
  assert.equal(uses, 5);
  assert.equal(pool.idle, 1);
  pool.clear();
  assert.equal(pool.idle, 0);
});

// The moment a server gives the memory of large bodies back (http/idle_release.ts): a while
// after the last use, once nothing is in flight, once per run of uses.
import assert from "node:assert/strict";
import { IdleRelease } from "./idle_release.ts";
import { BodyBuffers } from "./body_buffers.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

Deno.test("idle release: due afterMs after the last touch; a touch postpones it; once per run", async () => {
  let released = 0;
  const idle = new IdleRelease({ afterMs: 400, release: () => released++ });
  try {
    await sleep(500);
    assert.equal(released, 0, "released without a touch");
    idle.touch();
    assert.equal(idle.pending, true);
    await sleep(300);
    idle.touch(); // the 400 ms count from here
    await sleep(250); // past 400 ms from the first touch
    assert.equal(released, 0, "a touch did not postpone the release");
    await sleep(500);
    assert.equal(released, 1, "not released 400 ms after the last touch");
    assert.equal(idle.pending, false);
    await sleep(500);
    assert.equal(released, 1, "released again without a touch");
    idle.touch(); // a new run of uses: one more release
    await sleep(800);
    assert.equal(released, 2);
  } finally {
    idle.close();
  }
});

Deno.test("idle release: a due release waits while busy, then runs", async () => {
  let released = 0;
  let busy = true;
  const idle = new IdleRelease({
    afterMs: 100,
    retryMs: 50,
    busy: () => busy,
    release: () => released++,
  });
  try {
    idle.touch();
    await sleep(300);
    assert.equal(released, 0, "released while busy");
    assert.equal(idle.pending, true);
    busy = false;
    await sleep(400);
    assert.equal(released, 1, "not released once idle");
  } finally {
    idle.close();
  }
});

Deno.test("idle release: close stops a pending release", async () => {
  let released = 0;
  const idle = new IdleRelease({ afterMs: 50, release: () => released++ });
  idle.touch();
  idle.close();
  assert.equal(idle.pending, false);
  await sleep(150);
  assert.equal(released, 0);
});

Deno.test("idle release: body buffers report every take and give", async () => {
  let released = 0;
  const idle = new IdleRelease({ afterMs: 400, release: () => released++ });
  const pool = new BodyBuffers(1, 1000, (size) => new ArrayBuffer(size), {
    onUse: () => idle.touch(),
  });
  try {
    const buffer = pool.take(100);
    await sleep(300);
    pool.give(buffer); // the 400 ms count from here
    await sleep(250); // past 400 ms from the take
    assert.equal(released, 0, "a give did not postpone the release");
    await sleep(500);
    assert.equal(released, 1);
  } finally {
    idle.close();
  }
});

Deno.test("idle_release: IdleRelease", async () => {
  let released = 0;
  const idle = new IdleRelease({ afterMs: 10, release: () => released++ });
  idle.touch();
  await new Promise((resolve) => setTimeout(resolve, 50));
  if (released !== 1 || idle.pending) throw new Error();
  idle.close();
});

/** The lease arbiter: FIFO, GPU sets, no starvation of sets, history, initialization gate. */
import assert from "node:assert/strict";
import { GpuLeases, type LeaseHolder } from "../server/lease.ts";

const h = (id: string): LeaseHolder => ({ id });
const tick = () => new Promise((r) => setTimeout(r, 0));

Deno.test("lease: one holder per GPU, FIFO hand-off", async () => {
  const leases = new GpuLeases([0]);
  const order: string[] = [];
  const a = h("a"), b = h("b"), c = h("c");
  await leases.acquire(a, [0]);
  const pb = leases.acquire(b, [0]).then(() => order.push("b"));
  const pc = leases.acquire(c, [0]).then(() => order.push("c"));
  await tick();
  assert.deepEqual(order, []);
  assert.equal(leases.waiting, 2);
  leases.release(a);
  await pb;
  assert.deepEqual(order, ["b"]);
  leases.release(b);
  await pc;
  assert.deepEqual(order, ["b", "c"]);
  assert.deepEqual(leases.heldBy(c), [0]);
});

Deno.test("lease: a holder re-acquiring what it holds gets it at once", async () => {
  const leases = new GpuLeases([0]);
  const a = h("a");
  await leases.acquire(a, [0]);
  assert.equal(await leases.acquire(a, [0]), 0);
});

Deno.test("lease: independent GPUs do not wait for each other", async () => {
  const leases = new GpuLeases([0, 1]);
  await leases.acquire(h("a"), [0]);
  const waited = await leases.acquire(h("b"), [1]);
  assert.ok(waited < 5);
});

Deno.test("lease: a waiting GPU set blocks later single-GPU waiters (no starvation)", async () => {
  const leases = new GpuLeases([0, 1, 2, 3]);
  const singles = [h("s0"), h("s1")];
  await leases.acquire(singles[0], [0]);
  await leases.acquire(singles[1], [1]);
  const set = h("set");
  let setGranted: number[] | null = null;
  const pSet = leases.acquireCount(set, 4).then((r) => (setGranted = r.gpus));
  // A later single-GPU request for a free GPU must not overtake the waiting set.
  let lateGranted = false;
  const late = h("late");
  const pLate = leases.acquire(late, [2]).then(() => (lateGranted = true));
  await tick();
  assert.equal(setGranted, null);
  assert.equal(lateGranted, false, "a waiting set never holds a subset; later waiters queue");
  leases.release(singles[0]);
  await tick();
  assert.equal(setGranted, null);
  leases.release(singles[1]);
  await pSet;
  assert.deepEqual(setGranted, [0, 1, 2, 3]);
  assert.equal(lateGranted, false);
  leases.release(set);
  await pLate;
  assert.equal(lateGranted, true);
});

Deno.test("lease: a pinned waiter blocks only its GPUs", async () => {
  const leases = new GpuLeases([0, 1]);
  const a = h("a"), b = h("b"), c = h("c");
  await leases.acquire(a, [0]);
  const pb = leases.acquire(b, [0]);
  await leases.acquire(c, [1]); // GPU 1 is not blocked by b's wait for GPU 0
  assert.deepEqual(leases.heldBy(c), [1]);
  leases.release(a);
  await pb;
  assert.deepEqual(leases.heldBy(b), [0]);
});

Deno.test("lease: a waiting pinned set blocks later waiters on any of its GPUs", async () => {
  const leases = new GpuLeases([0, 1]);
  const a = h("a"), b = h("b"), c = h("c");
  await leases.acquire(a, [0]);
  const pb = leases.acquire(b, [0, 1]);
  let cGranted = false;
  const pc = leases.acquire(c, [1]).then(() => (cGranted = true));
  await tick();
  assert.equal(cGranted, false, "GPU 1 is free but b waits for it first");
  leases.release(a);
  await pb;
  leases.release(b);
  await pc;
  assert.equal(cGranted, true);
});

Deno.test("lease: cancel rejects a pending waiter and lets the next one through", async () => {
  const leases = new GpuLeases([0]);
  const a = h("a"), b = h("b"), c = h("c");
  await leases.acquire(a, [0]);
  const pb = leases.acquire(b, [0]);
  const pc = leases.acquire(c, [0]);
  leases.cancel(b);
  await assert.rejects(pb);
  leases.release(a);
  await pc;
  assert.deepEqual(leases.heldBy(c), [0]);
});

Deno.test("lease: history attributes a moment to the holder of that time", async () => {
  const leases = new GpuLeases([0]);
  const a = h("req-a"), b = h("req-b");
  await leases.acquire(a, [0]);
  const during = performance.now();
  await new Promise((r) => setTimeout(r, 5));
  leases.release(a);
  await leases.acquire(b, [0]);
  assert.equal(leases.holderAt([0], during), "req-a");
  assert.equal(leases.holderAt([0], performance.now()), "req-b");
  assert.equal(leases.holderAt([0], performance.now(), b), null, "the asking holder is excluded");
});

Deno.test("lease: a worker initialization is never named as the interfered request", async () => {
  const leases = new GpuLeases([0]);
  const init: LeaseHolder = { id: "init:gpu0/w1", initialization: true };
  await leases.acquire(init, [0]);
  const during = performance.now();
  assert.equal(leases.holderAt([0], during), null, "current holder is an initialization");
  await new Promise((r) => setTimeout(r, 2));
  leases.release(init);
  assert.equal(leases.holderAt([0], during), null, "history entry is an initialization");
});

Deno.test("lease: a waiting request goes before a waiting worker initialization", async () => {
  const leases = new GpuLeases([0]);
  const a = h("request-a"), b = h("request-b");
  const init: LeaseHolder = { id: "init:gpu0/w1", initialization: true };
  await leases.acquire(a, [0]);
  const order: string[] = [];
  const pInit = leases.acquire(init, [0]).then(() => order.push("init"));
  await tick();
  const pB = leases.acquire(b, [0]).then(() => order.push("request-b"));
  leases.release(a);
  await pB;
  assert.deepEqual(order, ["request-b"], "the request queued later still goes first");
  leases.release(b);
  await pInit;
  assert.deepEqual(order, ["request-b", "init"]);
});

Deno.test("lease: an initialization proceeds when no request waits", async () => {
  const leases = new GpuLeases([0]);
  const a = h("a");
  await leases.acquire(a, [0]);
  const init: LeaseHolder = { id: "init:gpu0/w1", initialization: true };
  let done = false;
  const p = leases.acquire(init, [0]).then(() => (done = true));
  leases.release(a);
  await p;
  assert.equal(done, true);
});

Deno.test("lease: the initialization gate admits one initializer per GPU at a time", async () => {
  const leases = new GpuLeases([0]);
  const first = await leases.initializationGate([0]);
  let second = false;
  const p = leases.initializationGate([0]).then((open) => {
    second = true;
    return open;
  });
  await tick();
  assert.equal(second, false);
  first();
  (await p)();
  assert.equal(second, true);
});

Deno.test("lease: tryAcquire takes free GPUs at once, never past a waiting request", async () => {
  const leases = new GpuLeases([0, 1]);
  const a = h("a"), b = h("b"), c = h("c");
  assert.equal(leases.tryAcquire(a, [0]), true);
  assert.equal(leases.tryAcquire(a, [0]), true, "already held");
  assert.equal(leases.tryAcquire(b, [0]), false, "held by another");
  const pb = leases.acquire(b, [0]);
  await tick();
  assert.equal(leases.tryAcquire(c, [1]), false, "a request is waiting");
  leases.release(a);
  await pb;
  assert.equal(leases.tryAcquire(c, [1]), true);
  assert.deepEqual(leases.heldBy(c), [1]);
});

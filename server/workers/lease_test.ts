/** The lease arbiter: FIFO, GPU sets, no starvation of sets, history, initialization gate. */
import assert from "node:assert/strict";
import { GpuLeases, type LeaseHolder } from "./lease.ts";

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
  const a = h("a"), b = h("b");
  await leases.acquire(a, [0]);
  // Granted before a timer tick, while `a` still holds GPU 0: nothing queued behind it.
  const first = await Promise.race([
    leases.acquire(b, [1]).then(() => "granted"),
    tick().then(() => "waiting"),
  ]);
  assert.equal(first, "granted");
  assert.equal(leases.waiting, 0);
  assert.deepEqual([leases.heldBy(a), leases.heldBy(b)], [[0], [1]]);
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

const teardownOf = (id: string): LeaseHolder => ({ id: `teardown:${id}`, teardown: true });
const initOf = (seat: string, joins = true): LeaseHolder => ({
  id: `init:${seat}`,
  initialization: true,
  joinsTeardown: () => joins,
});

Deno.test("lease: a hand-over to a teardown leaves no gap for a waiting request", async () => {
  const leases = new GpuLeases([0]);
  const a = h("a"), b = h("b"), down = teardownOf("a");
  await leases.acquire(a, [0]);
  let granted = false;
  const pb = leases.acquire(b, [0]).then(() => (granted = true));
  await tick();
  assert.ok(leases.handOver(a, down) >= 0);
  await tick();
  assert.equal(granted, false, "the request still waits: the teardown holds the GPU");
  assert.deepEqual(leases.heldBy(a), []);
  assert.deepEqual(leases.heldBy(down), [0]);
  assert.equal(leases.timeline(0)!.holder!.holderId, "teardown:a");
  leases.release(down);
  await pb;
  assert.equal(granted, true);
  const kinds = leases.timeline(0)!.holds.map((i) => [i.holderId, i.teardown]);
  assert.deepEqual(kinds, [["a", false], ["teardown:a", true]]);
});

Deno.test("lease: an initialization shares a teardown's GPUs when no request waits", async () => {
  const leases = new GpuLeases([0]);
  const a = h("a"), down = teardownOf("a"), init = initOf("gpu0/w2");
  await leases.acquire(a, [0]);
  let initGranted = false;
  const pInit = leases.acquire(init, [0]).then(() => (initGranted = true));
  await tick();
  assert.equal(initGranted, false, "never beside a request");
  leases.handOver(a, down);
  await pInit;
  const now = leases.timeline(0)!;
  assert.deepEqual(now.holders.map((x) => x.holderId).sort(), ["init:gpu0/w2", "teardown:a"]);
  // A request now waits for both.
  let bGranted = false;
  const b = h("b");
  const pb = leases.acquire(b, [0]).then(() => (bGranted = true));
  leases.release(down);
  await tick();
  assert.equal(bGranted, false, "the initialization still holds the GPU");
  leases.release(init);
  await pb;
  assert.equal(bGranted, true);
});

Deno.test("lease: an initialization does not join a teardown a request waits behind", async () => {
  const leases = new GpuLeases([0]);
  const a = h("a"), b = h("b"), down = teardownOf("a"), init = initOf("gpu0/w2");
  await leases.acquire(a, [0]);
  const order: string[] = [];
  const pb = leases.acquire(b, [0]).then(() => order.push("b"));
  const pInit = leases.acquire(init, [0]).then(() => order.push("init"));
  await tick();
  leases.handOver(a, down);
  await tick();
  assert.deepEqual(order, [], "the waiting request blocks the initialization");
  leases.release(down);
  await pb;
  assert.deepEqual(order, ["b"]);
  leases.release(b);
  await pInit;
  assert.deepEqual(order, ["b", "init"]);
});

Deno.test("lease: an initialization that may not join waits for the teardown's end", async () => {
  const leases = new GpuLeases([0]);
  const a = h("a"), down = teardownOf("a");
  let joins = false;
  const init: LeaseHolder = {
    id: "init:gpu0/w2",
    initialization: true,
    joinsTeardown: () => joins,
  };
  await leases.acquire(a, [0]);
  let granted = false;
  const p = leases.acquire(init, [0]).then(() => (granted = true));
  leases.handOver(a, down);
  await tick();
  assert.equal(granted, false, "a ready worker waits: no context beside the teardown");
  const plain: LeaseHolder = { id: "init:gpu0/w3", initialization: true };
  leases.release(down);
  await p;
  assert.equal(granted, true);
  leases.release(init);
  // Without a joinsTeardown, an initialization never shares.
  const b = h("b"), downB = teardownOf("b");
  await leases.acquire(b, [0]);
  leases.handOver(b, downB);
  let plainGranted = false;
  const pp = leases.acquire(plain, [0]).then(() => (plainGranted = true));
  joins = true;
  await tick();
  assert.equal(plainGranted, false);
  leases.release(downB);
  await pp;
});

Deno.test("lease: two initializations never share a GPU, nor does a request", async () => {
  const leases = new GpuLeases([0]);
  const one = initOf("gpu0/w1"), two = initOf("gpu0/w2");
  await leases.acquire(one, [0]);
  let second = false;
  const p = leases.acquire(two, [0]).then(() => (second = true));
  await tick();
  assert.equal(second, false);
  assert.equal(leases.tryAcquire(h("r"), [0]), false);
  leases.release(one);
  await p;
  assert.equal(second, true);
});

Deno.test("lease: a teardown is never named as the interfered request", async () => {
  const leases = new GpuLeases([0]);
  const a = h("a"), down = teardownOf("a");
  await leases.acquire(a, [0]);
  await new Promise((r) => setTimeout(r, 2));
  leases.handOver(a, down);
  await new Promise((r) => setTimeout(r, 2));
  const during = performance.now();
  assert.equal(leases.holderAt([0], during), null, "current holder is a teardown");
  await new Promise((r) => setTimeout(r, 2));
  leases.release(down);
  assert.equal(leases.holderAt([0], during), null, "history entry is a teardown");
});

Deno.test("lease: handOver refuses a non-teardown target and hands over nothing unheld", () => {
  const leases = new GpuLeases([0]);
  assert.throws(() => leases.handOver(h("a"), h("b")), /not a teardown holder/);
  assert.equal(leases.handOver(h("a"), teardownOf("a")), 0);
  assert.deepEqual(leases.heldBy(teardownOf("a")), []);
});

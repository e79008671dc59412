/**
 * The worker pool with fake slots and children (no processes): seat choice and the FIFO, a seat
 * readied in the background after a request, retirement and replacement under the
 * initialization gate and the lease (or, for a fresh worker whose requests wait, with its context
 * deferred and neither), a seat that cannot be readied, and shutdown.
 */
import assert from "node:assert/strict";
import { EventLog } from "../../http/events.ts";
import { GpuLeases } from "./lease.ts";
import { PoolBusy, type Seat, WorkerPool } from "./pool.ts";
import type { ChildExit, ChildInit, ChildReady, SeatChild, SeatSlot } from "./worker_handles.ts";

class FakeChild implements SeatChild {
  static count = 0;
  readonly pid = ++FakeChild.count;
  exit: ChildExit | null = null;
  readonly exited: Promise<ChildExit>;
  readonly slot = { stderrSeen: 0, stderrTail: () => "", hello: null };
  inits = 0;
  /** Whether each `init` deferred the context. */
  deferred: boolean[] = [];
  #exit!: (exit: ChildExit) => void;

  constructor(readonly onInit: () => void = () => {}) {
    this.exited = new Promise((resolve) => (this.#exit = resolve));
  }
  init(options: ChildInit = {}): Promise<ChildReady> {
    this.inits++;
    this.deferred.push(options.deferContext === true);
    this.onInit();
    return Promise.resolve({
      target: { arch: "fake" },
      versions: {},
      deviceUuids: [],
      context: options.deferContext ? "deferred" : "created",
    });
  }
  die(): void {
    this.exit = { code: 0, signal: null, orphans: false, slotDied: false };
    this.#exit(this.exit);
  }
  send(): void {}
  setHandler(): void {}
  watchExit() {
    return { exited: this.exited, stop: () => {} };
  }
  kill(): Promise<ChildExit> {
    this.die();
    return this.exited;
  }
  destroySlot(): Promise<void> {
    return Promise.resolve();
  }
}

class FakeSlot implements SeatSlot {
  static count = 0;
  readonly pid = 1000 + ++FakeSlot.count;
  dead = false;
  stderrTail(): string {
    return "";
  }
  readonly closed = Promise.resolve();
  readonly children: FakeChild[] = [];
  readonly switched: string[] = [];
  constructor(readonly onInit: () => void) {}
  fork(): Promise<SeatChild> {
    const child = new FakeChild(this.onInit);
    this.children.push(child);
    return Promise.resolve(child);
  }
  switchWorkspace(name: string): void {
    this.switched.push(name);
  }
  stop(): Promise<void> {
    this.destroy();
    return Promise.resolve();
  }
  destroy(): void {
    this.dead = true;
    for (const child of this.children) if (!child.exit) child.die();
  }
}

async function fakePool(
  options: { gpus?: number[]; perGpu?: number; sandboxed?: boolean; maxRequests?: number } = {},
) {
  const runtimeDir = await Deno.makeTempDir({ prefix: "kcoral-pool-" });
  const events = new EventLog({ logDir: null, console: false, programs: false });
  const log: Record<string, unknown>[] = [];
  events.subscribe((e) => log.push(e));
  const gpus = options.gpus ?? [0];
  const leases = new GpuLeases(gpus);
  const slots = new Map<string, FakeSlot>();
  /** Whether GPU 0's lease was held whenever a child was initialized. */
  const initUnderLease: boolean[] = [];
  const pool = new WorkerPool({
    seats: gpus.flatMap((g) =>
      Array.from({ length: options.perGpu ?? 2 }, (_, i) => ({ label: `gpu${g}/w${i}`, gpus: [g] }))
    ),
    runtimeDir,
    sandboxed: options.sandboxed ?? false,
    leases,
    slotCommand: () => ({ command: "none", args: [], env: {} }),
    childEnv: () => ({ env: {}, unset: [] }),
    maxRequestsPerWorker: options.maxRequests ?? 0,
    events,
    startSlot: (label) => {
      const slot = new FakeSlot(() => {
        const probe = { id: "probe" };
        const free = leases.tryAcquire(probe, [gpus[0]]);
        if (free) leases.release(probe);
        initUnderLease.push(!free);
      });
      slots.set(label, slot);
      return Promise.resolve(slot);
    },
  });
  await pool.start();
  return {
    pool,
    leases,
    log,
    slots,
    initUnderLease,
    async close() {
      await pool.close(10);
      await Deno.remove(runtimeDir, { recursive: true });
    },
  };
}

Deno.test("pool: the least-loaded GPU first, LIFO within it, then one FIFO with hand-off", async () => {
  const { pool, close } = await fakePool({ gpus: [0, 1], perGpu: 2 });
  try {
    const a = await pool.acquire(1000);
    const b = await pool.acquire(1000);
    assert.notDeepEqual(a.gpus, b.gpus, "spread over both GPUs");
    const c = await pool.acquire(1000);
    const d = await pool.acquire(1000);
    assert.equal(new Set([a, b, c, d]).size, 4);
    const waiting = [pool.acquire(5000), pool.acquire(5000)];
    assert.equal(pool.load().requests_waiting, 2);
    pool.release(c, null);
    pool.release(a, null);
    assert.deepEqual(await Promise.all(waiting), [c, a], "first come, first served");
    await assert.rejects(() => pool.acquire(20), PoolBusy);
  } finally {
    await close();
  }
});

Deno.test("pool: a kept seat is idle at once and readied in the background", async () => {
  const { pool, slots, close } = await fakePool({ perGpu: 1, sandboxed: true });
  try {
    const seat = await pool.acquire(1000);
    const first = seat.workspaces.current;
    pool.release(seat, null);
    assert.equal(seat.state, "idle");
    const again = await pool.acquire(1000); // waits for the seat to be readied
    assert.equal(again, seat);
    assert.notEqual(seat.workspaces.current, first, "a new workspace");
    assert.deepEqual(slots.get(seat.label)!.switched, [seat.workspaces.current]);
    pool.release(again, null);
  } finally {
    await close();
  }
});

Deno.test("pool: a retiring child is replaced under the initialization gate and the lease", async () => {
  const { pool, leases, log, slots, initUnderLease, close } = await fakePool({ perGpu: 1 });
  try {
    const seat: Seat = await pool.acquire(1000);
    const old = seat.child as FakeChild;
    pool.release(seat, { oldExit: old.exited, reason: "request_limit" });
    assert.equal(seat.state, "replacing");
    assert.equal(pool.load().request_capacity, 0, "a seat being replaced is no capacity");
    const retired = log.find((e) => e.event === "worker_retired")!;
    assert.equal(retired.reason, "request_limit");
    assert.equal(retired.level, "INFO");
    await new Promise((r) => setTimeout(r, 20));
    const slot = slots.get(seat.label)!;
    assert.equal(slot.children.length, 2, "the next child is forked at once");
    assert.equal(slot.children[1].inits, 0, "but not initialized before the old one is gone");
    old.die();
    const next = await pool.acquire(1000);
    assert.equal(next.child, slot.children[1]);
    assert.deepEqual(initUnderLease, [false, true], "at startup freely, then under the lease");
    assert.ok(log.some((e) => e.event === "worker_ready" && e.generation === 2));
    assert.ok(leases.tryAcquire({ id: "free" }, [0]), "and the lease released after");
    leases.release({ id: "free" });
    pool.release(next, null);
  } finally {
    await close();
  }
});

Deno.test("pool: a seat that cannot be readied is replaced when taken", async () => {
  const { pool, log, close } = await fakePool({ perGpu: 1 });
  try {
    const seat = await pool.acquire(1000);
    // The results directory cannot be emptied (it is gone): readying fails.
    await Deno.remove(seat.resultsDir, { recursive: true });
    pool.release(seat, null);
    assert.equal(await seat.ready, false);
    assert.ok(log.some((e) => e.event === "worker_failed" && e.phase === "sandbox_cleanup"));
    Deno.mkdirSync(seat.resultsDir);
    const served = await pool.acquire(2000); // the replacement
    assert.equal(served, seat);
    assert.ok(log.some((e) => e.event === "worker_retired" && e.reason === "sandbox_cleanup"));
    assert.equal(await served.ready, true);
    pool.release(served, null);
  } finally {
    await close();
  }
});

Deno.test("pool: once shutdown begins, waiters get PoolBusy and nothing becomes ready", async () => {
  const { pool, log, close } = await fakePool({ perGpu: 1 });
  try {
    const seat = await pool.acquire(1000);
    const waiter = pool.acquire(5000);
    pool.beginShutdown();
    await assert.rejects(() => waiter, PoolBusy);
    const old = seat.child as FakeChild;
    const shutdownAt = log.length;
    pool.release(seat, { oldExit: old.exited, reason: "request_limit" });
    old.die();
    await pool.settled();
    assert.equal(log.slice(shutdownAt).some((e) => e.event === "worker_ready"), false);
    assert.equal(pool.load().request_capacity, 0);
  } finally {
    await close();
  }
});

Deno.test("pool: a new context is created beside a teardown only when no ready worker waits", async () => {
  for (const perGpu of [2, 3]) {
    const { pool, leases, slots, close } = await fakePool({ perGpu });
    try {
      const a = await pool.acquire(1000);
      const b = await pool.acquire(1000);
      const request = { id: "req-a" };
      await leases.acquire(request, [0]);
      // b's child retires while a's request holds the lease: b's replacement waits for it.
      const oldB = b.child as FakeChild;
      oldB.die();
      pool.release(b, { oldExit: oldB.exited, reason: "request_limit" });
      await new Promise((r) => setTimeout(r, 20));
      const nextB = slots.get(b.label)!.children[1];
      assert.equal(nextB.inits, 0, "never beside a request");
      // a's child retires: the request's lease passes to its teardown.
      const teardown = { id: "teardown:req-a", teardown: true };
      leases.handOver(request, teardown);
      await new Promise((r) => setTimeout(r, 20));
      // With 2 seats none is ready (a busy, b replacing); with 3, the third one is.
      assert.equal(nextB.inits, perGpu === 2 ? 1 : 0, `${perGpu} seats`);
      leases.release(teardown);
      await new Promise((r) => setTimeout(r, 20));
      assert.equal(nextB.inits, 1);
      pool.release(a, null);
    } finally {
      await close();
    }
  }
});

/** Waits (a macrotask at a time) until `done()`; fails after `limit` rounds. */
async function until(done: () => boolean, what: string, limit = 2000): Promise<void> {
  for (let i = 0; !done(); i++) {
    if (i >= limit) throw new Error(`never: ${what}`);
    await new Promise((r) => setTimeout(r, 1));
  }
}

Deno.test("pool: a fresh worker's replacement defers its context while requests wait", async () => {
  const { pool, leases, log, slots, initUnderLease, close } = await fakePool({
    perGpu: 1,
    maxRequests: 1,
  });
  try {
    const seat = await pool.acquire(1000);
    const old = seat.child as FakeChild;
    pool.release(seat, { oldExit: old.exited, reason: "request_limit" });
    const waiting = pool.acquire(5000); // a request waits for the seat being replaced
    assert.equal(pool.load().requests_waiting, 1);
    old.die();
    const next = await waiting;
    const child = slots.get(seat.label)!.children[1];
    assert.equal(next.child, child);
    assert.deepEqual(child.deferred, [true], "init with context: false");
    assert.deepEqual(initUnderLease, [false, false], "neither at startup nor now under the lease");
    assert.equal(leases.timeline(0)!.holds.filter((h) => h.initialization).length, 0);
    const ready = log.filter((e) => e.event === "worker_ready");
    assert.deepEqual(ready.map((e) => e.context), ["created", "deferred"]);
    pool.release(next, null);
  } finally {
    await close();
  }
});

Deno.test("pool: with no request waiting, a fresh worker's replacement creates its context", async () => {
  const { pool, log, slots, initUnderLease, close } = await fakePool({ perGpu: 2, maxRequests: 1 });
  try {
    const seat = await pool.acquire(1000);
    const old = seat.child as FakeChild;
    pool.release(seat, { oldExit: old.exited, reason: "request_limit" });
    old.die();
    await pool.settled();
    assert.deepEqual(slots.get(seat.label)!.children[1].deferred, [false]);
    assert.deepEqual(initUnderLease, [false, false, true], "the replacement under the lease");
    assert.equal(log.filter((e) => e.event === "worker_ready").at(-1)!.context, "created");
  } finally {
    await close();
  }
});

Deno.test("pool: a request that starts waiting while the replacement waits for the lease defers it", async () => {
  const { pool, leases, slots, initUnderLease, close } = await fakePool({
    perGpu: 1,
    maxRequests: 1,
  });
  try {
    const seat = await pool.acquire(1000);
    const other = { id: "another-request" };
    await leases.acquire(other, [0]);
    const old = seat.child as FakeChild;
    pool.release(seat, { oldExit: old.exited, reason: "request_limit" });
    old.die();
    await until(() => leases.waiting === 1, "the replacement waits for the lease");
    const child = slots.get(seat.label)!.children[1];
    assert.equal(child.inits, 0);
    const next = await pool.acquire(5000); // the replacement stops waiting and defers
    assert.equal(next.child, child);
    assert.deepEqual(child.deferred, [true]);
    assert.deepEqual(initUnderLease, [false, true], "the lease was another's all along");
    assert.equal(leases.waiting, 0, "its wait for the lease was cancelled");
    assert.deepEqual(leases.heldBy(other), [0]);
    leases.release(other);
    assert.equal(leases.timeline(0)!.holders.length, 0, "nothing of the replacement's holds it");
    pool.release(next, null);
  } finally {
    await close();
  }
});

Deno.test("pool: a reused worker's replacement creates its context even while requests wait", async () => {
  const { pool, slots, initUnderLease, close } = await fakePool({ perGpu: 1, maxRequests: 0 });
  try {
    const seat = await pool.acquire(1000);
    const old = seat.child as FakeChild;
    pool.release(seat, { oldExit: old.exited, reason: "poisoned_context" });
    const waiting = pool.acquire(5000);
    old.die();
    const next = await waiting;
    assert.deepEqual(slots.get(seat.label)!.children[1].deferred, [false]);
    assert.deepEqual(initUnderLease, [false, true]);
    pool.release(next, null);
  } finally {
    await close();
  }
});

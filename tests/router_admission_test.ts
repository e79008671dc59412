/** The Router's admission queue: places, wake-ups, deadline, cancellation (spec router §3). */
import assert from "node:assert/strict";
import { AdmissionQueue, NoNode, RouterBusy, RouterStopping } from "../router/admission_queue.ts";

/** A pool of `free` interchangeable units, taken one at a time. */
class Units {
  free = 0;
  taken = 0;
  take = (): number | null => {
    if (this.free === 0) return null;
    this.free--;
    return ++this.taken;
  };
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 0));

/** Whether `promise` has settled, after letting pending callbacks run. */
async function settled(promise: Promise<unknown>): Promise<boolean> {
  let done = false;
  promise.then(() => done = true, () => done = true);
  await tick();
  return done;
}

/** `promise`, or a failure after `ms` (the timer is always cleared). */
async function within<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`not settled within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

Deno.test("admission: free capacity is taken without a queue place", async () => {
  const queue = new AdmissionQueue({ maxWaiting: 0, waitTimeoutMs: 1000 });
  const units = new Units();
  units.free = 1;
  assert.equal(await queue.admit(units.take), 1);
  assert.equal(queue.waiting, 0);
  // With no place at all, a request that cannot be placed at once is refused at once.
  await assert.rejects(queue.admit(units.take), RouterBusy);
  assert.equal(queue.waiting, 0);
});

Deno.test("admission: queue_permits_return_on_cancellation_and_timeout", async () => {
  const queue = new AdmissionQueue({ maxWaiting: 1, waitTimeoutMs: 20 });
  const units = new Units();
  const client = new AbortController();
  const cancelled = queue.admit(units.take, client.signal);
  assert.equal(queue.waiting, 1);
  const overflow = await queue.admit(units.take).catch((error) => error);
  assert.ok(overflow instanceof RouterBusy && overflow.kind === "router_busy");
  client.abort(new Error("client went away"));
  await assert.rejects(cancelled, /client went away/);
  assert.equal(queue.waiting, 0);
  const started = performance.now();
  const timedOut = await queue.admit(units.take).catch((error) => error);
  assert.ok(timedOut instanceof NoNode && timedOut.kind === "no_node");
  assert.ok(performance.now() - started >= 15, "waited for the deadline");
  assert.equal(queue.waiting, 0);
});

Deno.test("admission: a released unit wakes exactly one waiter, the oldest", async () => {
  const queue = new AdmissionQueue({ maxWaiting: 2, waitTimeoutMs: 5000 });
  const units = new Units();
  const first = queue.admit(units.take);
  const second = queue.admit(units.take);
  units.free = 1;
  queue.wakeOne();
  assert.equal(await first, 1);
  assert.equal(await settled(second), false);
  assert.equal(queue.waiting, 1);
  units.free = 1;
  queue.wakeOne();
  assert.equal(await second, 2);
  assert.equal(queue.waiting, 0);
});

Deno.test("admission: two releases in a row serve two waiters (no lost wake-up)", async () => {
  const queue = new AdmissionQueue({ maxWaiting: 2, waitTimeoutMs: 5000 });
  const units = new Units();
  const waiters = [queue.admit(units.take), queue.admit(units.take)];
  units.free = 1;
  queue.wakeOne();
  units.free++;
  queue.wakeOne();
  assert.deepEqual((await within(Promise.all(waiters), 1000)).sort(), [1, 2]);
});

Deno.test("admission: a woken waiter that was cancelled passes the wake-up on", async () => {
  const queue = new AdmissionQueue({ maxWaiting: 2, waitTimeoutMs: 5000 });
  const units = new Units();
  const client = new AbortController();
  const gone = queue.admit(units.take, client.signal);
  const next = queue.admit(units.take);
  units.free = 1;
  queue.wakeOne(); // wakes `gone` ...
  client.abort(new Error("gone")); // ... which leaves before it runs
  await assert.rejects(gone, /gone/);
  assert.equal(await within(next, 1000), 1);
  assert.equal(queue.waiting, 0);
});

Deno.test("admission: a waiter woken for nothing keeps waiting; wakeAll wakes every one", async () => {
  const queue = new AdmissionQueue({ maxWaiting: 3, waitTimeoutMs: 5000 });
  const units = new Units();
  const waiters = [queue.admit(units.take), queue.admit(units.take), queue.admit(units.take)];
  queue.wakeAll();
  queue.wakeOne();
  assert.equal(await settled(Promise.race(waiters)), false);
  assert.equal(queue.waiting, 3);
  units.free = 3;
  queue.wakeAll();
  assert.deepEqual((await within(Promise.all(waiters), 1000)).sort(), [1, 2, 3]);
});

Deno.test("admission: a signal aborted before admission uses no place", async () => {
  const queue = new AdmissionQueue({ maxWaiting: 1, waitTimeoutMs: 5000 });
  const units = new Units();
  units.free = 1;
  await assert.rejects(queue.admit(units.take, AbortSignal.abort(new Error("early"))), /early/);
  assert.equal(units.free, 1, "nothing was taken");
  assert.equal(queue.waiting, 0);
});

Deno.test("admission: a zero wait timeout checks once more, then gives up", async () => {
  const queue = new AdmissionQueue({ maxWaiting: 1, waitTimeoutMs: 0 });
  await assert.rejects(queue.admit(new Units().take), NoNode);
  assert.equal(queue.waiting, 0);
});

Deno.test("admission: close lets every waiter go and refuses later ones", async () => {
  const queue = new AdmissionQueue({ maxWaiting: 2, waitTimeoutMs: 60_000 });
  const units = new Units();
  const waiters = [queue.admit(units.take), queue.admit(units.take)];
  queue.close();
  for (const waiter of waiters) await assert.rejects(waiter, RouterStopping);
  assert.equal(queue.waiting, 0);
  units.free = 1;
  const late = await queue.admit(units.take).catch((error) => error);
  assert.ok(late instanceof RouterStopping && late instanceof NoNode);
  assert.equal(units.free, 1);
});

Deno.test("admission: limits are checked", () => {
  assert.throws(() => new AdmissionQueue({ maxWaiting: -1, waitTimeoutMs: 1 }), RangeError);
  assert.throws(() => new AdmissionQueue({ maxWaiting: 1, waitTimeoutMs: -1 }), RangeError);
  assert.throws(() => new AdmissionQueue({ maxWaiting: 1.5, waitTimeoutMs: 1 }), RangeError);
});

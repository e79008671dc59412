/**
 * The supervisor's delays (link/backoff.ts, spec router §5.3): exponential backoff
 * bounded and reset, jitter applied after the cap, and the sleep shutdown interrupts.
 */
import assert from "node:assert/strict";
import { Backoff, sleepUnlessAborted, withJitter } from "./backoff.ts";

Deno.test("backoff: min 1 / max 5 gives 1, 2, 4, 5, 5 and reset returns to the minimum", () => {
  const backoff = new Backoff(1, 5);
  assert.deepEqual([1, 2, 3, 4, 5].map(() => backoff.next()), [1, 2, 4, 5, 5]);
  backoff.reset();
  assert.deepEqual([backoff.next(), backoff.next()], [1, 2]);
  const reconnect = new Backoff(1, 30);
  assert.deepEqual(Array.from({ length: 7 }, () => reconnect.next()), [1, 2, 4, 8, 16, 30, 30]);
  const flat = new Backoff(0.05, 0.05);
  assert.deepEqual([flat.next(), flat.next()], [0.05, 0.05]);
});

Deno.test("backoff: bounds must be positive, finite and ordered", () => {
  for (const [min, max] of [[0, 1], [-1, 1], [2, 1], [1, Infinity], [NaN, 1], [1, NaN]]) {
    assert.throws(() => new Backoff(min, max), RangeError, `${min}..${max}`);
  }
});

Deno.test("backoff: jitter scales the delay within [1 - j, 1 + j], after the cap", () => {
  assert.equal(withJitter(30, 0), 30);
  assert.equal(withJitter(30, 0, () => 0.99), 30);
  assert.equal(withJitter(10, 0.2, () => 0), 8);
  assert.equal(withJitter(10, 0.2, () => 0.5), 10);
  assert.ok(Math.abs(withJitter(10, 0.2, () => 1) - 12) < 1e-9);
  // The cap is the backoff's; jitter may take a capped delay above it.
  const backoff = new Backoff(1, 5);
  for (let i = 0; i < 4; i++) backoff.next();
  assert.ok(withJitter(backoff.next(), 0.2, () => 0.999) > 5.99);
  for (let i = 0; i < 1000; i++) {
    const delay = withJitter(5, 0.5);
    assert.ok(delay >= 2.5 && delay <= 7.5, String(delay));
  }
});

Deno.test("backoff: a sleep runs its time, and an abort interrupts it at once", async () => {
  const started = performance.now();
  assert.equal(await sleepUnlessAborted(30), true);
  assert.ok(performance.now() - started >= 25);

  const stop = new AbortController();
  const long = sleepUnlessAborted(60_000, stop.signal);
  setTimeout(() => stop.abort(), 20);
  const before = performance.now();
  assert.equal(await long, false);
  assert.ok(performance.now() - before < 5_000);
  assert.equal(await sleepUnlessAborted(60_000, stop.signal), false); // already aborted
});

Deno.test("backoff: Backoff", () => {
  const backoff = new Backoff(1, 5);
  backoff.next();
  backoff.next();
  backoff.reset();
  if (backoff.next() !== 1) throw new Error();
});

Deno.test("backoff: withJitter", () => {
  if (withJitter(30, 0) !== 30) throw new Error();
  if (withJitter(30, 0.2, () => 0) !== 24) throw new Error();
});

Deno.test("backoff: sleepUnlessAborted", async () => {
  const stop = new AbortController();
  const slept = sleepUnlessAborted(60_000, stop.signal);
  stop.abort();
  if (await slept) throw new Error("not interrupted");
  if (!(await sleepUnlessAborted(1))) throw new Error("interrupted");
});

/** Router node selection: normalised load, power of two choices, ties, preference (spec §2.3). */
import assert from "node:assert/strict";
import {
  choosePowerOfTwo,
  compareLoad,
  estimatedUsed,
  type LoadView,
  selectNode,
} from "../router/selection.ts";

const node = (
  name: string,
  workerCount: number,
  busyWorkers: number,
  lastSelected = 0,
  inFlight = 0,
): LoadView => ({ name, workerCount, busyWorkers, lastSelected, inFlight });

/** `random` returning `values` in turn (and failing if asked for more). */
function sequence(...values: number[]): () => number {
  return () => {
    const value = values.shift();
    assert.ok(value !== undefined, "random called more often than expected");
    return value;
  };
}

Deno.test("selection: compares_normalized_load", () => {
  assert.ok(compareLoad(node("a", 8, 4), node("b", 2, 0)) > 0);
  assert.ok(compareLoad(node("b", 2, 0), node("a", 8, 4)) < 0);
  assert.equal(compareLoad(node("a", 8, 4), node("b", 2, 1)), 0);
  // The Router's own in-flight count overrides a lower reported busy count.
  const local = node("local", 8, 2, 0, 4);
  assert.equal(estimatedUsed(local), 4);
  assert.equal(compareLoad(local, node("b", 2, 1)), 0);
  // worker_count 0 counts as 1.
  assert.equal(compareLoad(node("a", 0, 0, 0, 1), node("b", 1, 1)), 0);
});

Deno.test("selection: load comparison is exact where floating point is not", () => {
  const n = Number.MAX_SAFE_INTEGER - 1;
  // (n+1)/n against n/(n-1): equal as doubles, but (n+1)(n-1) = n² - 1 < n².
  assert.equal((n + 1) / n, n / (n - 1));
  assert.ok(compareLoad(node("a", n, n + 1), node("b", n - 1, n)) < 0);
});

Deno.test("selection: one candidate is taken without drawing", () => {
  const only = node("only", 1, 1);
  assert.equal(choosePowerOfTwo([only], sequence()), only);
});

Deno.test("selection: two distinct candidates are drawn, and only they are compared", () => {
  const busy = node("busy", 1, 1), half = node("half", 2, 1), idle = node("idle", 1, 0);
  // Draws positions 0 and 1: the idle third candidate is not looked at.
  assert.equal(choosePowerOfTwo([busy, half, idle], sequence(0, 0)), half);
  // Draws position 2, then (2 + 1 + 1) % 3 = 1.
  assert.equal(choosePowerOfTwo([busy, half, idle], sequence(0.99, 0.99)), idle);
  // Out-of-range values from `random` are clamped, not read past the array.
  assert.equal(choosePowerOfTwo([busy, idle], sequence(1, 1)).name, "idle");
});

Deno.test("selection: every ordered pair of distinct candidates is equally likely", () => {
  const count = 4;
  const candidates = Array.from({ length: count }, (_, i) => node(`n${i}`, 1, 0, i));
  const seen = new Map<string, number>();
  for (let i = 0; i < count; i++) {
    for (let j = 0; j < count - 1; j++) {
      const draws = [(i + 0.5) / count, (j + 0.5) / (count - 1)];
      // Equal loads, distinct lastSelected: the pick tells which pair was drawn (the lower index).
      const picked = choosePowerOfTwo(candidates, sequence(...draws));
      const first = i, second = (i + 1 + j) % count;
      assert.notEqual(first, second);
      assert.equal(picked.name, `n${Math.min(first, second)}`);
      const pair = [first, second].join(",");
      seen.set(pair, (seen.get(pair) ?? 0) + 1);
    }
  }
  assert.equal(seen.size, count * (count - 1));
  assert.ok([...seen.values()].every((times) => times === 1));
});

Deno.test("selection: equal load goes to the least recently selected, then the first drawn", () => {
  const recent = node("recent", 4, 1, 9), old = node("old", 8, 2, 3);
  assert.equal(choosePowerOfTwo([recent, old], sequence(0, 0)), old);
  assert.equal(choosePowerOfTwo([old, recent], sequence(0, 0)), old);
  const a = node("a", 1, 0, 5), b = node("b", 1, 0, 5);
  assert.equal(choosePowerOfTwo([a, b], sequence(0, 0)), a);
  assert.equal(choosePowerOfTwo([a, b], sequence(0.9, 0)), b);
});

Deno.test("selection: the preferred node wins when it is a candidate", () => {
  const busy = node("gpu-a", 1, 0, 0, 1), idle = node("gpu-b", 1, 0);
  assert.equal(selectNode([busy, idle], "gpu-a", sequence()), busy);
  assert.equal(selectNode([busy, idle], "gpu-c", sequence(0, 0)), idle);
  assert.equal(selectNode([busy, idle], null, sequence(0, 0)), idle);
  assert.equal(selectNode([], "gpu-a", sequence()), null);
  assert.throws(() => choosePowerOfTwo([], Math.random), RangeError);
});

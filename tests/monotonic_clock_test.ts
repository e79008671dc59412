/**
 * server/workers/monotonic_clock.ts: a worker's monotonic instant maps into this process's
 * timeline.
 */
import assert from "node:assert/strict";
import { monotonicOffsetMs } from "../server/workers/monotonic_clock.ts";

Deno.test("monotonic clock: Python's time.monotonic_ns() lands between the reads around it", async () => {
  const offset = monotonicOffsetMs();
  assert.notEqual(offset, null, "tests run with -A on Linux: the clock must be readable");
  assert.equal(monotonicOffsetMs(), offset, "read once");
  for (let i = 0; i < 3; i++) {
    const before = performance.now();
    const out = await new Deno.Command("python3", {
      args: ["-c", "import time; print(time.monotonic_ns())"],
      stdout: "piped",
    }).output();
    const after = performance.now();
    const mapped = Number(new TextDecoder().decode(out.stdout).trim()) / 1e6 + offset!;
    // Exact up to the clock reads (microseconds): no round-trip estimate, so no slack needed.
    assert.ok(mapped >= before && mapped <= after, `${before} <= ${mapped} <= ${after}`);
  }
});

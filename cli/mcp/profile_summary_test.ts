/**
 * The `profile` tool's ncu summary against a real `ncu --import --csv --page details` export
 * (Nsight Compute 2025.3.1 on an H200, two kernels of a torch script; fixture in
 * tests/fixtures/ncu/): metric rows end after `Metric Value` while rule rows carry five more
 * columns, and both kinds must be read.
 */
import assert from "node:assert/strict";
import { parseNcuDetails, summarizeNcuKernels } from "./profile_summary.ts";

const CSV = Deno.readTextFileSync(
  new URL("../../tests/fixtures/ncu/details_h200_2025.3.csv", import.meta.url),
);

Deno.test("ncu summary: a real details export gives each kernel its headline metrics", () => {
  const kernels = parseNcuDetails(CSV);
  assert.equal(kernels.length, 2);
  assert.deepEqual(kernels.map((k) => k.id), ["0", "1"]);
  assert.match(kernels[0].name, /elementwise_kernel_with_index/);
  assert.equal(kernels[0].grid, "(16384, 1, 1)");
  assert.equal(kernels[0].block, "(64, 1, 1)");
  assert.equal(kernels[0].metrics.Duration, "12.10 us");
  assert.equal(kernels[1].metrics.Duration, "4.45 us");
  for (const kernel of kernels) {
    assert.ok("Memory Throughput" in kernel.metrics, JSON.stringify(kernel.metrics));
  }
  const text = summarizeNcuKernels(kernels);
  assert.match(text, /^#0 .* grid \(16384, 1, 1\) block \(64, 1, 1\): Duration 12\.10 us, /);
});

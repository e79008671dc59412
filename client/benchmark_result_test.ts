import assert from "node:assert/strict";
import { benchmarkResult, plainValue, type ResultValue } from "./mod.ts";

function wire(overrides: Record<string, ResultValue> = {}): Map<string, ResultValue> {
  const base: [string, ResultValue][] = [
    ["latency_ms_median", 2.64],
    ["latency_ms_mean", 2.65],
    ["latency_ms_min", 2.6],
    ["latency_ms_max", 2.9],
    ["ci95_ms", [2.63, 2.66]],
    ["ci95_rel_half_width", 0.0057],
    ["samples", 100n],
    ["timing", "cupti_activity"],
    ["activities_stable", true],
    ["escaped_work", false],
    ["persisting_l2_calls", 0],
    [
      "receipt",
      new Map<string, ResultValue>([
        ["gpu", new Map<string, ResultValue>([["name", "NVIDIA H200"], ["uuid", "GPU-1"]])],
        [
          "clocks",
          new Map<string, ResultValue>([
            [
              "sm_clock_mhz",
              new Map<string, ResultValue>([["min", 1980], ["median", 1980], ["max", 1980]]),
            ],
            ["reasons_seen", ["sw_power_cap"]],
          ]),
        ],
      ]),
    ],
    ["a_field_newer_than_this_client", "kept"],
  ];
  const map = new Map<string, ResultValue>(base);
  for (const [key, value] of Object.entries(overrides)) {
    if (value === undefined) map.delete(key);
    else map.set(key, value);
  }
  return map;
}

Deno.test("benchmarkResult reads the wire's Maps into typed objects, unknown fields kept", () => {
  const result = benchmarkResult(wire());
  assert.equal(result.latency_ms_median, 2.64);
  assert.deepEqual(result.ci95_ms, [2.63, 2.66]);
  assert.equal(result.samples, 100, "integers that came as bigint are numbers");
  assert.equal(result.activities_stable, true);
  assert.equal(result.receipt.gpu.name, "NVIDIA H200");
  assert.deepEqual(result.receipt.clocks?.sm_clock_mhz, { min: 1980, median: 1980, max: 1980 });
  assert.deepEqual(result.receipt.clocks?.reasons_seen, ["sw_power_cap"]);
  assert.equal(result.a_field_newer_than_this_client, "kept");
});

Deno.test("benchmarkResult names the field that is missing or wrong", () => {
  const cases: [ResultValue, RegExp][] = [
    [[1, 2], /a dict \(Map\); got an array/],
    [wire({ latency_ms_median: "fast" }), /latency_ms_median is a string, not a number/],
    [wire({ timing: null }), /timing is null, not a string/],
    [wire({ ci95_ms: [1] }), /ci95_ms is an array, not \[lo, hi\] or null/],
    [wire({ receipt: null }), /receipt is null; .* no GPU-state receipt/],
    [wire({ receipt: new Map([["gpu", "H100"]]) }), /receipt.gpu is a string, not an object/],
  ];
  for (const [value, message] of cases) assert.throws(() => benchmarkResult(value), message);
  const noReceipt = wire();
  noReceipt.delete("receipt");
  assert.throws(() => benchmarkResult(noReceipt), /receipt is missing/);
  const noInterval = benchmarkResult(wire({ ci95_ms: null }));
  assert.equal(noInterval.ci95_ms, null);
});

Deno.test("plainValue keeps bigints beyond 2^53 and non-JSON values as they are", () => {
  const huge = 2n ** 60n;
  const bytes = new Uint8Array([1]);
  assert.deepEqual(plainValue([huge, bytes, null]), [huge, bytes, null]);
});

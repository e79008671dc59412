/**
 * BenchmarkResult: the typed form of what `kcoral_runtime.builtins.benchmark` (and upstream's
 * `kcoral.builtins.benchmark`) returns, as it arrives in a {@linkcode ProgramResult}: a `Map`
 * from the wire, read here into a plain object with the same snake_case field names the Python
 * side and docs/timing.md use.
 *
 * @module
 */

import type { ResultValue } from "./result.ts";

/** min / median / max of one NVML reading over the timed window. */
export interface Spread {
  /** Lowest reading. */
  min: number;
  /** Median reading. */
  median: number;
  /** Highest reading. */
  max: number;
}

/** The GPU's state while the calls ran, from NVML samples (a few per millisecond at most). */
export interface ClockReceipt {
  /** How many readings were taken. */
  samples: number;
  /** SM clock, MHz. */
  sm_clock_mhz: Spread | null;
  /** Memory clock, MHz. */
  mem_clock_mhz: Spread | null;
  /** GPU temperature, °C. */
  temperature_c: Spread | null;
  /** Board power, W (a one-second average on H100/H200). */
  power_w: Spread | null;
  /** Clock-event reasons seen in any reading (e.g. `sw_power_cap`, `hw_thermal_slowdown`). */
  reasons_seen: string[];
  /** Readings taken while a power or thermal reason lowered the clocks. */
  throttled_samples: number;
}

/**
 * Where and with what the result was measured. Every benchmark result has one; fields NVML or
 * the driver could not give are `null`, and `nvml_error` / `timing_fallback_reason` say why.
 */
export interface BenchmarkReceipt {
  /** GPU identity: `name`, `uuid`, `driver_version`, `cuda_driver_version`, `pci_bus_id`,
   * `sm_clock_max_mhz`, `power_limit_w`, `clocks_locked`, ... (NVML; name and uuid at least). */
  gpu: Record<string, unknown> & { name: string | null; uuid: string | null };
  /** `torch`, `cuda_runtime`, `cupti` (CUPTI's API version) and `python` versions. */
  versions: {
    torch: string | null;
    cuda_runtime: string | null;
    cupti: number | null;
    python: string | null;
  };
  /** The clocks, temperature and power over the timed window (`null` without NVML). */
  clocks: ClockReceipt | null;
  /** Why NVML gave no readings, when it did not. */
  nvml_error: string | null;
  /** Why activity timing was not used (no libcupti), when it was not. */
  timing_fallback_reason: string | null;
  /** When the measurement ended, ISO 8601 UTC. */
  measured_at: string;
  /** Wall time of the timed part, seconds. */
  wall_s: number;
}

/** A benchmark result: upstream's fields plus the confidence interval, flags and receipt. */
export interface BenchmarkResult {
  /** Median per-call time, ms. */
  latency_ms_median: number;
  /** Mean per-call time, ms. */
  latency_ms_mean: number;
  /** Fastest call, ms. */
  latency_ms_min: number;
  /** Slowest call, ms. */
  latency_ms_max: number;
  /** The median's 95 % confidence interval `[lo, hi]` in ms (`null` below 6 calls). */
  ci95_ms: [number, number] | null;
  /** Half the interval's width over the median (0.005 = ±0.5 %). */
  ci95_rel_half_width: number | null;
  /** Calls the statistics are over (timed calls less discarded ones). */
  samples: number;
  /** Untimed calls before timing. */
  warmup: number;
  /** Timed calls. */
  repeat: number;
  /** Whether persisting L2 was reset and twice the L2 overwritten before every call. */
  flush_l2: boolean;
  /** `cupti_activity` (each call's GPU span on every stream) or `cuda_events_device_sync`. */
  timing: string;
  /** Whether every timed call launched the same GPU work (`null` without activity timing). */
  activities_stable: boolean | null;
  /** Whether GPU work was seen outside every call's window (a thread or callback left behind). */
  escaped_work: boolean | null;
  /** How many such activities. */
  escaped_activities: number | null;
  /** Timed calls that launched no GPU work at all. */
  calls_without_activity: number | null;
  /** Python threads the calls left running. */
  threads_started: number;
  /** Activity records CUPTI dropped (its buffers were full). */
  dropped_records: number;
  /** Names of the kernels the first call launched. */
  kernels: string[];
  /** Timed calls that overlapped a power/thermal throttle reading. */
  throttled_calls: number;
  /** Throttled calls left out of the statistics (`discard_throttled`). */
  discarded_calls: number;
  /** After how many calls a persisting-L2 carve-out was found (`null`: the driver could not
   * say). It is undone before every call. */
  persisting_l2_calls: number | null;
  /** The adaptive mode's outcome (`null` in fixed-count mode). */
  adaptive: { target_rel_ci: number; budget_s: number; reached: boolean; rounds: number } | null;
  /** The cold-L2 preparation (`null` without `flush_l2`). */
  cold_l2: { flush_bytes: number; l2_bytes: number; persisting_l2_reset: boolean } | null;
  /** The GPU-state receipt. */
  receipt: BenchmarkReceipt;
  /** Every field the server sent, including ones newer than this client. */
  [field: string]: unknown;
}

/**
 * A returned value as a plain JSON-like object: `Map`s become objects, arrays map element-wise,
 * `bigint`s within ±2^53 become numbers. Other values (tensors, bytes, files) stay as they are.
 *
 * @example
 * ```ts
 * import { plainValue } from "./benchmark_result.ts";
 *
 * const value = plainValue(new Map([["a", [new Map([["b", 1n]])]]]));
 * if (JSON.stringify(value) !== '{"a":[{"b":1}]}') throw new Error(JSON.stringify(value));
 * ```
 */
export function plainValue(value: ResultValue): unknown {
  if (value instanceof Map) {
    const out: Record<string, unknown> = {};
    for (const [key, item] of value) out[key] = plainValue(item);
    return out;
  }
  if (Array.isArray(value)) return value.map(plainValue);
  if (typeof value === "bigint" && value >= -(2n ** 53n) && value <= 2n ** 53n) {
    return Number(value);
  }
  return value;
}

const _NUMBERS = [
  "latency_ms_median",
  "latency_ms_mean",
  "latency_ms_min",
  "latency_ms_max",
] as const;

/**
 * Reads a benchmark result returned by a program (`result.get(key)`) into a
 * {@linkcode BenchmarkResult}.
 *
 * @throws {TypeError} when the value is not a benchmark result: it names the first field that is
 * missing or of the wrong type. Results of upstream servers have no receipt; they are refused
 * (use {@linkcode plainValue} for those).
 *
 * @example
 * ```ts
 * import { benchmarkResult } from "./benchmark_result.ts";
 * import type { ResultValue } from "./result.ts";
 *
 * const fromWire = new Map<string, ResultValue>([
 *   ["latency_ms_median", 2.64], ["latency_ms_mean", 2.65], ["latency_ms_min", 2.6],
 *   ["latency_ms_max", 2.7], ["ci95_ms", [2.63, 2.66]], ["ci95_rel_half_width", 0.0057],
 *   ["samples", 100], ["timing", "cupti_activity"], ["activities_stable", true],
 *   ["escaped_work", false],
 *   ["receipt", new Map([["gpu", new Map([["name", "NVIDIA H100 80GB HBM3"], ["uuid", "GPU-1"]])]])],
 * ]);
 * const result = benchmarkResult(fromWire);
 * if (result.receipt.gpu.name !== "NVIDIA H100 80GB HBM3" || result.ci95_ms?.[1] !== 2.66) {
 *   throw new Error();
 * }
 * ```
 */
export function benchmarkResult(value: ResultValue): BenchmarkResult {
  const plain = plainValue(value);
  if (plain === null || typeof plain !== "object" || Array.isArray(plain)) {
    throw new TypeError("a benchmark result is a dict (Map); got " + _kind(plain));
  }
  const out = plain as Record<string, unknown>;
  for (const name of _NUMBERS) {
    if (typeof out[name] !== "number") {
      throw new TypeError(`benchmark result: ${name} is ${_kind(out[name])}, not a number`);
    }
  }
  if (typeof out.timing !== "string") {
    throw new TypeError(`benchmark result: timing is ${_kind(out.timing)}, not a string`);
  }
  const ci = out.ci95_ms;
  if (
    ci !== null &&
    !(Array.isArray(ci) && ci.length === 2 && ci.every((v) => typeof v === "number"))
  ) {
    throw new TypeError(`benchmark result: ci95_ms is ${_kind(ci)}, not [lo, hi] or null`);
  }
  const receipt = out.receipt;
  if (receipt === null || typeof receipt !== "object" || Array.isArray(receipt)) {
    throw new TypeError(
      `benchmark result: receipt is ${_kind(receipt)}; the server's benchmark gives no GPU-state ` +
        "receipt (an upstream or older server?)",
    );
  }
  const gpu = (receipt as Record<string, unknown>).gpu;
  if (gpu === null || typeof gpu !== "object" || Array.isArray(gpu)) {
    throw new TypeError(`benchmark result: receipt.gpu is ${_kind(gpu)}, not an object`);
  }
  return out as BenchmarkResult;
}

function _kind(value: unknown): string {
  if (value === undefined) return "missing";
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  return `a ${typeof value}`;
}

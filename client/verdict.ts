/**
 * The verdict of an evaluation (`kcoral eval`, `Client.evaluate`, the MCP tool
 * `evaluate_kernel`): one object, the same JSON everywhere, keys in snake_case as the judge
 * writes them (docs/eval.md describes every field).
 *
 * @module
 */

/** The flags a verdict can raise, in the order a verdict lists them. */
export const VERDICT_FLAGS = [
  "inputs_modified",
  "nondeterministic",
  "timed_outputs_incorrect",
  "output_not_plain_tensor",
  "stream_escape",
  "timer_escape",
  "activities_unstable",
  "excessive_speedup",
  "faster_than_physics",
  "throttled",
  "persisting_l2",
] as const;

/**
 * One of {@linkcode VERDICT_FLAGS}.
 *
 * @example
 * ```ts
 * import type { VerdictFlag } from "./verdict.ts";
 * const flag: VerdictFlag = "inputs_modified";
 * ```
 */
export type VerdictFlag = typeof VERDICT_FLAGS[number];

/**
 * A timing of the reference or the candidate: on a GPU the runtime's `benchmark` result
 * (all-stream CUPTI spans, `timing: "cupti_activity"` or `"cuda_event"`), on a CPU server a host
 * timer's (`timing: "cpu"`).
 */
export interface VerdictTiming {
  /** Median call time, ms. */
  latency_ms_median: number;
  /** Mean call time, ms. */
  latency_ms_mean: number;
  /** Fastest call, ms. */
  latency_ms_min: number;
  /** Slowest call, ms. */
  latency_ms_max: number;
  /** The median's distribution-free 95 % interval, ms (null below 6 calls). */
  ci95_ms: [number, number] | null;
  /** Timed calls. */
  samples: number;
  /** How calls were timed: `cupti_activity`, `cuda_event` or `cpu`. */
  timing: string;
  /** GPU: whether every call launched the same work (null on the CPU). */
  activities_stable: boolean | null;
  /** GPU: whether work outlived its call (null on the CPU). */
  escaped_work: boolean | null;
  /** Calls whose span overlapped a throttled window. */
  throttled_calls: number;
  /** GPU state: identity, clocks, versions (a host-timer summary on the CPU). */
  receipt: Record<string, unknown> | null;
  /** Everything else the timer reported. */
  [key: string]: unknown;
}

/**
 * Where the time to a verdict went, ms. The phases other than the two totals add up to `total`,
 * whatever the verdict (to the rounding of each to 1 µs): `client` is what the others leave.
 */
export interface VerdictPhases {
  /**
   * Server time outside the steps' measured code (queueing, the fresh workers, uploads, imports,
   * assembling the inputs and outputs bundles).
   */
  worker_start: number;
  /** Drawing the inputs from the secret seeds (step 1, no GPU lease). */
  input_generation: number;
  /** Importing and building the candidate (compilation included). */
  candidate_load: number;
  /** The candidate's correctness runs and their checks. */
  candidate_correctness: number;
  /** The candidate's timing. */
  candidate_timing: number;
  /**
   * A candidate step that brought back no phase times, its worker dead (a 200 FAILED: its time on
   * the worker) or past the deadline (a 504, or a 500 for a worker that died outside an
   * instruction: the whole step, transfer and queue included). 0 otherwise.
   */
  candidate_unfinished: number;
  /** Building the reference and computing the expected outputs. */
  reference: number;
  /** The reference's timing. */
  reference_timing: number;
  /**
   * The reference built and timed in the candidate's worker before the candidate loads
   * (`EvaluateOptions.bracket`; 0 without).
   */
  reference_bracket: number;
  /** Comparing outputs. */
  comparison: number;
  /** The judge reading both bundles (the inputs bundle's SHA-256 check included). */
  bundle_decode: number;
  /** Moving requests and results between the client and the server(s). */
  transfer: number;
  /**
   * The client's own work between and around the steps (building the programs, hashing the
   * bundles, reading the answers): `total` less every other phase.
   */
  client: number;
  /** Wall time of the whole evaluation. */
  total: number;
  /** `total` without `candidate_load` (compile excluded). */
  total_excluding_compile: number;
}

/**
 * The reference bracket: the reference timed in the candidate's worker before the candidate
 * loaded, and what it did to the verdict's interval. The candidate's worker reports it, so it
 * only ever widens `speedup_ci95`; no flag reads it.
 *
 * @example
 * ```ts
 * import type { VerdictBracket } from "./verdict.ts";
 * const bracket: VerdictBracket = { used: false, reason: "no bracket timing came back" };
 * ```
 */
export interface VerdictBracket {
  /** Whether it widened `speedup_ci95`. */
  used: boolean;
  /** Why it was not used (a failure there, or nothing usable came back). */
  reason?: string;
  /** The reference's median there, ms. */
  median_ms?: number;
  /** Its 95 % interval, ms. */
  ci95_ms?: [number, number];
  /** Its timed calls. */
  samples?: number;
  /** Its median over the judge's reference median, less 1: the two workers' difference. */
  drift?: number | null;
  /** Its median over the candidate's: the speedup against it. */
  speedup?: number | null;
  /** That speedup's interval. */
  speedup_ci95?: [number, number] | null;
  /** The verdict's interval before it was widened (sampling noise alone). */
  speedup_ci95_sampling?: [number, number] | null;
}

/** Why a candidate could not be judged normally (it failed to load, raised, or crashed). */
export interface VerdictError {
  /**
   * The step: `load`, `correctness`, `timing`, `outputs`, or `candidate` (its worker died or it
   * ran past the deadline).
   */
  phase: string;
  /** The exception's type. */
  type: string;
  /** Its message. */
  message: string;
  /** The candidate worker's traceback, when there is one. */
  traceback: string;
}

/**
 * The verdict. `correct` and `flags` are decided by a worker that never ran candidate code.
 *
 * @example
 * ```ts
 * import type { Verdict } from "./verdict.ts";
 * function accepted(verdict: Verdict): boolean {
 *   return verdict.correct && verdict.flags.length === 0;
 * }
 * ```
 */
export interface Verdict {
  /** Every correctness set's outputs matched the reference's within tolerance. */
  correct: boolean;
  /** The flags raised ({@linkcode VERDICT_FLAGS}); empty for a clean verdict. */
  flags: VerdictFlag[];
  /** Where the models ran: `cuda` on a GPU server, `cpu` on a CPU server. */
  device: "cuda" | "cpu";
  /** Reference median over candidate median (null without timings). */
  speedup: number | null;
  /**
   * A conservative 95 % interval of `speedup` from the two medians' intervals; with a reference
   * bracket, the smallest interval that holds it and the interval of the speedup against the
   * bracket (`reference_bracket`).
   */
  speedup_ci95: [number, number] | null;
  /**
   * The reference timed a second time, in the candidate's worker before the candidate loaded
   * (`EvaluateOptions.bracket`); absent without timings or with `bracket: false`.
   */
  reference_bracket?: VerdictBracket;
  /** The reference's timing (null when the candidate could not be timed). */
  reference: VerdictTiming | null;
  /** The candidate's timing. */
  candidate: VerdictTiming | null;
  /** The candidate timing's GPU-state receipt. */
  receipt: Record<string, unknown> | null;
  /** The evidence behind `correct` and each flag (docs/eval.md). */
  checks: Record<string, unknown>;
  /** Where the time to this verdict went. */
  phases_ms: VerdictPhases;
  /** The step timings inside the workers, ms, as they reported them. */
  worker_phases_ms: Record<string, number | null>;
  /** How many input sets were drawn: correctness and timing (never the seeds). */
  seeds: { correctness: number; timing: number };
  /** The request ids of the three steps. */
  request_ids: { inputs: string; candidate: string | null; judge: string };
  /** Set when the candidate failed to load, raised or crashed (then `correct` is false). */
  error?: VerdictError;
}

/**
 * Whether a verdict accepts the candidate: correct and without a flag (`kcoral eval`'s exit 0).
 *
 * @example
 * ```ts
 * import { isAccepted } from "./verdict.ts";
 * if (isAccepted({ correct: true, flags: ["throttled"] } as never)) throw new Error();
 * ```
 */
export function isAccepted(verdict: Pick<Verdict, "correct" | "flags">): boolean {
  return verdict.correct && verdict.flags.length === 0;
}

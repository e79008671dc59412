/**
 * The fields of a COMPLETED/FAILED `/execute` body (spec protocol §3.1, §3.4), declared once: what
 * the server knows about an attempt ({@linkcode ResultMeta}), what every such body carries
 * ({@linkcode CommonResultFields}), the encoder's input ({@linkcode ResultFields}), the decoder's
 * output ({@linkcode DecodedResult}) and the `error` object ({@linkcode ExecutionErrorInfo},
 * {@linkcode ERROR_FIELDS}, {@linkcode GPU_ACCESS_FIELDS}).
 *
 * Names are the camelCase forms of the JSON keys (`queueMs` is `queue_ms`).
 *
 * @module
 */

import type { DecodedValue } from "./values.ts";

/**
 * Identity and timings of one attempt: what the server knows before it reads the worker's outcome.
 *
 * @example
 * ```ts
 * import type { ResultMeta } from "./result_fields.ts";
 *
 * const meta: ResultMeta = {
 *   requestId: "r", queueMs: 0, elapsedMs: 1.5, leaseWaitMs: 0, leaseHeldMs: 1, gpuIds: [0, 1],
 * };
 * ```
 */
export interface ResultMeta {
  /** The request id (also sent as `X-Request-ID`). */
  requestId: string;
  /** Milliseconds waiting for a worker. */
  queueMs: number;
  /** Milliseconds from worker assignment to outcome (lease waiting included). */
  elapsedMs: number;
  /** Part of `elapsedMs` spent waiting for the GPU lease. */
  leaseWaitMs: number;
  /** Part of `elapsedMs` spent holding the GPU lease. */
  leaseHeldMs: number;
  /** Physical GPU ids; sent (with `gpu_count`) only when the request set `options.gpu_count`. */
  gpuIds?: number[];
}

/**
 * The fields every COMPLETED/FAILED body has, besides `results` and `error`.
 *
 * @example
 * ```ts
 * import type { CommonResultFields } from "./result_fields.ts";
 *
 * function summary(fields: CommonResultFields): string {
 *   return `${fields.requestId}: ${fields.status} in ${fields.elapsedMs} ms`;
 * }
 * ```
 */
export interface CommonResultFields extends ResultMeta {
  /** Program outcome. */
  status: "COMPLETED" | "FAILED";
  /** Captured standard output (head, up to the limit). */
  stdout: string;
  /** Captured standard error (head, up to the limit). */
  stderr: string;
  /** More than the limit was written to stdout. */
  stdoutTruncated: boolean;
  /** More than the limit was written to stderr. */
  stderrTruncated: boolean;
}

/**
 * The fields of a COMPLETED/FAILED body, for `resultJson` (the encoder): `results` and `error` as
 * raw JSON text.
 */
export interface ResultFields extends CommonResultFields {
  /** Raw JSON text of the `results` object, inserted verbatim. */
  resultsJson: string;
  /** Raw JSON text of the `error` object (FAILED only), inserted verbatim. */
  errorJson?: string;
}

/**
 * The `error` object of a FAILED result (spec §3.4).
 *
 * @example
 * ```ts
 * import type { ExecutionErrorInfo } from "../mod.ts";
 *
 * function describe(error: ExecutionErrorInfo): string {
 *   return `instruction ${error.instructionIndex} (${error.instructionOp}) failed: ${error.message}`;
 * }
 * ```
 */
export interface ExecutionErrorInfo {
  /** `parse`, `compile`, `runtime`, `gpu_access`, `correctness`, `serialization`, `unavailable` or `engine`. */
  kind: string;
  /** Human-readable message, e.g. `ValueError: bad`. */
  message: string;
  /** 0-based index of the failing instruction. */
  instructionIndex: number;
  /** `upload`, `get_function`, `run` or `return`. */
  instructionOp: string;
  /** The failing instruction's id (`null` for `return`). */
  instructionId: string | null;
  /** Python traceback (its last 8192 characters). */
  traceback: string;
  /** `gpu_access` only: the CUDA call entered. */
  cudaCall?: string;
  /** `gpu_access` only: where it was called. */
  location?: string;
  /** `gpu_access` only: the request that held the GPU then, if any. */
  interferedRequestId?: string | null;
}

/**
 * A decoded COMPLETED/FAILED body (`decodeProgramResult`'s output).
 *
 * @example
 * ```ts
 * import { ProgramResult } from "../mod.ts";
 *
 * const result = new ProgramResult({
 *   status: "COMPLETED", requestId: "r", queueMs: 0, elapsedMs: 0, leaseWaitMs: 0, leaseHeldMs: 0,
 *   results: new Map(), stdout: "", stderr: "", stdoutTruncated: false, stderrTruncated: false,
 *   error: null, gpuIds: [],
 * });
 * ```
 */
export interface DecodedResult<T> extends CommonResultFields {
  /** Returned values by key, in response order. */
  results: Map<string, DecodedValue<T>>;
  /** The failure, for FAILED. */
  error: ExecutionErrorInfo | null;
  /** GPUs used (empty unless `gpu_count` was requested). */
  gpuIds: number[];
}

/** The fields of a FAILED body's `error` object, in wire order (spec §3.4). */
export const ERROR_FIELDS: readonly string[] = [
  "kind",
  "message",
  "instruction_index",
  "instruction_op",
  "instruction_id",
  "traceback",
];

/**
 * The fields a `gpu_access` error adds after {@linkcode ERROR_FIELDS}, in wire order.
 */
export const GPU_ACCESS_FIELDS: readonly string[] = [
  "cuda_call",
  "location",
  "interfered_request_id",
];

/**
 * ProgramResult: a decoded COMPLETED/FAILED outcome (spec protocol §5.4).
 *
 * @module
 */

import type { DecodedResult, ExecutionErrorInfo } from "../protocol/result_fields.ts";
import type { GpuReceipt } from "../protocol/gpu_receipt.ts";
import type { ValueFactories } from "../protocol/values.ts";
import { ReturnedFile, ReturnedFolder } from "./artifacts.ts";
import { Tensor } from "./tensor.ts";
import { noteReturned } from "./_known_digests.ts";
import { KeptReturn } from "./kept_return.ts";

/**
 * A decoded returned value: `null`, `boolean`, integers (`number`, or
 * `bigint` beyond ±(2^53-1)), `number`, `string`, arrays, objects as `Map`s
 * (key order as sent), `Uint8Array` (bytes), {@linkcode Tensor},
 * {@linkcode ReturnedFile}, {@linkcode ReturnedFolder}, or a {@linkcode KeptReturn} (a value the
 * server kept, when the request asked it to).
 *
 * @example
 * ```ts
 * import { type ResultValue, Tensor } from "./mod.ts";
 *
 * function show(value: ResultValue): string {
 *   return value instanceof Tensor ? `${value.dtype}[${value.shape}]` : String(value);
 * }
 * ```
 */
export type ResultValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | ResultValue[]
  | Map<string, ResultValue>
  | Uint8Array
  | Tensor
  | ReturnedFile
  | ReturnedFolder
  | KeptReturn;

/**
 * How response values become client objects (for `decodeProgramResult`).
 *
 * @example
 * ```ts
 * import { RESULT_FACTORIES } from "./result.ts";
 * import { ReturnedFile } from "./artifacts.ts";
 *
 * if (!(RESULT_FACTORIES.file(new Uint8Array([1])) instanceof ReturnedFile)) throw new Error();
 * ```
 */
export const RESULT_FACTORIES: ValueFactories<ResultValue> = {
  tensor: (dtype, shape, data) => Tensor.fromBytes(dtype, shape, data),
  bytes: (data, sha256) => {
    noteReturned(data, sha256);
    return data;
  },
  file: (data) => new ReturnedFile(data),
  folder: (files, directories) =>
    new ReturnedFolder(files as Map<string, ReturnedFile>, directories),
};

/**
 * {@linkcode RESULT_FACTORIES} and `kept` nodes as {@linkcode KeptReturn}s: the answer to a
 * request that asked for kept returns (any other answer refuses them).
 *
 * @example
 * ```ts
 * import { KEPT_RESULT_FACTORIES } from "./result.ts";
 * import { KeptReturn } from "./kept_return.ts";
 *
 * const kept = KEPT_RESULT_FACTORIES.kept?.({ kind: "bytes", sha256: "ab".repeat(32), size: 9 });
 * if (!(kept instanceof KeptReturn) || kept.size !== 9) throw new Error();
 * ```
 */
export const KEPT_RESULT_FACTORIES: ValueFactories<ResultValue> = {
  ...RESULT_FACTORIES,
  kept: (node) => new KeptReturn(node),
};

/**
 * The outcome of one program: COMPLETED, or FAILED with `error` (instruction
 * failures are data, not exceptions). `results` holds every return that ran,
 * even before a failure.
 *
 * @example
 * ```ts
 * import { ProgramResult } from "./mod.ts";
 *
 * const result = new ProgramResult({
 *   status: "COMPLETED", requestId: "r", queueMs: 0, elapsedMs: 1, leaseWaitMs: 0,
 *   leaseHeldMs: 1, results: new Map([["output", 6]]), stdout: "", stderr: "",
 *   stdoutTruncated: false, stderrTruncated: false, error: null, gpuIds: [],
 * });
 * if (!result.completed || result.get("output") !== 6) throw new Error();
 * ```
 */
export class ProgramResult {
  /** `COMPLETED` or `FAILED` (CACHE_MISS is handled by the client). */
  readonly status: "COMPLETED" | "FAILED";
  /** The request id of the last attempt. */
  readonly requestId: string;
  /** Milliseconds waiting for a worker. */
  readonly queueMs: number;
  /** Milliseconds on the worker (lease waiting included). */
  readonly elapsedMs: number;
  /** Part of `elapsedMs` waiting for the GPU lease. */
  readonly leaseWaitMs: number;
  /** Part of `elapsedMs` holding the GPU lease. */
  readonly leaseHeldMs: number;
  /** Returned values by key, in response order. */
  readonly results: ReadonlyMap<string, ResultValue>;
  /** Captured standard output (the head, up to the limit). */
  readonly stdout: string;
  /** Captured standard error (the head, up to the limit). */
  readonly stderr: string;
  /** More stdout was written than captured. */
  readonly stdoutTruncated: boolean;
  /** More stderr was written than captured. */
  readonly stderrTruncated: boolean;
  /** What failed (kind, message, instruction index/op/id, traceback), or null. */
  readonly error: ExecutionErrorInfo | null;
  /** Physical GPU ids used; empty unless `gpuCount` was requested. */
  readonly gpuIds: readonly number[];
  /**
   * The GPU-state receipt (the `X-KCoral-GPU-Receipt` header): which GPU(s) the request's lease
   * covered and one NVML reading of each (clocks, temperature, power, clock-event reasons,
   * `throttled`) when it first held the lease and one when it gave it back. `null` when the
   * request never held a GPU lease (a CPU server, a program that never needed the GPU), from a
   * server without receipts (upstream), or when the header was malformed (the result stands).
   *
   * @example
   * ```ts
   * import { ProgramResult } from "./mod.ts";
   *
   * const result = new ProgramResult({
   *   status: "COMPLETED", requestId: "r", queueMs: 0, elapsedMs: 2, leaseWaitMs: 0,
   *   leaseHeldMs: 1.5, results: new Map(), stdout: "", stderr: "",
   *   stdoutTruncated: false, stderrTruncated: false, error: null, gpuIds: [],
   * }, {
   *   gpus: [{ index: 0, name: "NVIDIA H100 80GB HBM3", uuid: "GPU-5f2e", driver_version: "580.95.05",
   *     cuda_driver_version: "13.0", throttled: false, released: null,
   *     acquired: { sm_clock_mhz: 1980, mem_clock_mhz: 2619, temperature_c: 35, power_w: 72.5,
   *       reasons: ["gpu_idle"], throttled: false } }],
   *   throttled: false, nvml_error: null, taken_by: "worker", server_reason: null,
   * });
   * const gpu = result.gpuReceipt?.gpus[0];
   * if (result.gpuReceipt?.throttled || gpu?.acquired?.sm_clock_mhz !== 1980) throw new Error();
   * console.log(`${gpu.name} (${gpu.uuid}) at ${gpu.acquired.sm_clock_mhz} MHz`);
   * ```
   */
  readonly gpuReceipt: GpuReceipt | null;

  /**
   * The node that ran the program, when a Router answered (its `X-KCoral-Node`); `null` from a
   * server. Send it as `ExecuteOptions.node` to run a later program there (e.g. one that names
   * this program's {@linkcode KeptReturn}s).
   */
  readonly node: string | null;

  /**
   * Wrap decoded fields, the answer's GPU-state receipt, if it had one, and the node that
   * answered through a Router (the client does this).
   */
  constructor(
    fields: DecodedResult<ResultValue>,
    gpuReceipt: GpuReceipt | null = null,
    node: string | null = null,
  ) {
    this.status = fields.status;
    this.requestId = fields.requestId;
    this.queueMs = fields.queueMs;
    this.elapsedMs = fields.elapsedMs;
    this.leaseWaitMs = fields.leaseWaitMs;
    this.leaseHeldMs = fields.leaseHeldMs;
    this.results = fields.results;
    this.stdout = fields.stdout;
    this.stderr = fields.stderr;
    this.stdoutTruncated = fields.stdoutTruncated;
    this.stderrTruncated = fields.stderrTruncated;
    this.error = fields.error;
    this.gpuIds = Object.freeze([...fields.gpuIds]);
    this.gpuReceipt = gpuReceipt;
    this.node = node;
  }

  /** Whether every instruction completed. */
  get completed(): boolean {
    return this.status === "COMPLETED";
  }

  /** Whether a value was returned under `key`. */
  has(key: string): boolean {
    return this.results.has(key);
  }

  /**
   * The value returned under `key` (cast to `T` for convenience).
   *
   * @throws {RangeError} when nothing was returned under `key`.
   */
  get<T extends ResultValue = ResultValue>(key: string): T {
    if (!this.results.has(key)) throw new RangeError(`no result under key ${JSON.stringify(key)}`);
    return this.results.get(key) as T;
  }
}

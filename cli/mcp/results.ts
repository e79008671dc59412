/**
 * The parts of a KCoral result every `kcoral mcp` tool returns: the server's timings, the
 * captured output with its truncation flags, and returned values as JSON (tensors, bytes and
 * files inline when small, saved to the call's directory otherwise).
 *
 * @module
 */
import { z } from "zod";
import {
  type ProgramResult,
  type ResultValue,
  ReturnedFile,
  ReturnedFolder,
  Tensor,
} from "../../client/mod.ts";
import { Buffer } from "node:buffer";
import type { CallFiles } from "./files.ts";

/** The server's timing fields of one request. */
export const timingsSchema = z.object({
  request_id: z.string().describe("the server's request id"),
  queue_ms: z.number().describe("milliseconds waiting for a worker"),
  elapsed_ms: z.number().describe("milliseconds on the worker (lease wait included)"),
  lease_wait_ms: z.number().describe("part of elapsed_ms waiting for the GPU lease"),
  lease_held_ms: z.number().describe("part of elapsed_ms holding the GPU lease"),
});

/** The captured output of one request. */
export const outputShape = {
  stdout: z.string().describe("captured standard output (its head, up to the output limit)"),
  stderr: z.string().describe("captured standard error (its head, up to the output limit)"),
  stdout_truncated: z.boolean().describe("more stdout was written than captured"),
  stderr_truncated: z.boolean().describe("more stderr was written than captured"),
};

/**
 * The timing fields of `result`.
 *
 * @example
 * ```ts
 * import { ProgramResult } from "../../client/mod.ts";
 * import { timingsOf } from "./results.ts";
 *
 * const result = new ProgramResult({
 *   status: "COMPLETED", requestId: "r1", queueMs: 1, elapsedMs: 9, leaseWaitMs: 2, leaseHeldMs: 5,
 *   results: new Map(), stdout: "", stderr: "", stdoutTruncated: false, stderrTruncated: false,
 *   error: null, gpuIds: [],
 * });
 * const t = timingsOf(result);
 * if (t.queue_ms !== 1 || t.lease_held_ms !== 5 || t.request_id !== "r1") throw new Error();
 * ```
 */
export function timingsOf(result: ProgramResult): z.infer<typeof timingsSchema> {
  return {
    request_id: result.requestId,
    queue_ms: result.queueMs,
    elapsed_ms: result.elapsedMs,
    lease_wait_ms: result.leaseWaitMs,
    lease_held_ms: result.leaseHeldMs,
  };
}

/**
 * The captured output of `result` and its truncation flags.
 *
 * @example
 * ```ts
 * import { ProgramResult } from "../../client/mod.ts";
 * import { outputOf } from "./results.ts";
 *
 * const result = new ProgramResult({
 *   status: "COMPLETED", requestId: "r", queueMs: 0, elapsedMs: 0, leaseWaitMs: 0, leaseHeldMs: 0,
 *   results: new Map(), stdout: "hi\n", stderr: "", stdoutTruncated: true, stderrTruncated: false,
 *   error: null, gpuIds: [],
 * });
 * if (outputOf(result).stdout !== "hi\n" || !outputOf(result).stdout_truncated) throw new Error();
 * ```
 */
export function outputOf(result: ProgramResult): {
  stdout: string;
  stderr: string;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
} {
  return {
    stdout: result.stdout,
    stderr: result.stderr,
    stdout_truncated: result.stdoutTruncated,
    stderr_truncated: result.stderrTruncated,
  };
}

/** Tensors up to this many elements are returned as a JSON list. */
export const INLINE_TENSOR_ELEMENTS = 4096;

/**
 * A returned value as JSON: scalars, lists and objects as they are; integers beyond 2^53 as
 * `{"$int": "digits"}`; bytes as `{"$bytes": {size, base64 | saved_path}}`; tensors as
 * `{"$tensor": {dtype, shape, data | saved_path}}` (raw little-endian bytes when saved);
 * files as `{"$file": {...}}` and folders as `{"$folder": [...]}` with each file inline or
 * saved. `name` is the file name used when something is saved.
 *
 * @example
 * ```ts
 * import { Tensor } from "../../client/mod.ts";
 * import { CallFiles } from "./files.ts";
 * import { valueToJson } from "./results.ts";
 *
 * const files = new CallFiles("/nonexistent", "run_program", 1024);
 * const value = new Map<string, unknown>([["t", new Tensor("float32", [2], new Float32Array([1, 2]))]]);
 * const json = await valueToJson(value as never, "out", files);
 * if (JSON.stringify(json) !== '{"t":{"$tensor":{"dtype":"float32","shape":[2],"data":[1,2]}}}') {
 *   throw new Error(JSON.stringify(json));
 * }
 * ```
 */
export async function valueToJson(
  value: ResultValue,
  name: string,
  files: CallFiles,
): Promise<unknown> {
  if (value === null || typeof value === "boolean" || typeof value === "string") return value;
  if (typeof value === "number") return Number.isFinite(value) ? value : { $float: String(value) };
  if (typeof value === "bigint") return { $int: value.toString() };
  if (Array.isArray(value)) {
    return await Promise.all(
      value.map((item, index) => valueToJson(item, `${name}.${index}`, files)),
    );
  }
  if (value instanceof Map) {
    const object: Record<string, unknown> = {};
    for (const [key, item] of value) {
      object[key] = await valueToJson(item, `${name}.${safeName(key)}`, files);
    }
    return object;
  }
  if (value instanceof Uint8Array) {
    return {
      $bytes: value.length <= files.inlineLimit
        ? { size: value.length, base64: Buffer.from(value).toString("base64") }
        : { size: value.length, saved_path: await files.save(`${name}.bin`, value) },
    };
  }
  if (value instanceof Tensor) return { $tensor: await _tensor(value, name, files) };
  if (value instanceof ReturnedFile) return { $file: await files.describe(name, value) };
  if (value instanceof ReturnedFolder) {
    const entries = [];
    for (const [path, file] of value.files) {
      entries.push(await files.describe(`${name}/${path}`, file));
    }
    return { $folder: entries };
  }
  throw new TypeError(`unexpected result value: ${Object.prototype.toString.call(value)}`);
}

async function _tensor(tensor: Tensor, name: string, files: CallFiles) {
  const head = { dtype: tensor.dtype, shape: [...tensor.shape] };
  const data = tensor.data;
  const numeric = !(data instanceof Uint8Array) || tensor.dtype === "uint8" ||
    tensor.dtype === "bool";
  if (numeric && tensor.size <= INLINE_TENSOR_ELEMENTS) {
    const values = data instanceof BigInt64Array
      ? Array.from(data, (v) => (v >= -(2n ** 53n) && v <= 2n ** 53n ? Number(v) : v.toString()))
      : Array.from(data as ArrayLike<number>, (v) => (tensor.dtype === "bool" ? v !== 0 : v));
    return { ...head, data: values };
  }
  return { ...head, saved_path: await files.save(`${name}.bin`, tensor.bytes()) };
}

/**
 * `key` as one safe file name component: characters other than letters, digits, `_`, `.` and
 * `-` become `_`, a leading dot too.
 *
 * @example
 * ```ts
 * import { safeName } from "./results.ts";
 *
 * if (safeName("../report 1") !== "__report_1") throw new Error(safeName("../report 1"));
 * ```
 */
export function safeName(key: string): string {
  const cleaned = key.replace(/[^A-Za-z0-9_.-]/g, "_").replace(/^\.+/, "_");
  return cleaned === "" ? "_" : cleaned.slice(0, 100);
}

/**
 * The GPU-state receipt of a request, an extension of `POST /execute` answers (docs/timing.md, "The
 * receipt of every request"): a 200 COMPLETED/FAILED answer whose request held a GPU lease carries
 * `X-KCoral-GPU-Receipt`, compact JSON (non-ASCII escaped) of the GPUs the lease covered with an
 * NVML reading when first acquired and when last released. When the worker gave none (it died or
 * was killed), the server reads the GPUs itself (`taken_by: "server"`). One reader,
 * {@linkcode readGpuReceipt}, serves both the server and the client, so both accept the same
 * shapes.
 *
 * @module
 */

/** The response header that carries the receipt (lower case, as `Headers` gives names). */
export const GPU_RECEIPT_HEADER = "x-kcoral-gpu-receipt";

/** One NVML reading of a GPU. A quantity NVML could not give is `null`. */
export interface GpuReading {
  /** SM clock, MHz. */
  sm_clock_mhz: number | null;
  /** Memory clock, MHz. */
  mem_clock_mhz: number | null;
  /** GPU temperature, °C. */
  temperature_c: number | null;
  /** Board power, W (a one-second average on H100/H200). */
  power_w: number | null;
  /** Clock-event reasons at the reading, by name (`gpu_idle`, `sw_power_cap`, ...). */
  reasons: string[];
  /** A power or thermal reason was lowering the clocks. */
  throttled: boolean;
}

/** One GPU the request's lease covered. */
export interface GpuReceiptDevice {
  /** The server's index of the GPU (NVML numbering, as in `--gpus` and `gpu_ids`). */
  index: number;
  /** NVML's name of the GPU (`null` without NVML). */
  name: string | null;
  /** Its UUID, `GPU-…` (`null` when neither NVML nor the server knows it). */
  uuid: string | null;
  /** The driver version (`null` without NVML). */
  driver_version: string | null;
  /** The CUDA version the driver supports, e.g. `"13.0"` (`null` without NVML). */
  cuda_driver_version: string | null;
  /** The reading when the request first held the lease (`null` without NVML). */
  acquired: GpuReading | null;
  /** The reading when it last gave the lease back or answered (`null` without one). */
  released: GpuReading | null;
  /** Either reading was throttled. */
  throttled: boolean;
}

/** The GPU-state receipt of one request. */
export interface GpuReceipt {
  /** The GPUs the lease covered, in the order of `gpu_ids`. */
  gpus: GpuReceiptDevice[];
  /** A reading of any of them was throttled. */
  throttled: boolean;
  /** Why NVML gave nothing (or not everything), when it did not. */
  nvml_error: string | null;
  /**
   * Who took the readings: `"worker"` (the process the program ran in, as it held and gave back the
   * lease) or `"server"` (the worker gave none; see `server_reason`). A header without the field (a
   * server from before it) reads as `"worker"`.
   */
  taken_by: "worker" | "server";
  /**
   * Why the server took the receipt (`null` when the worker did): {@linkcode SERVER_REASONS}.
   */
  server_reason: string | null;
}

/** Why the server took a request's receipt: one of {@linkcode SERVER_REASONS}. */
export type GpuReceiptServerReason = (typeof SERVER_REASONS)[number];

/**
 * Why the server took a request's receipt instead of its worker: `crashed` (the worker died),
 * `timeout` (killed at its deadline), `invalid_response` (killed for an answer that was not one),
 * `not_reported` (it answered without one though the request held the lease: a GPU set held for a
 * program that never asked for it), `refused` (its report had the wrong shape or named another GPU;
 * no reading then, `nvml_error` says why).
 */
export const SERVER_REASONS = [
  "crashed",
  "timeout",
  "invalid_response",
  "not_reported",
  "refused",
] as const;

/** Bounds on what a receipt may hold (a worker's report is untrusted). */
const _MAX_GPUS = 64;
const _MAX_STRING = 256;
const _MAX_ERROR = 1024;
const _MAX_REASONS = 64;

/**
 * A receipt read from a parsed JSON value: the known fields only, checked (unknown keys are left
 * out); throws a `TypeError` that names the first field in the wrong shape.
 */
export function readGpuReceipt(value: unknown): GpuReceipt {
  const top = _object(value, "receipt");
  const gpus = top.gpus;
  if (!Array.isArray(gpus) || gpus.length > _MAX_GPUS) {
    throw new TypeError(`receipt.gpus is not an array of at most ${_MAX_GPUS}`);
  }
  return {
    gpus: gpus.map((gpu, k) => _device(gpu, `receipt.gpus[${k}]`)),
    throttled: _boolean(top.throttled, "receipt.throttled"),
    nvml_error: _string(top.nvml_error, "receipt.nvml_error", _MAX_ERROR),
    taken_by: _taker(top.taken_by),
    server_reason: _string(top.server_reason ?? null, "receipt.server_reason", _MAX_STRING),
  };
}

/**
 * The header value of a receipt: compact JSON, every character beyond ASCII escaped (`\uXXXX`), so
 * the value is plain ASCII without control characters.
 */
export function encodeGpuReceiptHeader(receipt: GpuReceipt): string {
  return JSON.stringify(readGpuReceipt(receipt)).replace(
    /[\u007f-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

/**
 * The receipt in a header value (`null` for `null`: no header); throws a `TypeError` for a value
 * that is not JSON or not a receipt.
 */
export function decodeGpuReceiptHeader(value: string | null): GpuReceipt | null {
  if (value === null) return null;
  let parsed: unknown;
  try {
    parsed = JSON.parse(value);
  } catch (error) {
    throw new TypeError(`receipt header is not JSON: ${(error as Error).message}`);
  }
  return readGpuReceipt(parsed);
}

function _device(value: unknown, where: string): GpuReceiptDevice {
  const gpu = _object(value, where);
  const index = gpu.index;
  if (typeof index !== "number" || !Number.isInteger(index) || index < 0) {
    throw new TypeError(`${where}.index is not a non-negative integer`);
  }
  return {
    index,
    name: _string(gpu.name, `${where}.name`, _MAX_STRING),
    uuid: _string(gpu.uuid, `${where}.uuid`, _MAX_STRING),
    driver_version: _string(gpu.driver_version, `${where}.driver_version`, _MAX_STRING),
    cuda_driver_version: _string(
      gpu.cuda_driver_version,
      `${where}.cuda_driver_version`,
      _MAX_STRING,
    ),
    acquired: _reading(gpu.acquired, `${where}.acquired`),
    released: _reading(gpu.released, `${where}.released`),
    throttled: _boolean(gpu.throttled, `${where}.throttled`),
  };
}

function _reading(value: unknown, where: string): GpuReading | null {
  if (value === null) return null;
  const reading = _object(value, where);
  const reasons = reading.reasons;
  if (
    !Array.isArray(reasons) || reasons.length > _MAX_REASONS ||
    !reasons.every((r) => typeof r === "string" && r.length <= _MAX_STRING)
  ) {
    throw new TypeError(`${where}.reasons is not a list of names`);
  }
  return {
    sm_clock_mhz: _number(reading.sm_clock_mhz, `${where}.sm_clock_mhz`),
    mem_clock_mhz: _number(reading.mem_clock_mhz, `${where}.mem_clock_mhz`),
    temperature_c: _number(reading.temperature_c, `${where}.temperature_c`),
    power_w: _number(reading.power_w, `${where}.power_w`),
    reasons: [...reasons],
    throttled: _boolean(reading.throttled, `${where}.throttled`),
  };
}

function _taker(value: unknown): GpuReceipt["taken_by"] {
  if (value === undefined || value === "worker") return "worker";
  if (value === "server") return "server";
  throw new TypeError('receipt.taken_by is not "worker" or "server"');
}

function _object(value: unknown, where: string): Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new TypeError(`${where} is not an object`);
  }
  return value as Record<string, unknown>;
}

function _string(value: unknown, where: string, max: number): string | null {
  if (value === null) return null;
  if (typeof value !== "string" || value.length > max) {
    throw new TypeError(`${where} is not a string of at most ${max} characters or null`);
  }
  return value;
}

function _number(value: unknown, where: string): number | null {
  if (value === null) return null;
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new TypeError(`${where} is not a number or null`);
  }
  return value;
}

function _boolean(value: unknown, where: string): boolean {
  if (typeof value !== "boolean") throw new TypeError(`${where} is not a boolean`);
  return value;
}

/**
 * The GPU-state receipt a worker reported with its outcome (`gpu_receipt`, written by
 * `runtime_py/kcoral_runtime/gpu_receipt.py`), made the receipt the answer carries in its
 * `X-KCoral-GPU-Receipt` header (protocol/gpu_receipt.ts): each GPU gets the server's index, in
 * the order of the request's GPUs, and a UUID the server knows (its NVML inventory) must be the
 * one the worker read, or fills in one it could not read. The report comes from the process the
 * program ran in: one that has the wrong shape, or names another GPU, is not passed on; the
 * receipt then names the GPUs from the inventory and says so in `nvml_error`.
 *
 * A request that held the lease but whose worker gave no receipt (it died, was killed at its
 * deadline, or never asked for a GPU set's lease) gets the server's own reading instead
 * ({@linkcode gpuReceiptFromServer}, server/workers/gpu_reading.ts), `taken_by` `"server"` and
 * `server_reason` saying why.
 *
 * @module
 */
import {
  encodeGpuReceiptHeader,
  GPU_RECEIPT_HEADER,
  type GpuReceipt,
  type GpuReceiptServerReason,
  readGpuReceipt,
} from "../../protocol/gpu_receipt.ts";
import type { GpuDevice } from "../workers/devices.ts";
import type { GpuStateReading } from "../workers/gpu_reading.ts";

/**
 * The receipt for the answer from the worker's `report` (`null` when the worker sent none: the
 * request never held the lease) and the request's GPUs, in lease order.
 *
 * @example
 * ```ts
 * import { gpuReceiptFromWorker } from "./gpu_receipt.ts";
 *
 * const gpus = [{ index: 3, uuid: "GPU-abc", minor: 3 }];
 * const receipt = gpuReceiptFromWorker({
 *   gpus: [{ name: "NVIDIA H100 80GB HBM3", uuid: null, driver_version: "580.95.05",
 *     cuda_driver_version: "13.0", acquired: null, released: null, throttled: false }],
 *   throttled: false, nvml_error: null,
 * }, gpus);
 * if (receipt?.gpus[0].index !== 3 || receipt.gpus[0].uuid !== "GPU-abc") throw new Error();
 * const forged = gpuReceiptFromWorker({ gpus: [], throttled: false, nvml_error: null }, gpus);
 * if (!forged?.nvml_error?.startsWith("the worker's receipt was refused")) throw new Error();
 * if (forged.taken_by !== "server" || forged.server_reason !== "refused") throw new Error();
 * if (gpuReceiptFromWorker(undefined, gpus) !== null) throw new Error();
 * ```
 */
export function gpuReceiptFromWorker(
  report: unknown,
  gpus: readonly GpuDevice[],
): GpuReceipt | null {
  if (report === undefined || report === null) return null;
  try {
    return { ..._checked(report, gpus), taken_by: "worker", server_reason: null };
  } catch (error) {
    return _unread(
      gpus,
      "refused",
      `the worker's receipt was refused: ${(error as Error).message}`,
    );
  }
}

/**
 * The receipt the server took itself, from its `reading` of the request's GPUs (in lease order),
 * because of `reason`. A reading that failed, or that does not fit the GPUs, still makes a
 * receipt: the GPUs named from the inventory, readings `null`, and `nvml_error` saying why.
 *
 * @example
 * ```ts
 * import { gpuReceiptFromServer } from "./gpu_receipt.ts";
 *
 * const gpus = [{ index: 1, uuid: "GPU-abc", minor: 1 }];
 * const reading = { sm_clock_mhz: 1980, mem_clock_mhz: 2619, temperature_c: 35, power_w: 72.5,
 *   reasons: ["gpu_idle"], throttled: false };
 * const receipt = gpuReceiptFromServer({ report: {
 *   gpus: [{ name: "NVIDIA H100 80GB HBM3", uuid: "GPU-abc", driver_version: "580.95.05",
 *     cuda_driver_version: "13.0", acquired: null, released: reading, throttled: false }],
 *   throttled: false, nvml_error: null,
 * } }, gpus, "crashed");
 * if (receipt.taken_by !== "server" || receipt.server_reason !== "crashed") throw new Error();
 * if (receipt.gpus[0].released?.sm_clock_mhz !== 1980 || receipt.gpus[0].index !== 1) {
 *   throw new Error();
 * }
 * const failed = gpuReceiptFromServer({ error: "the server's NVML reading took over 5000 ms" },
 *   gpus, "timeout");
 * if (failed.gpus[0].uuid !== "GPU-abc" || !failed.nvml_error?.includes("took over")) {
 *   throw new Error();
 * }
 * ```
 */
export function gpuReceiptFromServer(
  reading: GpuStateReading,
  gpus: readonly GpuDevice[],
  reason: GpuReceiptServerReason,
): GpuReceipt {
  if (reading.error !== undefined) return _unread(gpus, reason, reading.error);
  try {
    const receipt = _checked(reading.report, gpus);
    // The server's own reading: only the release side exists (the worker's is gone).
    for (const gpu of receipt.gpus) gpu.acquired = null;
    return { ...receipt, taken_by: "server", server_reason: reason };
  } catch (error) {
    return _unread(gpus, reason, `the server's NVML reading: ${(error as Error).message}`);
  }
}

/**
 * The answer's headers for `receipt`: `X-KCoral-GPU-Receipt` (none for `null`, or should the
 * receipt not encode: every receipt here is made from checked values, so that is not expected).
 *
 * @example
 * ```ts
 * import { receiptHeaders } from "./gpu_receipt.ts";
 *
 * const headers = receiptHeaders({ gpus: [], throttled: false, nvml_error: null,
 *   taken_by: "worker", server_reason: null });
 * if (!headers["x-kcoral-gpu-receipt"]?.startsWith('{"gpus":[]')) throw new Error();
 * if (Object.keys(receiptHeaders(null)).length !== 0) throw new Error();
 * ```
 */
export function receiptHeaders(receipt: GpuReceipt | null): Record<string, string> {
  if (receipt === null) return {};
  try {
    return { [GPU_RECEIPT_HEADER]: encodeGpuReceiptHeader(receipt) };
  } catch {
    return {};
  }
}

/** A receipt that names the GPUs from the inventory, without readings, and why. */
function _unread(
  gpus: readonly GpuDevice[],
  reason: GpuReceiptServerReason,
  why: string,
): GpuReceipt {
  return {
    gpus: gpus.map((device) => ({
      index: device.index,
      name: null,
      uuid: _knownUuid(device),
      driver_version: null,
      cuda_driver_version: null,
      acquired: null,
      released: null,
      throttled: false,
    })),
    throttled: false,
    nvml_error: why.slice(0, 1024),
    taken_by: "server",
    server_reason: reason,
  };
}

function _checked(report: unknown, gpus: readonly GpuDevice[]): GpuReceipt {
  if (typeof report !== "object" || report === null || Array.isArray(report)) {
    throw new TypeError("receipt is not an object");
  }
  const reported = (report as Record<string, unknown>).gpus;
  if (!Array.isArray(reported) || reported.length !== gpus.length) {
    throw new TypeError(`receipt.gpus does not list the request's ${gpus.length} GPU(s)`);
  }
  const receipt = readGpuReceipt({
    ...report,
    // Who took it is the server's to say, never the report's.
    taken_by: undefined,
    server_reason: undefined,
    gpus: reported.map((gpu, k) =>
      typeof gpu === "object" && gpu !== null ? { ...gpu, index: gpus[k].index } : gpu
    ),
  });
  receipt.gpus.forEach((gpu, k) => {
    const known = _knownUuid(gpus[k]);
    if (known === null) return;
    if (gpu.uuid === null) gpu.uuid = known;
    else if (gpu.uuid !== known) {
      throw new TypeError(`it names ${gpu.uuid} for GPU ${gpu.index}, which is ${known}`);
    }
  });
  return receipt;
}

/** The device's UUID when it is a real one (a simulated GPU's `sim-<k>` is not). */
function _knownUuid(device: GpuDevice): string | null {
  return /^(GPU|MIG)-/.test(device.uuid) ? device.uuid : null;
}

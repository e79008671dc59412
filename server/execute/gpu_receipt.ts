/**
 * The GPU-state receipt an answer carries in `X-KCoral-GPU-Receipt`, from the worker's report
 * (each GPU given the server's index; a report of the wrong shape or naming another GPU is
 * refused, the GPUs then named from the inventory with `nvml_error`), or from the server's own
 * reading when the worker gave none (`taken_by` `"server"`, `server_reason` saying why).
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

/** The receipt from the worker's `report` (`null`: none sent) for the request's GPUs in order. */
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
 * The receipt the server took itself from its `reading`, because of `reason`; a failed or
 * mismatched reading names the GPUs from the inventory with `nvml_error` saying why.
 */
export function gpuReceiptFromServer(
  reading: GpuStateReading,
  gpus: readonly GpuDevice[],
  reason: GpuReceiptServerReason,
): GpuReceipt {
  if (reading.error !== undefined) return _unread(gpus, reason, reading.error);
  try {
    const receipt = _checked(reading.report, gpus);
    for (const gpu of receipt.gpus) gpu.acquired = null;
    return { ...receipt, taken_by: "server", server_reason: reason };
  } catch (error) {
    return _unread(gpus, reason, `the server's NVML reading: ${(error as Error).message}`);
  }
}

/** The answer's headers for `receipt` (none for `null`, or for one that does not encode). */
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

/**
 * The GPU-state receipt a worker reported with its outcome (`gpu_receipt`, written by
 * `runtime_py/kcoral_runtime/gpu_receipt.py`), made the receipt the answer carries in its
 * `X-KCoral-GPU-Receipt` header (protocol/gpu_receipt.ts): each GPU gets the server's index, in
 * the order of the request's GPUs, and a UUID the server knows (its NVML inventory) must be the
 * one the worker read, or fills in one it could not read. The report comes from the process the
 * program ran in: one that has the wrong shape, or names another GPU, is not passed on; the
 * receipt then names the GPUs from the inventory and says so in `nvml_error`.
 *
 * @module
 */
import { type GpuReceipt, readGpuReceipt } from "../../protocol/gpu_receipt.ts";
import type { GpuDevice } from "../workers/devices.ts";

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
 * if (gpuReceiptFromWorker(undefined, gpus) !== null) throw new Error();
 * ```
 */
export function gpuReceiptFromWorker(
  report: unknown,
  gpus: readonly GpuDevice[],
): GpuReceipt | null {
  if (report === undefined || report === null) return null;
  try {
    return _checked(report, gpus);
  } catch (error) {
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
      nvml_error: `the worker's receipt was refused: ${(error as Error).message}`.slice(0, 1024),
    };
  }
}

function _checked(report: unknown, gpus: readonly GpuDevice[]): GpuReceipt {
  if (typeof report !== "object" || Array.isArray(report)) {
    throw new TypeError("receipt is not an object");
  }
  const reported = (report as Record<string, unknown>).gpus;
  if (!Array.isArray(reported) || reported.length !== gpus.length) {
    throw new TypeError(`receipt.gpus does not list the request's ${gpus.length} GPU(s)`);
  }
  const receipt = readGpuReceipt({
    ...report,
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

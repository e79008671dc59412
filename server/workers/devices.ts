/**
 * The GPUs a server owns: physical index → UUID and device-node minor, read through NVML without
 * creating a CUDA context. Simulated GPUs get `sim-<index>` identities and no device nodes.
 *
 * @module
 */

/** One GPU the server may hand to workers. */
export interface GpuDevice {
  /** Physical index (NVML numbering), as given in `--gpus`. */
  index: number;
  /** Identity passed in `CUDA_VISIBLE_DEVICES` (`GPU-…` UUID, or `sim-<index>`). */
  uuid: string;
  /** Minor number of `/dev/nvidia<minor>`, or `null` (simulated, or unknown). */
  minor: number | null;
}

/** The GPU inventory could not be read. */
export class DeviceError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "DeviceError";
  }
}

/** Simulated devices for the test mode. */
export function simulatedDevices(indices: readonly number[]): GpuDevice[] {
  return [...new Set(indices)].map((index) => ({ index, uuid: `sim-${index}`, minor: null }));
}

/** Reads the physical GPUs `indices` through NVML (no CUDA context); throws if any is absent. */
export async function detectDevices(
  indices: readonly number[],
  python: string,
  runtimePath: string,
): Promise<GpuDevice[]> {
  let output: Deno.CommandOutput;
  try {
    output = await new Deno.Command(python, {
      args: ["-m", "kcoral_runtime.nvml"],
      env: { PYTHONPATH: runtimePath },
      stdout: "piped",
      stderr: "piped",
    }).output();
  } catch (error) {
    throw new DeviceError(`cannot list GPUs with ${python}: ${error}`);
  }
  if (!output.success) {
    const message = new TextDecoder().decode(output.stderr).trim();
    throw new DeviceError(`cannot list GPUs: ${message}`);
  }
  const listed = JSON.parse(new TextDecoder().decode(output.stdout)) as {
    index: number;
    uuid: string;
    minor: number | null;
  }[];
  const found = new Map(listed.map((gpu) => [gpu.index, gpu]));
  const devices: GpuDevice[] = [];
  for (const index of new Set(indices)) {
    const gpu = found.get(index);
    if (!gpu) {
      throw new DeviceError(
        `GPU ${index} is not present (NVML lists ${[...found.keys()].join(", ") || "no GPU"})`,
      );
    }
    devices.push({ index, uuid: gpu.uuid, minor: gpu.minor ?? null });
  }
  return devices;
}

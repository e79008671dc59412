/**
 * How a server's workers are launched: each seat's zygote command (sandboxed when isolation is
 * on), each child's environment (`CUDA_VISIBLE_DEVICES` as UUIDs, torchrun's variables removed),
 * where a worker sees its results and blobs, and the isolation probe.
 *
 * @module
 */
import type { EventLog } from "../../http/events.ts";
import type { ServerConfig } from "../config.ts";
import type { GpuDevice } from "./devices.ts";
import { type GpuStateReading, readGpuState } from "./gpu_reading.ts";
import { MAX_FRAME_BYTES } from "./ipc.ts";
import type { Seat } from "./pool.ts";
import type { PythonInfo } from "./python_info.ts";
import {
  probeSandbox,
  slotCommand,
  type SlotLaunch,
  type WorkerPaths,
  workerPaths,
} from "./sandbox.ts";
import type { SlotCommand } from "./slot.ts";

const _TORCHRUN_VARS = [
  "RANK",
  "WORLD_SIZE",
  "LOCAL_RANK",
  "LOCAL_WORLD_SIZE",
  "GROUP_RANK",
  "ROLE_RANK",
  "ROLE_WORLD_SIZE",
  "MASTER_ADDR",
  "MASTER_PORT",
];
const _NO_MULTICAST = {
  NCCL_NVLS_ENABLE: "0",
  TORCH_SYMM_MEM_DISABLE_MULTICAST: "1",
  NVSHMEM_DISABLE_NVLS: "1",
};
/** Room in a worker frame beyond the answer itself (part and output descriptions). */
const _FRAME_OVERHEAD_BYTES = 16 * 1024 * 1024;

/** What every seat's launch shares. */
type _LaunchBase = Omit<SlotLaunch, "workspacesDir" | "workspace" | "resultsDir" | "devices">;

/** The seat (or GPU set) a launch is for: its workspaces and results directory. */
export type LaunchSeat = Pick<Seat, "workspaces" | "resultsDir">;

/** The launch of a server's workers. */
export class WorkerLaunch {
  readonly #config: ServerConfig;
  readonly #devices = new Map<number, GpuDevice>();
  #base: _LaunchBase;

  /** The launch for `config` from the interpreter, runtime, blob dir, env, GPUs and gate shim. */
  constructor(
    config: ServerConfig,
    parts: {
      python: PythonInfo;
      runtimePath: string;
      blobDir: string;
      env: Record<string, string>;
      devices: GpuDevice[];
      gateLibrary?: string | null;
    },
  ) {
    this.#config = config;
    for (const device of parts.devices) this.#devices.set(device.index, device);
    const gpuMode = config.device === "gpu";
    this.#base = {
      sandbox: config.sandbox,
      python: parts.python,
      runtimePath: parts.runtimePath,
      zygoteArgs: [
        ...(gpuMode && config.simulateGpus
          ? ["--mode", "sim", "--sim-devices", String(Math.max(...config.gpus) + 1)]
          : ["--mode", gpuMode ? "gpu" : "cpu"]),
        ...(config.preloadModules.length > 0 ? ["--preload", config.preloadModules.join(",")] : []),
      ],
      blobDir: parts.blobDir,
      readonlyPaths: config.sandboxReadonlyPaths,
      gpu: gpuMode,
      env: parts.env,
      gateLibrary: gpuMode ? parts.gateLibrary ?? null : null,
      // An answer as large as the response limit travels in one frame.
      maxFrameBytes: Math.max(MAX_FRAME_BYTES, config.maxResponseBytes + _FRAME_OVERHEAD_BYTES),
    };
  }

  /** The isolation in effect (`"none"` after a failed probe). */
  get sandbox(): "bubblewrap" | "none" {
    return this.#base.sandbox;
  }

  /** Whether workers run in a sandbox. */
  get sandboxed(): boolean {
    return this.#base.sandbox === "bubblewrap";
  }

  /** The zygote command of `seat` whose children use `gpus` (a seat's own, or a GPU set). */
  slotCommand(seat: LaunchSeat, gpus: readonly number[]): SlotCommand {
    return slotCommand(this.#launch(seat, gpus));
  }

  /** Where a worker of `seat` sees its results directory and the blobs. */
  workerPaths(seat: LaunchSeat): WorkerPaths {
    return workerPaths({ ...this.#base, resultsDir: seat.resultsDir });
  }

  /** The GPUs with these indices, in their order (those the server does not own left out). */
  devices(gpus: readonly number[]): GpuDevice[] {
    return gpus.map((g) => this.#devices.get(g)).filter((d): d is GpuDevice => d !== undefined);
  }

  /** The server's own NVML reading of `gpus`, for a request whose worker gave no receipt. */
  readGpus(gpus: readonly number[]): Promise<GpuStateReading> {
    return readGpuState(this.devices(gpus).map((d) => d.uuid), {
      python: this.#base.python.executable,
      runtimePath: this.#base.runtimePath,
      env: this.#base.env,
    });
  }

  /** The environment a new child for `gpus` gets (nothing changes on a CPU server). */
  childEnv(gpus: readonly number[]): { env: Record<string, string>; unset: string[] } {
    if (this.#config.device !== "gpu") return { env: {}, unset: [] };
    const visible = gpus.map((g) => this.#devices.get(g)!.uuid).join(",");
    const unset = [..._TORCHRUN_VARS];
    for (const name of Object.keys(this.#base.env)) {
      if (name.startsWith("TORCHELASTIC_")) unset.push(name);
    }
    return { env: { CUDA_VISIBLE_DEVICES: visible, ..._NO_MULTICAST }, unset };
  }

  /**
   * Runs the bubblewrap probe per device configuration; on failure falls back to no isolation
   * with a `sandbox_disabled` WARNING (a refused read-only path throws).
   */
  async probe(scratchDir: string, events: EventLog): Promise<void> {
    const configs = this.#devices.size ? [...this.#devices.values()].map((d) => [d]) : [[]];
    for (const devices of configs) {
      await Deno.mkdir(`${scratchDir}/ws/w0`, { recursive: true });
      await Deno.mkdir(`${scratchDir}/results`, { recursive: true });
      const reason = await probeSandbox({
        ...this.#base,
        sandbox: "bubblewrap",
        workspacesDir: `${scratchDir}/ws`,
        workspace: "w0",
        resultsDir: `${scratchDir}/results`,
        devices,
      });
      await Deno.remove(scratchDir, { recursive: true }).catch(() => {});
      if (reason !== null) {
        this.#base = { ...this.#base, sandbox: "none", readonlyPaths: [] };
        const message = `bubblewrap could not start; filesystem isolation is disabled for this ` +
          `server run (workers run WITHOUT isolation; restart to check again): ${reason}`;
        events.emit("WARNING", "sandbox_disabled", { sandbox: "none", error: reason, message });
        if (!this.#config.logConsole) console.error(`kcoral: warning: ${message}`);
        return;
      }
    }
  }

  #launch(seat: LaunchSeat, gpus: readonly number[]): SlotLaunch {
    return {
      ...this.#base,
      workspacesDir: seat.workspaces.root,
      workspace: seat.workspaces.current,
      resultsDir: seat.resultsDir,
      devices: gpus.map((g) => this.#devices.get(g)!).filter(Boolean),
    };
  }
}

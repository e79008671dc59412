/**
 * Server configuration: one schema for every option of the server guide (seed 002), with the
 * defaults the seeds give (where the upstream code disagrees, the seeds win: 256 MiB responses,
 * 16 MiB maximum captured output per stream).
 *
 * @module
 */
import { z } from "zod";

/** The configuration of one KCoral server (the fields of upstream `ServerConfig`). */
export interface ServerConfig {
  /** `"gpu"` runs programs on GPUs; `"cpu"` compiles and runs host code only. */
  device: "gpu" | "cpu";
  /** Physical GPU indices (NVML numbering) this server owns, in GPU mode. */
  gpus: number[];
  /** Number of workers in CPU mode. */
  numWorkers: number;
  /** Workers per GPU in GPU mode; they take turns on the GPU through its lease. */
  workersPerGpu: number;
  /** Requests a worker process serves before it is replaced; 0 reuses it forever. */
  maxRequestsPerWorker: number;
  /** Seconds between SIGTERM and SIGKILL when a worker's process tree is killed. */
  workerTerminationGraceSeconds: number;
  /** `"bubblewrap"` isolates every worker's files; `"none"` disables isolation. */
  sandbox: "bubblewrap" | "none";
  /** Extra read-only paths inside sandboxes (directories also join the Python path). */
  sandboxReadonlyPaths: string[];
  /** How long a request may wait for a free worker before a 503. */
  workerWaitTimeoutSeconds: number;
  /** Execution limit when a request gives none. */
  defaultTimeoutSeconds: number;
  /** Upper bound of a request's execution limit (larger requests are clamped). */
  maxTimeoutSeconds: number;
  /** Largest accepted request body, in bytes. */
  maxRequestBytes: number;
  /** Largest serialized response, in bytes. */
  maxResponseBytes: number;
  /** Captured stdout/stderr per stream when a request gives no limit, in bytes. */
  outputLimitBytes: number;
  /** Largest capture limit a request may ask for, per stream, in bytes. */
  maxOutputLimitBytes: number;
  /** Memory cache capacity for tensor, bytes and library blobs, in bytes. */
  cacheCapacityBytes: number;
  /** Disk cache directory for file uploads; `null` disables the disk cache. */
  diskCacheDir: string | null;
  /** Disk cache capacity in MiB; 0 disables the disk cache. */
  diskCacheCapacityMbytes: number;
  /** Directory for event logs; `null` disables log files (the console mirror stays). */
  logDir: string | null;
  /** Mirror events to stderr. */
  logConsole: boolean;
  /** Record every accepted program under `programs/<request-id>.json`. */
  logPrograms: boolean;
  /**
   * Test mode: GPU workers use torch CPU tensors in place of CUDA devices, one simulated
   * device per entry of `gpus`. Never the default; `/health` reports it.
   */
  simulateGpus: boolean;
  /** The Python interpreter that runs workers. */
  python: string;
}

/** Where upstream puts the disk file cache: `$XDG_CACHE_HOME/kcoral/files` or `~/.cache/...`. */
export function defaultDiskCacheDir(env: Record<string, string | undefined> = _env()): string {
  const xdg = env.XDG_CACHE_HOME;
  if (xdg && xdg.startsWith("/")) return `${xdg.replace(/\/+$/, "")}/kcoral/files`;
  const home = env.HOME ?? "/tmp";
  return `${home.replace(/\/+$/, "")}/.cache/kcoral/files`;
}

function _env(): Record<string, string | undefined> {
  try {
    return Deno.env.toObject();
  } catch {
    return {};
  }
}

const _nonNegativeInt = z.number().int().nonnegative();
const _positiveNumber = z.number().finite().positive();

const _schema = z.object({
  device: z.enum(["gpu", "cpu"]).default("gpu"),
  gpus: z.array(_nonNegativeInt).default([0]),
  numWorkers: z.number().int().min(1, "must be at least 1").default(1),
  workersPerGpu: z.number().int().min(1, "must be at least 1").default(8),
  maxRequestsPerWorker: _nonNegativeInt.default(1),
  workerTerminationGraceSeconds: z.number().finite().nonnegative().default(5),
  sandbox: z.enum(["bubblewrap", "none"]).default("bubblewrap"),
  sandboxReadonlyPaths: z.array(z.string().min(1)).default([]),
  workerWaitTimeoutSeconds: _positiveNumber.default(1800),
  defaultTimeoutSeconds: _positiveNumber.default(300),
  maxTimeoutSeconds: _positiveNumber.default(900),
  maxRequestBytes: z.number().int().positive().default(268435456),
  maxResponseBytes: z.number().int().positive().default(268435456),
  outputLimitBytes: _nonNegativeInt.default(1048576),
  maxOutputLimitBytes: _nonNegativeInt.default(16777216),
  cacheCapacityBytes: _nonNegativeInt.default(17179869184),
  diskCacheDir: z.string().nullable().optional(),
  diskCacheCapacityMbytes: _nonNegativeInt.default(16384),
  logDir: z.string().nullable().default(null),
  logConsole: z.boolean().default(true),
  logPrograms: z.boolean().default(true),
  simulateGpus: z.boolean().default(false),
  python: z.string().min(1).default("python3"),
}).strict();

/** A configuration that cannot be used; the message names the field. */
export class ConfigError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "ConfigError";
  }
}

/**
 * Fills in defaults and validates a (partial) configuration.
 *
 * @example Defaults
 * ```ts
 * import { resolveServerConfig } from "./config.ts";
 * const config = resolveServerConfig({ device: "cpu", numWorkers: 2 });
 * console.assert(config.maxRequestsPerWorker === 1);
 * ```
 */
export function resolveServerConfig(input: Partial<ServerConfig> = {}): ServerConfig {
  const parsed = _schema.safeParse(input);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const field = issue.path.join(".") || "config";
    throw new ConfigError(`invalid server configuration: ${field}: ${issue.message}`);
  }
  const value = parsed.data;
  const diskCacheDir = value.diskCacheDir === undefined
    ? defaultDiskCacheDir()
    : value.diskCacheDir === ""
    ? null
    : value.diskCacheDir;
  const config: ServerConfig = { ...value, diskCacheDir, logDir: value.logDir || null };
  if (config.device === "gpu" && config.gpus.length === 0) {
    throw new ConfigError("invalid server configuration: gpus: needs at least one GPU id");
  }
  if (config.sandbox === "none" && config.sandboxReadonlyPaths.length > 0) {
    throw new ConfigError("--sandbox-readonly-path requires --sandbox bubblewrap");
  }
  return config;
}

/** Number of distinct configured GPUs (0 on a CPU server). */
export function distinctGpuCount(config: ServerConfig): number {
  return config.device === "gpu" ? new Set(config.gpus).size : 0;
}

/**
 * The options of `kcoral server`, defined once (field, flag, environment variable, kind and
 * limits, default, help), with the server guide's defaults. `ServerConfig`, its schema, the
 * command line and its `--help` are all produced from these tables.
 *
 * @module
 */
import { processEnv } from "../options/defaults.ts";
import type { OptionRule } from "../options/schema.ts";
import type { Env, OptionTable, OptionTableValues } from "../options/spec.ts";
import { connectionOptions } from "../http/connection_options.ts";

/**
 * Where upstream puts the disk file cache: `$XDG_CACHE_HOME/kcoral/files` when that variable is
 * an absolute path, otherwise `~/.cache/kcoral/files`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { defaultDiskCacheDir } from "./config_options.ts";
 *
 * assert.equal(defaultDiskCacheDir({ HOME: "/home/u" }), "/home/u/.cache/kcoral/files");
 * assert.equal(defaultDiskCacheDir({ XDG_CACHE_HOME: "/xdg/" }), "/xdg/kcoral/files");
 * ```
 */
export function defaultDiskCacheDir(env: Env = processEnv()): string {
  const xdg = env.XDG_CACHE_HOME;
  if (xdg && xdg.startsWith("/")) return `${xdg.replace(/\/+$/, "")}/kcoral/files`;
  const home = env.HOME ?? "/tmp";
  return `${home.replace(/\/+$/, "")}/.cache/kcoral/files`;
}

/**
 * Where `kcoral server` listens: passed to the HTTP server, not part of `ServerConfig`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { serverListenOptions } from "./config_options.ts";
 *
 * assert.equal(serverListenOptions.port.env, "KCORAL_SERVER_PORT");
 * ```
 */
export const serverListenOptions = {
  /** The address to bind. */
  host: {
    flag: "--host",
    env: "KCORAL_SERVER_HOST",
    type: "string",
    default: "127.0.0.1",
    placeholder: "host",
    help: "bind address",
  },
  /** The port to listen on. */
  port: {
    flag: "--port",
    env: "KCORAL_SERVER_PORT",
    type: "int",
    min: 1,
    max: 65535,
    default: 8000,
    placeholder: "port",
    help: "port, 1-65535",
  },
} as const satisfies OptionTable;

/**
 * The configuration of one KCoral server (the fields of upstream `ServerConfig`), in `--help`
 * order. `simulateGpus` is test-only and stays out of `--help`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { serverConfigOptions } from "./config_options.ts";
 *
 * assert.equal(serverConfigOptions.logConsole.flag, "--no-log-console");
 * assert.equal(serverConfigOptions.simulateGpus.hidden, true);
 * ```
 */
export const serverConfigOptions = {
  /** `"gpu"` runs programs on GPUs; `"cpu"` compiles and runs host code only. */
  device: {
    flag: "--device",
    env: "KCORAL_SERVER_DEVICE",
    type: "choice",
    choices: ["gpu", "cpu"],
    default: "gpu",
    placeholder: "device",
    help: "gpu or cpu",
  },
  /** Physical GPU indices (NVML numbering) this server owns, in GPU mode. */
  gpus: {
    flag: "--gpus",
    env: "KCORAL_SERVER_GPUS",
    type: "list",
    items: { type: "int", min: 0 },
    separator: ",",
    listName: "GPU id list",
    default: [0],
    placeholder: "ids",
    help: "comma-separated physical GPU ids",
  },
  /** Number of workers in CPU mode. */
  numWorkers: {
    flag: "--num-workers",
    type: "int",
    min: 1,
    default: 1,
    placeholder: "n",
    help: "workers in CPU mode",
  },
  /** Workers per GPU in GPU mode; they take turns on the GPU through its lease. */
  workersPerGpu: {
    flag: "--workers-per-gpu",
    type: "int",
    min: 1,
    default: 8,
    placeholder: "n",
    help: "workers per GPU",
  },
  /** Requests a worker process serves before it is replaced; 0 reuses it forever. */
  maxRequestsPerWorker: {
    flag: "--max-requests-per-worker",
    type: "int",
    min: 0,
    default: 1,
    placeholder: "n",
    help: "requests per worker process; 0 reuses",
  },
  /** Seconds between SIGTERM and SIGKILL when a worker's process tree is killed. */
  workerTerminationGraceSeconds: {
    flag: "--worker-termination-grace-seconds",
    type: "number",
    min: 0,
    default: 5,
    placeholder: "s",
    help: "SIGTERM to SIGKILL grace",
  },
  /** `"bubblewrap"` isolates every worker's files; `"none"` disables isolation. */
  sandbox: {
    flag: "--sandbox",
    type: "choice",
    choices: ["bubblewrap", "none"],
    default: "bubblewrap",
    placeholder: "kind",
    help: "bubblewrap or none",
  },
  /** Extra read-only paths inside sandboxes (directories also join the Python path). */
  sandboxReadonlyPaths: {
    flag: "--sandbox-readonly-path",
    type: "list",
    items: { type: "string", nonEmpty: true },
    default: [],
    placeholder: "path",
    help: "extra read-only path in sandboxes",
  },
  /** How long a request may wait for a free worker before a 503. */
  workerWaitTimeoutSeconds: {
    flag: "--worker-wait-timeout-seconds",
    type: "number",
    above: 0,
    default: 1800,
    placeholder: "s",
    help: "wait for a free worker before 503",
  },
  /** Execution limit when a request gives none. */
  defaultTimeoutSeconds: {
    flag: "--default-timeout-seconds",
    type: "number",
    above: 0,
    default: 300,
    placeholder: "s",
    help: "execution limit when a request gives none",
  },
  /** Upper bound of a request's execution limit (larger requests are clamped). */
  maxTimeoutSeconds: {
    flag: "--max-timeout-seconds",
    type: "number",
    above: 0,
    default: 900,
    placeholder: "s",
    help: "upper bound of a request's limit",
  },
  /** Largest accepted request body, in bytes. */
  maxRequestBytes: {
    flag: "--max-request-bytes",
    type: "int",
    unit: "bytes",
    above: 0,
    default: 268435456,
    placeholder: "n",
    help: "largest request body",
  },
  /** Largest serialized response, in bytes. */
  maxResponseBytes: {
    flag: "--max-response-bytes",
    type: "int",
    unit: "bytes",
    above: 0,
    default: 268435456,
    placeholder: "n",
    help: "largest response",
  },
  ...connectionOptions,
  /** Captured stdout/stderr per stream when a request gives no limit, in bytes. */
  outputLimitBytes: {
    flag: "--output-limit-bytes",
    type: "int",
    unit: "bytes",
    min: 0,
    default: 1048576,
    placeholder: "n",
    help: "default captured stdout/stderr per stream",
  },
  /** Largest capture limit a request may ask for, per stream, in bytes. */
  maxOutputLimitBytes: {
    flag: "--max-output-limit-bytes",
    type: "int",
    unit: "bytes",
    min: 0,
    default: 16777216,
    placeholder: "n",
    help: "largest capture a request may ask for",
  },
  /** Memory cache capacity for tensor, bytes and library blobs, in bytes. */
  cacheCapacityBytes: {
    flag: "--cache-capacity-bytes",
    type: "int",
    unit: "bytes",
    min: 0,
    default: 17179869184,
    placeholder: "n",
    help: "memory cache for tensors, bytes, libraries",
  },
  /** File upload cache directory (default: {@linkcode defaultDiskCacheDir}); `null`: none. */
  diskCacheDir: {
    flag: "--disk-cache-dir",
    type: "string",
    nullable: true,
    emptyIsNull: true,
    default: (env: Env): string | null => defaultDiskCacheDir(env),
    commandDefault: (env: Env): string | null => defaultDiskCacheDir(env),
    placeholder: "dir",
    help: "file upload cache; '' disables",
  },
  /** Disk cache capacity in MiB; 0 disables the disk cache. */
  diskCacheCapacityMbytes: {
    flag: "--disk-cache-capacity-mbytes",
    type: "int",
    min: 0,
    default: 16384,
    placeholder: "n",
    help: "file cache capacity in MiB; 0 disables",
  },
  /** Event log directory (the command line's default: `logs`); `null` or `""`: no log files. */
  logDir: {
    flag: "--log-dir",
    env: "KCORAL_LOG_DIR",
    type: "string",
    nullable: true,
    emptyIsNull: true,
    default: null,
    commandDefault: "logs",
    placeholder: "dir",
    help: "event log directory; '' disables",
  },
  /** Mirror events to stderr. */
  logConsole: {
    flag: "--no-log-console",
    type: "boolean",
    default: true,
    help: "do not mirror events to stderr",
  },
  /** Console lines as text, or one JSON object per line (the `events.jsonl` record). */
  logFormat: {
    flag: "--log-format",
    env: "KCORAL_LOG_FORMAT",
    type: "choice",
    choices: ["text", "json"],
    default: "text",
    help: "console lines: text, or json (one object per line, as events.jsonl)",
  },
  /** Record every accepted program under `programs/<request-id>.json`. */
  logPrograms: {
    flag: "--no-log-programs",
    type: "boolean",
    default: true,
    help: "do not record accepted programs",
  },
  /** The Python interpreter that runs workers. */
  python: {
    flag: "--python",
    env: "KCORAL_PYTHON",
    type: "string",
    nonEmpty: true,
    default: "python3",
    placeholder: "path",
    help: "worker Python interpreter",
  },
  /**
   * Python modules each seat's zygote imports before it forks workers (`torch` speeds up
   * `kcoral eval` on a CPU server, at the cost of a slower start and ~0.5 GB per seat).
   */
  preloadModules: {
    flag: "--preload-modules",
    env: "KCORAL_SERVER_PRELOAD_MODULES",
    type: "list",
    items: { type: "string", nonEmpty: true },
    separator: ",",
    listName: "module list",
    default: [],
    placeholder: "names",
    help: "comma-separated Python modules each worker starts with (e.g. torch)",
  },
  /** Test mode: GPU workers use torch CPU tensors, one simulated device per entry of `gpus`. */
  simulateGpus: {
    flag: "--simulate-gpus",
    type: "boolean",
    default: false,
    hidden: true,
    help: "TEST MODE: simulate the --gpus devices with torch CPU tensors",
  },
  /** The GPU gate: a script request's processes take the lease at their first CUDA call (A/B). */
  gpuGate: {
    flag: "--no-gpu-gate",
    type: "boolean",
    default: true,
    hidden: true,
    help: "hold the GPU lease for a tool run's whole life (no gate at the first CUDA call)",
  },
} as const satisfies OptionTable;

/** A module name `--preload-modules` accepts: dotted Python identifiers (ASCII). */
const _MODULE_NAME = /^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$/;

/**
 * Relations between server options, checked for configuration objects and command lines alike.
 * Their messages start with the blamed option's flag in both.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { serverConfigRules } from "./config_options.ts";
 *
 * assert.ok(serverConfigRules.some((rule) => rule.field === "sandboxReadonlyPaths"));
 * ```
 */
export const serverConfigRules: readonly OptionRule<
  OptionTableValues<typeof serverConfigOptions>
>[] = [
  {
    field: "preloadModules",
    problem: "names a module that is not a dotted Python name",
    holds: (config) => config.preloadModules.every((name) => _MODULE_NAME.test(name)),
  },
  {
    field: "gpus",
    problem: "needs at least one GPU id",
    holds: (config) => config.device !== "gpu" || config.gpus.length > 0,
  },
  {
    field: "sandboxReadonlyPaths",
    problem: "requires --sandbox bubblewrap",
    holds: (config) => config.sandbox === "bubblewrap" || config.sandboxReadonlyPaths.length === 0,
  },
];

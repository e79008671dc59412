/**
 * `kcoral server`: every option of the server guide (seed 002), with its environment variable
 * where it has one. Explicit flags win over environment variables. A malformed command line
 * exits 2; a well-formed but invalid configuration exits 1 with a message (as upstream).
 *
 * @module
 */
import { Command, CommanderError, Option } from "commander";
import { defaultDiskCacheDir, type ServerConfig } from "../server/config.ts";

/** A parsed `kcoral server` command line. */
export interface ServerArgs {
  config: Partial<ServerConfig>;
  host: string;
  port: number;
  /** Warnings to print before starting. */
  warnings: string[];
}

/** The command line could not be used; `exitCode` is 2 (syntax) or 1 (invalid setting). */
export class ServerArgsError extends Error {
  /** Process exit status to use. */
  readonly exitCode: number;
  /** Creates the error. */
  constructor(message: string, exitCode: number) {
    super(message);
    this.name = "ServerArgsError";
    this.exitCode = exitCode;
  }
}

/** Help was requested; `text` is what to print (exit 0). */
export class ServerHelp extends Error {
  /** The help text. */
  readonly text: string;
  /** Creates the signal. */
  constructor(text: string) {
    super("help");
    this.name = "ServerHelp";
    this.text = text;
  }
}

function _int(name: string) {
  return (value: string): number => {
    if (!/^[+-]?\d+$/.test(value.trim())) {
      throw new CommanderError(
        2,
        "kcoral.invalidArgument",
        `argument ${name}: invalid int value: '${value}'`,
      );
    }
    return Number(value);
  };
}

function _float(name: string) {
  return (value: string): number => {
    const n = Number(value);
    if (value.trim() === "" || !Number.isFinite(n)) {
      throw new CommanderError(
        2,
        "kcoral.invalidArgument",
        `argument ${name}: invalid float value: '${value}'`,
      );
    }
    return n;
  };
}

function _collect(value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value];
}

/** Builds the commander definition (exported for help output). */
export function serverCommand(env: Record<string, string | undefined>): Command {
  const command = new Command("kcoral server")
    .description("Start a KCoral server.")
    .addHelpText(
      "after",
      "\nCtrl+C (or SIGTERM) stops new work and lets running benchmarks finish.",
    )
    .helpOption("-h, --help", "show this help and exit")
    .allowExcessArguments(false)
    .exitOverride()
    .configureOutput({ writeOut: () => {}, writeErr: () => {} });
  const opt = (flags: string, description: string, envName?: string) => {
    return new Option(flags, envName ? `${description} [env: ${envName}]` : description);
  };
  command
    .addOption(opt("--host <host>", "bind address (default 127.0.0.1)", "KCORAL_SERVER_HOST"))
    .addOption(
      opt("--port <port>", "port, 1-65535 (default 8000)", "KCORAL_SERVER_PORT").argParser(
        _int("--port"),
      ),
    )
    .addOption(
      opt("--device <device>", "gpu or cpu (default gpu)", "KCORAL_SERVER_DEVICE").choices([
        "gpu",
        "cpu",
      ]),
    )
    .addOption(
      opt("--gpus <ids>", "comma-separated physical GPU ids (default 0)", "KCORAL_SERVER_GPUS"),
    )
    .addOption(
      opt("--num-workers <n>", "workers in CPU mode (default 1)").argParser(_int("--num-workers")),
    )
    .addOption(
      opt("--workers-per-gpu <n>", "workers per GPU (default 8)").argParser(
        _int("--workers-per-gpu"),
      ),
    )
    .addOption(
      opt("--max-requests-per-worker <n>", "requests per worker process; 0 reuses (default 1)")
        .argParser(_int("--max-requests-per-worker")),
    )
    .addOption(
      opt("--worker-termination-grace-seconds <s>", "SIGTERM to SIGKILL grace (default 5)")
        .argParser(_float("--worker-termination-grace-seconds")),
    )
    .addOption(
      opt("--sandbox <kind>", "bubblewrap or none (default bubblewrap)").choices([
        "bubblewrap",
        "none",
      ]),
    )
    .addOption(
      opt("--sandbox-readonly-path <path>", "extra read-only path in sandboxes (repeatable)")
        .argParser(_collect),
    )
    .addOption(
      opt("--worker-wait-timeout-seconds <s>", "wait for a free worker before 503 (default 1800)")
        .argParser(_float("--worker-wait-timeout-seconds")),
    )
    .addOption(
      opt(
        "--default-timeout-seconds <s>",
        "execution limit when a request gives none (default 300)",
      )
        .argParser(_float("--default-timeout-seconds")),
    )
    .addOption(
      opt("--max-timeout-seconds <s>", "upper bound of a request's limit (default 900)")
        .argParser(_float("--max-timeout-seconds")),
    )
    .addOption(
      opt("--max-request-bytes <n>", "largest request body (default 268435456)")
        .argParser(_int("--max-request-bytes")),
    )
    .addOption(
      opt("--max-response-bytes <n>", "largest response (default 268435456)")
        .argParser(_int("--max-response-bytes")),
    )
    .addOption(
      opt("--output-limit-bytes <n>", "default captured stdout/stderr per stream (default 1048576)")
        .argParser(_int("--output-limit-bytes")),
    )
    .addOption(
      opt(
        "--max-output-limit-bytes <n>",
        "largest capture a request may ask for (default 16777216)",
      )
        .argParser(_int("--max-output-limit-bytes")),
    )
    .addOption(
      opt(
        "--cache-capacity-bytes <n>",
        "memory cache for tensors, bytes, libraries (default 16 GiB)",
      )
        .argParser(_int("--cache-capacity-bytes")),
    )
    .addOption(
      opt(
        "--disk-cache-dir <dir>",
        `file upload cache; '' disables (default ${defaultDiskCacheDir(env)})`,
      ),
    )
    .addOption(
      opt(
        "--disk-cache-capacity-mbytes <n>",
        "file cache capacity in MiB; 0 disables (default 16384)",
      )
        .argParser(_int("--disk-cache-capacity-mbytes")),
    )
    .addOption(
      opt("--log-dir <dir>", "event log directory; '' disables (default logs)", "KCORAL_LOG_DIR"),
    )
    .addOption(opt("--no-log-console", "do not mirror events to stderr"))
    .addOption(opt("--no-log-programs", "do not record accepted programs"))
    .addOption(
      opt("--python <path>", "worker Python interpreter (default python3)", "KCORAL_PYTHON"),
    )
    .addOption(
      opt("--simulate-gpus", "TEST MODE: simulate the --gpus devices with torch CPU tensors")
        .hideHelp(),
    );
  return command;
}

/** Parses `kcoral server` arguments (after `server`) into a configuration. */
export function parseServerArgs(
  argv: string[],
  env: Record<string, string | undefined>,
): ServerArgs {
  const command = serverCommand(env);
  try {
    command.parse(argv, { from: "user" });
  } catch (error) {
    if (error instanceof CommanderError) {
      if (error.code === "commander.helpDisplayed" || error.code === "commander.help") {
        throw new ServerHelp(command.helpInformation());
      }
      const message = error.message.replace(/^error: /, "");
      throw new ServerArgsError(`kcoral server: error: ${message}`, 2);
    }
    throw error;
  }
  const o = command.opts();
  // Environment variables fill what the command line left out (flags win).
  const fromEnv: [string, string, (v: string) => unknown][] = [
    ["host", "KCORAL_SERVER_HOST", (v) => v],
    ["port", "KCORAL_SERVER_PORT", _envParse(_int("KCORAL_SERVER_PORT"))],
    ["device", "KCORAL_SERVER_DEVICE", _envChoice("KCORAL_SERVER_DEVICE", ["gpu", "cpu"])],
    ["gpus", "KCORAL_SERVER_GPUS", (v) => v],
    ["logDir", "KCORAL_LOG_DIR", (v) => v],
    ["python", "KCORAL_PYTHON", (v) => v],
  ];
  for (const [key, name, parse] of fromEnv) {
    const value = env[name];
    if (o[key] === undefined && value !== undefined) o[key] = parse(value);
  }
  const warnings: string[] = [];
  const port = o.port ?? 8000;
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new ServerArgsError("--port must be between 1 and 65535", 1);
  }
  const device = (o.device ?? "gpu") as "gpu" | "cpu";
  const gpuText = String(o.gpus ?? "0");
  const gpuIds = gpuText.split(",").map((s) => s.trim()).filter((s) => s !== "");
  if (gpuIds.some((s) => !/^\d+$/.test(s))) {
    throw new ServerArgsError(
      `kcoral server: error: argument --gpus: invalid GPU id list: '${gpuText}'`,
      2,
    );
  }
  if (device === "gpu" && gpuIds.length === 0) {
    throw new ServerArgsError("--gpus needs at least one GPU id", 1);
  }
  const checks: [unknown, string, (n: number) => boolean][] = [
    [o.numWorkers, "--num-workers must be at least 1", (n) => n >= 1],
    [o.workersPerGpu, "--workers-per-gpu must be at least 1", (n) => n >= 1],
    [o.maxRequestsPerWorker, "--max-requests-per-worker must be non-negative", (n) => n >= 0],
    [o.diskCacheCapacityMbytes, "--disk-cache-capacity-mbytes must be non-negative", (n) => n >= 0],
    [
      o.workerTerminationGraceSeconds,
      "--worker-termination-grace-seconds must be non-negative",
      (n) => n >= 0,
    ],
    [o.workerWaitTimeoutSeconds, "--worker-wait-timeout-seconds must be positive", (n) => n > 0],
    [o.defaultTimeoutSeconds, "--default-timeout-seconds must be positive", (n) => n > 0],
    [o.maxTimeoutSeconds, "--max-timeout-seconds must be positive", (n) => n > 0],
    [o.maxRequestBytes, "--max-request-bytes must be positive", (n) => n > 0],
    [o.maxResponseBytes, "--max-response-bytes must be positive", (n) => n > 0],
    [o.outputLimitBytes, "--output-limit-bytes must be non-negative", (n) => n >= 0],
    [o.maxOutputLimitBytes, "--max-output-limit-bytes must be non-negative", (n) => n >= 0],
    [o.cacheCapacityBytes, "--cache-capacity-bytes must be non-negative", (n) => n >= 0],
  ];
  for (const [value, message, ok] of checks) {
    if (value !== undefined && !ok(value as number)) throw new ServerArgsError(message, 1);
  }
  const sandbox = (o.sandbox ?? "bubblewrap") as "bubblewrap" | "none";
  const readonlyPaths: string[] = o.sandboxReadonlyPath ?? [];
  if (sandbox === "none" && readonlyPaths.length > 0) {
    throw new ServerArgsError("--sandbox-readonly-path requires --sandbox bubblewrap", 1);
  }
  if (device === "gpu" && env.CUDA_VISIBLE_DEVICES !== undefined) {
    warnings.push(
      "kcoral: warning: CUDA_VISIBLE_DEVICES is set but does not restrict the server; " +
        "workers are pinned to --gpus",
    );
  }
  const config: Partial<ServerConfig> = {
    device,
    gpus: gpuIds.map(Number),
    sandbox,
    sandboxReadonlyPaths: readonlyPaths,
    logDir: o.logDir === undefined ? "logs" : (o.logDir === "" ? null : o.logDir),
    logConsole: o.logConsole !== false,
    logPrograms: o.logPrograms !== false,
    simulateGpus: o.simulateGpus === true,
  };
  const copy: [keyof ServerConfig, unknown][] = [
    ["numWorkers", o.numWorkers],
    ["workersPerGpu", o.workersPerGpu],
    ["maxRequestsPerWorker", o.maxRequestsPerWorker],
    ["workerTerminationGraceSeconds", o.workerTerminationGraceSeconds],
    ["workerWaitTimeoutSeconds", o.workerWaitTimeoutSeconds],
    ["defaultTimeoutSeconds", o.defaultTimeoutSeconds],
    ["maxTimeoutSeconds", o.maxTimeoutSeconds],
    ["maxRequestBytes", o.maxRequestBytes],
    ["maxResponseBytes", o.maxResponseBytes],
    ["outputLimitBytes", o.outputLimitBytes],
    ["maxOutputLimitBytes", o.maxOutputLimitBytes],
    ["cacheCapacityBytes", o.cacheCapacityBytes],
    ["diskCacheCapacityMbytes", o.diskCacheCapacityMbytes],
    ["python", o.python],
  ];
  for (const [key, value] of copy) {
    if (value !== undefined) (config as Record<string, unknown>)[key] = value;
  }
  if (o.diskCacheDir !== undefined) {
    config.diskCacheDir = o.diskCacheDir === "" ? null : o.diskCacheDir;
  } else config.diskCacheDir = defaultDiskCacheDir(env);
  return { config, host: o.host ?? "127.0.0.1", port, warnings };
}

function _envParse(parse: (value: string) => unknown): (value: string) => unknown {
  return (value) => {
    try {
      return parse(value);
    } catch (error) {
      throw new ServerArgsError(`kcoral server: error: ${(error as Error).message}`, 2);
    }
  };
}

function _envChoice(name: string, choices: string[]): (value: string) => string {
  return (value) => {
    if (!choices.includes(value)) {
      throw new ServerArgsError(
        `kcoral server: error: ${name}: invalid choice: '${value}' (choose from ${
          choices.join(", ")
        })`,
        2,
      );
    }
    return value;
  };
}

/**
 * Runs `kcoral server ARGS`: starts the server and serves until SIGTERM/SIGINT.
 * Resolves with the process exit status.
 */
export async function serverMain(
  argv: string[],
  env: Record<string, string | undefined> = Deno.env.toObject(),
): Promise<number> {
  let args: ServerArgs;
  try {
    args = parseServerArgs(argv, env);
  } catch (error) {
    if (error instanceof ServerHelp) {
      console.log(error.text);
      return 0;
    }
    if (error instanceof ServerArgsError) {
      if (error.exitCode === 2) console.error(serverCommand(env).helpInformation().split("\n")[0]);
      console.error(error.message);
      return error.exitCode;
    }
    throw error;
  }
  for (const warning of args.warnings) console.error(warning);
  const { createApp } = await import("../server/app.ts");
  const { serve } = await import("../server/serve.ts");
  let app;
  try {
    app = createApp(args.config);
  } catch (error) {
    console.error(`kcoral server: ${error instanceof Error ? error.message : error}`);
    return 1;
  }
  let running;
  try {
    running = await serve(app, { host: args.host, port: args.port });
  } catch (error) {
    console.error(
      `kcoral server: cannot start the server: ${error instanceof Error ? error.message : error}`,
    );
    return 1;
  }
  await running.finished;
  return 0;
}

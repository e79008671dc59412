/**
 * `kcoral server`: every option of the server guide (seed 002), with its environment variable
 * where it has one, and the node options of a routed deployment (seed 003). The flags, their
 * help and the environment variables all come from option tables (server/config_options.ts,
 * node/supervisor/options.ts). Explicit flags win over environment variables. A malformed
 * command line exits 2; a well-formed but invalid configuration exits 1 with a message (as
 * upstream).
 *
 * ```
 *  kcoral server ...                          the server, in this process
 *  kcoral server --router URL --node-id N ... a supervisor (node/supervisor/) that runs
 *                                             `kcoral server ...` (without the node options) as
 *                                             its child, with KCORAL_NODE_SERVER=1 and the routing
 *                                             settings in the environment: that child serves
 *                                             and links its workers to the Router
 * ```
 *
 * @module
 */
import {
  checkCommandLineValues,
  CommandLineError,
  commandLineHelp,
  type CommandLineSpec,
  commandLineUsage,
  parseCommandLine,
} from "../options/command.ts";
import { consoleMessage } from "../http/events.ts";
import { optionTableSchema } from "../options/schema.ts";
import { versionLine } from "../options/version.ts";
import { serverConfigOptions, serverListenOptions } from "../server/config_options.ts";
import { type AccessConfig, accessOptions, checkAccessConfig } from "../http/access_options.ts";
import { type ServerConfig, serverConfigSchema } from "../server/config.ts";
import { connectionLimits } from "../http/connection_options.ts";
import { pinMallocThresholds } from "./malloc_thresholds.ts";
import { selfCommand } from "./self_command.ts";
import {
  checkNodeCommandLine,
  childServerArgs,
  type NodeConfig,
  nodeOptions,
} from "../node/supervisor/options.ts";

/** A parsed `kcoral server` command line. */
export interface ServerArgs {
  /**
   * The configuration fields the command line sets (given by flag or environment variable, plus
   * those the command line always sets: `logDir`, `diskCacheDir` and the switches), validated.
   */
  config: Partial<ServerConfig>;
  /** The address to bind. */
  host: string;
  /** The port to listen on. */
  port: number;
  /** Warnings to print before starting. */
  warnings: string[];
  /** The node options; `routerEndpoint` `null` for a standalone server. */
  node: NodeConfig;
  /** Client tokens and TLS (http/access_options.ts); kept out of `config` and its log. */
  access: AccessConfig;
}

/**
 * The server's command line could not be used; `exitCode` is 2 (syntax) or 1 (invalid setting).
 * The options' {@linkcode CommandLineError} under the server command's own name.
 */
export class ServerArgsError extends CommandLineError {
  /** Creates the error. */
  constructor(message: string, exitCode: number) {
    super(message, exitCode);
    this.name = "ServerArgsError";
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

/**
 * Every option of `kcoral server`, in `--help` order: where to listen, client tokens and TLS,
 * the node options, then the configuration.
 */
const serverOptions = {
  ...serverListenOptions,
  ...accessOptions,
  ...nodeOptions,
  ...serverConfigOptions,
};

const serverListenSchema = optionTableSchema(serverListenOptions);

const serverCommandLine: CommandLineSpec = {
  name: "kcoral server",
  description: "Start a KCoral server; add --router and --node-id to join a Router.",
  epilog: "Ctrl+C (or SIGTERM) stops new work and lets running benchmarks finish.",
  version: versionLine(),
  groups: [
    { title: "where it listens", flags: ["--host", "--port"] },
    {
      title: "who may use it (docs/security.md)",
      flags: [
        "--client-token",
        "--client-token-file",
        "--protect-health",
        "--tls-cert",
        "--tls-key",
      ],
    },
    {
      title: "joining a Router (docs/router.md)",
      flags: ["--router", "--node-id", "--node-token", "--ca-file"],
    },
    {
      title: "GPUs and workers",
      flags: [
        "--device",
        "--gpus",
        "--num-workers",
        "--workers-per-gpu",
        "--max-requests-per-worker",
        "--worker-termination-grace-seconds",
        "--worker-wait-timeout-seconds",
        "--python",
        "--preload-modules",
      ],
    },
    { title: "isolation (docs/sandbox.md)", flags: ["--sandbox", "--sandbox-readonly-path"] },
    {
      title: "requests and their limits",
      flags: [
        "--default-timeout-seconds",
        "--max-timeout-seconds",
        "--max-request-bytes",
        "--max-response-bytes",
        "--output-limit-bytes",
        "--max-output-limit-bytes",
      ],
    },
    {
      title: "connections",
      flags: [
        "--header-timeout-seconds",
        "--keep-alive-timeout-seconds",
        "--body-timeout-seconds",
        "--max-connections",
      ],
    },
    {
      title: "caches",
      flags: ["--cache-capacity-bytes", "--disk-cache-dir", "--disk-cache-capacity-mbytes"],
    },
    {
      title: "logs (docs/operations.md)",
      flags: ["--log-dir", "--no-log-console", "--log-format", "--no-log-programs"],
    },
  ],
  examples: [
    "# try it on a laptop",
    "kcoral server --device cpu --sandbox none --port 8000",
    "# a shared GPU server: client tokens, no copies of its users' programs",
    "KCORAL_CLIENT_TOKEN_FILE=/etc/kcoral/tokens kcoral server --device gpu --gpus 0 " +
    "--host 0.0.0.0 --no-log-programs",
    "# a node of a Router",
    "kcoral server --router http://router:9000 --node-id gpu-a --device gpu --gpus 0",
  ],
};

/**
 * The `--help` text of `kcoral server` (computed defaults such as the disk cache directory come
 * from `env`).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { serverHelpText } from "./server.ts";
 *
 * const help = serverHelpText({ HOME: "/home/u" });
 * assert.ok(help.startsWith("usage: kcoral server [-h] [--version] [--host HOST]"));
 * // Descriptions wrap at 80 columns under column 24.
 * assert.ok(help.replace(/\n {24}/g, " ").includes("(default /home/u/.cache/kcoral/files)"));
 * ```
 */
export function serverHelpText(env: Record<string, string | undefined>): string {
  return commandLineHelp(serverOptions, serverCommandLine, env);
}

/**
 * Parses `kcoral server` arguments (after `server`) into a configuration. Throws
 * {@linkcode ServerHelp} for `-h`/`--help` and {@linkcode ServerArgsError} for a command line
 * that cannot be used.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { parseServerArgs } from "./server.ts";
 *
 * const args = parseServerArgs(["--device", "cpu", "--port", "9000"], { HOME: "/home/u" });
 * assert.ok(args.port === 9000 && args.config.device === "cpu");
 * ```
 */
export function parseServerArgs(
  argv: string[],
  env: Record<string, string | undefined>,
): ServerArgs {
  try {
    const parsed = parseCommandLine(argv, serverOptions, serverCommandLine, env);
    if (parsed.kind === "help") throw new ServerHelp(parsed.text);
    const node = checkNodeCommandLine(parsed);
    const { host, port, clientTokens, clientTokenFile, protectHealth, tlsCert, tlsKey, ...rest } =
      parsed.values;
    let access: AccessConfig;
    try {
      access = checkAccessConfig({ clientTokens, clientTokenFile, protectHealth, tlsCert, tlsKey });
    } catch (error) {
      throw new CommandLineError((error as Error).message, 1);
    }
    if (node.routerEndpoint !== null && access.tlsCert !== null) {
      // The supervisor probes its server over plain HTTP on loopback; clients reach a node
      // through its Router, which is where TLS belongs.
      throw new CommandLineError(
        "--tls-cert cannot be combined with --router: serve TLS on the Router",
        1,
      );
    }
    const given = Object.fromEntries(
      Object.entries(rest).filter(([field]) => !(field in nodeOptions)),
    ) as Partial<ServerConfig>;
    const listen = checkCommandLineValues(serverListenSchema, { host, port }, env);
    const checked = checkCommandLineValues(serverConfigSchema, given, env);
    // What the command line set, as validated (`--log-dir ''` is `null`).
    const config = Object.fromEntries(
      Object.keys(given).map((field) => [field, checked[field as keyof ServerConfig]]),
    ) as Partial<ServerConfig>;
    const warnings: string[] = [];
    if (checked.device === "gpu" && env.CUDA_VISIBLE_DEVICES !== undefined) {
      warnings.push(
        "kcoral: warning: CUDA_VISIBLE_DEVICES is set but does not restrict the server; " +
          "workers are pinned to --gpus",
      );
    }
    return { config, host: listen.host, port: listen.port, warnings, node, access };
  } catch (error) {
    if (error instanceof CommandLineError) throw new ServerArgsError(error.message, error.exitCode);
    throw error;
  }
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
      if (error.exitCode === 2) {
        console.error(commandLineUsage(serverOptions, serverCommandLine).trimEnd());
      }
      console.error(error.message);
      return error.exitCode;
    }
    throw error;
  }
  for (const warning of args.warnings) console.error(warning);
  if (args.node.routerEndpoint !== null && env.KCORAL_NODE_SERVER !== "1") {
    return await _superviseNode(argv, args, env);
  }
  // Buffers freed per message and chunk stay mapped for the next ones (cli/malloc_thresholds.ts).
  pinMallocThresholds(env);
  const { createApp } = await import("../server/app.ts");
  const { serve } = await import("../http/serve.ts");
  const { loadAccess, openBindWarning } = await import("../http/access_options.ts");
  const { nodeLinkTargetFromEnv, withNodeLink } = await import("../node/linked_app.ts");
  let app;
  let access;
  try {
    access = loadAccess(args.access);
    // A node's server, started by its supervisor: linked to the Router (spec router §1.6).
    const target = nodeLinkTargetFromEnv(env);
    const options = { clientTokens: access.tokens };
    app = target
      ? withNodeLink(createApp(args.config, options), target)
      : createApp(args.config, options);
    const open = target ? null : openBindWarning(args.host, access.tokens, "kcoral server");
    if (open) console.error(open);
  } catch (error) {
    console.error(`kcoral server: ${error instanceof Error ? error.message : error}`);
    return 1;
  }
  let running;
  try {
    const format = app.config.logFormat;
    running = await serve(app, {
      host: args.host,
      port: args.port,
      tls: access.tls,
      clientTokens: access.tokens,
      connections: connectionLimits(app.config),
      log: (line) => console.error(consoleMessage(format, line, "server_console")),
    });
  } catch (error) {
    console.error(
      `kcoral server: cannot start the server: ${error instanceof Error ? error.message : error}`,
    );
    return 1;
  }
  if (env.KCORAL_NODE_SERVER === "1") _stopWithSupervisor();
  await running.finished;
  return 0;
}

/**
 * A node's server stops (gracefully, as on SIGTERM) once its supervisor is gone: a supervisor
 * killed outright cannot stop it, and a server left behind would keep its slots on the Router.
 */
function _stopWithSupervisor(): void {
  const supervisor = Deno.ppid;
  const timer = setInterval(() => {
    if (Deno.ppid === supervisor) return;
    clearInterval(timer);
    console.error("kcoral server: the node's supervisor is gone; stopping");
    Deno.kill(Deno.pid, "SIGTERM");
  }, 1000);
  Deno.unrefTimer(timer);
}

/**
 * `args` without every `flag VALUE` and `flag=VALUE` (before a `--`).
 *
 * @example
 * ```ts
 * import { withoutFlag } from "./server.ts";
 *
 * const args = withoutFlag(["--client-token", "a", "--port", "1", "--client-token=b"], "--client-token");
 * if (args.join(" ") !== "--port 1") throw new Error(args.join(" "));
 * ```
 */
export function withoutFlag(args: readonly string[], flag: string): string[] {
  const kept: string[] = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "--") return [...kept, ...args.slice(i)];
    if (args[i] === flag) i++;
    else if (!args[i].startsWith(`${flag}=`)) kept.push(args[i]);
  }
  return kept;
}

/** `kcoral server --router ...`: the node's supervisor, running this command as its server. */
async function _superviseNode(
  argv: string[],
  args: ServerArgs,
  env: Record<string, string | undefined>,
): Promise<number> {
  const { runSupervisor } = await import("../node/supervisor/supervisor.ts");
  const format = args.config.logFormat ?? "text";
  const { supervisorOptionsFrom } = await import("../node/supervisor/options.ts");
  const { resolveProbeHost } = await import("../node/supervisor/probe.ts");
  const { readCaFile } = await import("../http/access_options.ts");
  let probeHost: string;
  try {
    probeHost = await resolveProbeHost(args.host);
  } catch (error) {
    console.error(commandLineUsage(serverOptions, serverCommandLine).trimEnd());
    const reason = error instanceof Error ? error.message : String(error);
    console.error(`kcoral server: error: cannot resolve --host '${args.host}': ${reason}`);
    return 2;
  }
  let caCerts: string[] = [];
  try {
    if (args.node.caFile !== null) caCerts = [readCaFile(args.node.caFile)];
  } catch (error) {
    console.error(`kcoral server: ${error instanceof Error ? error.message : error}`);
    return 1;
  }
  const shutdown = new AbortController();
  const signals = ["SIGTERM", "SIGINT"] as const;
  const onSignal = () => shutdown.abort();
  for (const signal of signals) Deno.addSignalListener(signal, onSignal);
  // The child's environment: this one, less the routing variables (the supervisor sets its
  // own), never a token on a command line: client tokens given as flags travel in
  // KCORAL_CLIENT_TOKEN (the rest of the access options stay flags).
  const childEnv: Record<string, string> = {};
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined) continue;
    if (["KCORAL_ROUTER_ENDPOINT", "KCORAL_NODE_ID", "KCORAL_NODE_TOKEN"].includes(name)) continue;
    childEnv[name] = value;
  }
  if (args.access.clientTokens.length > 0) {
    childEnv[accessOptions.clientTokens.env] = args.access.clientTokens.join(",");
  }
  const code = await runSupervisor(supervisorOptionsFrom(args.node, {
    host: args.host,
    probeHost,
    port: args.port,
    child: {
      // `deno run -A <cli.ts> server …`, or the binary itself when this is a compiled `kcoral`.
      ...selfCommand([
        "server",
        ...withoutFlag(childServerArgs(argv), accessOptions.clientTokens.flag),
        `--host=${args.host}`,
        `--port=${args.port}`,
      ]),
      env: childEnv,
    },
    caCerts,
    signal: shutdown.signal,
    log: (line) =>
      console.error(consoleMessage(format, line, "supervisor", { node_id: args.node.nodeId })),
  }));
  for (const signal of signals) Deno.removeSignalListener(signal, onSignal);
  return code;
}

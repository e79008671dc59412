/**
 * The options of `kcoral router` (seed 003, "Router options"; upstream `bin/router.rs`),
 * declared once as an options table (see `options/`): the flags, their defaults, limits and
 * help, the configuration type, its validation and the command line all come from
 * {@linkcode routerOptions}. An explicit `--node-token` wins over `KCORAL_NODE_TOKEN`; an empty
 * token is a configuration error, from the flag or the variable (spec router §1.2: a Router
 * that would take an empty secret for "no token" is open to every node). A malformed command
 * line exits 2, a well-formed but invalid one 1.
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
import { type OptionRule, type OptionTableSchema, optionTableSchema } from "../options/schema.ts";
import type { OptionTable } from "../options/spec.ts";
import { versionLine } from "../options/version.ts";
import { type AccessConfig, accessOptions, checkAccessConfig } from "../http/access_options.ts";
import type { RegistryConfig } from "./registry.ts";
import { connectionOptions } from "../http/connection_options.ts";
import { EMPTY_NODE_TOKEN_VARIABLE } from "../link/messages.ts";

/**
 * Every option of `kcoral router`, in `--help` order, with the seed's defaults.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { routerOptions } from "./options.ts";
 *
 * assert.equal(routerOptions.port.default, 9000);
 * assert.equal(routerOptions.nodeToken.env, "KCORAL_NODE_TOKEN");
 * ```
 */
export const routerOptions = {
  /** The address to bind. */
  host: {
    flag: "--host",
    type: "string",
    default: "127.0.0.1",
    placeholder: "host",
    help: "Router listen address",
  },
  /** The port to listen on (HTTP clients and node connections alike); 0: any free port. */
  port: {
    flag: "--port",
    type: "int",
    min: 0,
    max: 65535,
    default: 9000,
    placeholder: "port",
    help: "Router listen port, 0-65535 (0: any free port, shown in the listening line)",
  },
  /** Period of the freshness sweep, and how long a node 503 keeps the node aside. */
  statusCheckIntervalSeconds: {
    flag: "--status-check-interval-seconds",
    type: "number",
    above: 0,
    default: 1,
    placeholder: "s",
    help: "interval for checking status freshness",
  },
  /** Oldest accepted health snapshot, and the longest silence of a control connection. */
  maxStatusAgeSeconds: {
    flag: "--max-status-age-seconds",
    type: "number",
    above: 0,
    default: 5,
    placeholder: "s",
    help: "maximum age of a node health report",
  },
  /** Failing observations that take a ready node out. */
  unhealthyThreshold: {
    flag: "--unhealthy-threshold",
    type: "int",
    min: 1,
    default: 3,
    placeholder: "n",
    help: "failed observations before removing a ready node",
  },
  /** Healthy observations in a row that bring a failed node back. */
  recoveryThreshold: {
    flag: "--recovery-threshold",
    type: "int",
    min: 1,
    default: 2,
    placeholder: "n",
    help: "successful observations before a failed node returns",
  },
  /** How long a request waits for a free slot before a 503 `no_node`. */
  queueWaitTimeoutSeconds: {
    flag: "--queue-wait-timeout-seconds",
    type: "number",
    min: 0,
    default: 1800,
    placeholder: "s",
    help: "maximum wait for capacity",
  },
  /** Requests that may wait at once; more are a 503 `router_busy` (0: none waits). */
  maxQueuedRequests: {
    flag: "--max-queued-requests",
    type: "int",
    min: 0,
    default: 1024,
    placeholder: "n",
    help: "bound on requests waiting for capacity",
  },
  /** How long the record of a disconnected node with nothing running is kept. */
  nodeRetentionSeconds: {
    flag: "--node-retention-seconds",
    type: "number",
    min: 0,
    default: 600,
    placeholder: "s",
    help: "retention of disconnected, unused node records",
  },
  /** Largest accepted request body, in bytes. */
  maxRequestBytes: {
    flag: "--max-request-bytes",
    type: "int",
    unit: "bytes",
    above: 0,
    default: 268435456,
    placeholder: "bytes",
    help: "maximum accepted request body size, in bytes",
  },
  ...connectionOptions,
  /** Console lines as text, or one JSON object per line. */
  logFormat: {
    flag: "--log-format",
    env: "KCORAL_LOG_FORMAT",
    type: "choice",
    choices: ["text", "json"],
    default: "text",
    help: "console lines: text, or json (one object per line)",
  },
  /** The shared token nodes must present; `null`: every node is accepted. */
  nodeToken: {
    flag: "--node-token",
    env: "KCORAL_NODE_TOKEN",
    type: "string",
    nonEmpty: true,
    nullable: true,
    default: null,
    placeholder: "token",
    help: "authenticate node connections (default: no token)",
  },
} as const satisfies OptionTable;

/**
 * A `kcoral router` configuration: one field per entry of {@linkcode routerOptions} (written
 * out for its documentation; the compiler checks it against the table).
 *
 * @example
 * ```ts
 * import type { RouterConfig } from "./options.ts";
 *
 * const listening = (config: RouterConfig) => `${config.host}:${config.port}`;
 * ```
 */
export interface RouterConfig {
  /** The address to bind. */
  host: string;
  /** The port to listen on. */
  port: number;
  /** Period of the freshness sweep, in seconds. */
  statusCheckIntervalSeconds: number;
  /** Oldest accepted health snapshot and longest control silence, in seconds. */
  maxStatusAgeSeconds: number;
  /** Failing observations that take a ready node out. */
  unhealthyThreshold: number;
  /** Healthy observations in a row that bring a failed node back. */
  recoveryThreshold: number;
  /** Longest wait for a slot, in seconds. */
  queueWaitTimeoutSeconds: number;
  /** Requests that may wait at once. */
  maxQueuedRequests: number;
  /** Retention of disconnected, unused node records, in seconds. */
  nodeRetentionSeconds: number;
  /** Largest accepted request body, in bytes. */
  maxRequestBytes: number;
  /** How long a request head may take from its first byte, in seconds. */
  headerTimeoutSeconds: number;
  /** How long a connection may stay open with no request begun, in seconds. */
  keepAliveTimeoutSeconds: number;
  /** How long a request body may make no progress before it is cut, in seconds. */
  bodyTimeoutSeconds: number;
  /** Client connections served at once (node links, once open, are not counted). */
  maxConnections: number;
  /** Console lines as text or JSON. */
  logFormat: "text" | "json";
  /** The token nodes must present, or `null` for none. */
  nodeToken: string | null;
}

/** Environment variables, as `Deno.env.toObject()` gives them. */
type Environment = Readonly<Record<string, string | undefined>>;

/** Relations between router options (upstream `RouterConfig::validate`). */
const routerRules: readonly OptionRule<RouterConfig>[] = [
  {
    field: "nodeRetentionSeconds",
    problem: "must exceed --max-status-age-seconds",
    holds: (config) => config.nodeRetentionSeconds > config.maxStatusAgeSeconds,
  },
];

/** Validation of router configurations; its type checks `RouterConfig` against the table. */
const routerConfigSchema: OptionTableSchema<RouterConfig> = optionTableSchema(
  routerOptions,
  routerRules,
);

/**
 * `-h`/`--help` was given: `text` is what to print (exit status 0).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { parseRouterArgs, RouterHelp } from "./options.ts";
 *
 * assert.throws(() => parseRouterArgs(["--help"], {}), RouterHelp);
 * ```
 */
export class RouterHelp extends Error {
  /** The help text. */
  readonly text: string;
  /** Creates the signal. */
  constructor(text: string) {
    super("help");
    this.name = "RouterHelp";
    this.text = text;
  }
}

/** The command line's table: the Router's options, then client tokens and TLS. */
const routerCommandOptions = { ...routerOptions, ...accessOptions };

const routerCommandLine: CommandLineSpec = {
  name: "kcoral router",
  description: "Start a KCoral Router: one address for a pool of compute nodes.",
  epilog: "Ctrl+C (or SIGTERM) stops the Router.",
  examples: [
    "# one address for the GPU nodes, clients with tokens",
    "KCORAL_NODE_TOKEN=... KCORAL_CLIENT_TOKEN_FILE=/etc/kcoral/tokens kcoral router " +
    "--host 0.0.0.0 --port 9000",
    "# then on each GPU machine",
    "KCORAL_NODE_TOKEN=... kcoral server --router http://router:9000 --node-id gpu-a " +
    "--device gpu --gpus 0",
  ],
  version: versionLine(),
};

/**
 * The `--help` text of `kcoral router`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { routerHelpText } from "./options.ts";
 *
 * const help = routerHelpText({});
 * assert.ok(help.startsWith("usage: kcoral router [-h] [--version] [--host HOST]"));
 * assert.ok(help.replace(/\n {24}/g, " ").includes("[env: KCORAL_NODE_TOKEN]"));
 * ```
 */
export function routerHelpText(env: Readonly<Record<string, string | undefined>>): string {
  return commandLineHelp(routerCommandOptions, routerCommandLine, env);
}

/**
 * The usage lines of `kcoral router` (ends with a newline), printed before a malformed command
 * line's error.
 */
export function routerUsage(): string {
  return commandLineUsage(routerCommandOptions, routerCommandLine);
}

/**
 * Parses `kcoral router` arguments (after `router`) into a validated configuration. Throws
 * {@linkcode RouterHelp} for `-h`/`--help`, and the options' `CommandLineError` for a command
 * line that cannot be used (`exitCode` 2: malformed; 1: an invalid setting, e.g.
 * `--node-token must not be empty`).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { CommandLineError } from "../options/command.ts";
 * import { EMPTY_NODE_TOKEN_VARIABLE } from "../link/messages.ts";
 * import { parseRouterArgs } from "./options.ts";
 *
 * assert.throws(
 *   () => parseRouterArgs(["--node-token", ""], {}),
 *   new CommandLineError("--node-token must not be empty", 1),
 * );
 * assert.throws(
 *   () => parseRouterArgs([], { KCORAL_NODE_TOKEN: "" }),
 *   new CommandLineError(EMPTY_NODE_TOKEN_VARIABLE, 1),
 * );
 * ```
 */
export function parseRouterArgs(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
): RouterConfig {
  return parseRouterCommandLine(argv, env).config;
}

/**
 * Parses `kcoral router` arguments as {@linkcode parseRouterArgs} does, and the access options
 * (client tokens, TLS: http/access_options.ts) kept apart from the configuration, so that no
 * token reaches what the Router logs. An invalid access setting is a `CommandLineError` with
 * exit status 1.
 */
export function parseRouterCommandLine(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>>,
): { config: RouterConfig; access: AccessConfig } {
  const parsed = parseCommandLine(argv, routerCommandOptions, routerCommandLine, env);
  if (parsed.kind === "help") throw new RouterHelp(parsed.text);
  if (parsed.sources.nodeToken === "env" && parsed.values.nodeToken === "") {
    throw new CommandLineError(EMPTY_NODE_TOKEN_VARIABLE, 1);
  }
  const { clientTokens, clientTokenFile, protectHealth, tlsCert, tlsKey, ...values } =
    parsed.values;
  const config = checkCommandLineValues(routerConfigSchema, values, env);
  try {
    const access = checkAccessConfig({
      clientTokens,
      clientTokenFile,
      protectHealth,
      tlsCert,
      tlsKey,
    });
    return { config, access };
  } catch (error) {
    throw new CommandLineError((error as Error).message, 1);
  }
}

/** The registry's settings from a router configuration (seconds become milliseconds). */
export function registryConfig(config: RouterConfig): RegistryConfig {
  return {
    maxStatusAgeMs: config.maxStatusAgeSeconds * 1000,
    unhealthyThreshold: config.unhealthyThreshold,
    recoveryThreshold: config.recoveryThreshold,
    nodeRetentionMs: config.nodeRetentionSeconds * 1000,
    statusCheckIntervalMs: config.statusCheckIntervalSeconds * 1000,
    maxQueuedRequests: config.maxQueuedRequests,
    queueWaitTimeoutMs: config.queueWaitTimeoutSeconds * 1000,
  };
}

/**
 * The registry's settings of `kcoral router` run without options, with `overrides` (the Router's
 * defaults for a `NodeRegistry` made by hand).
 */
export function defaultRegistryConfig(overrides: Partial<RegistryConfig> = {}): RegistryConfig {
  return { ...registryConfig(parseRouterArgs([], {})), ...overrides };
}

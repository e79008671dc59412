/**
 * The node options of `kcoral server` (seed 003, "Node connection and supervisor options"), as
 * an options table (see options/): `--router`, `--node-id` and `--node-token`, and the hidden
 * advanced supervisor options, which require `--router` and are left out of `--help`. Explicit
 * flags win over environment variables.
 *
 * `kcoral server` merges {@linkcode nodeOptions} into its command line, checks the node fields
 * with {@linkcode checkNodeCommandLine}, and when the result has a Router runs the supervisor
 * with {@linkcode supervisorOptionsFrom} (the child's arguments from
 * {@linkcode childServerArgs}).
 *
 * @module
 */
import { CommandLineError, type OptionSource } from "../../options/command.ts";
import {
  type OptionRule,
  type OptionTableSchema,
  optionTableSchema,
} from "../../options/schema.ts";
import type { OptionTable, OptionTableValues } from "../../options/spec.ts";
import { EMPTY_NODE_TOKEN_VARIABLE, isValidNodeId } from "../../link/messages.ts";
import { probeOrigin } from "./probe.ts";
import type { ChildCommand } from "./process_tree.ts";
import { nodeServerEnv, type SupervisorOptions, type SupervisorTimings } from "./supervisor.ts";

/** The node connection and supervisor options of `kcoral server`, in `--help` order. */
export const nodeOptions = {
  /** The Router to join: an HTTP(S) origin; `null` runs a standalone server. */
  routerEndpoint: {
    flag: "--router",
    env: "KCORAL_ROUTER_ENDPOINT",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "url",
    help: "join the Router at this HTTP(S) origin (runs a node supervisor)",
  },
  /** The node's stable name; required with `--router`. */
  nodeId: {
    flag: "--node-id",
    env: "KCORAL_NODE_ID",
    type: "string",
    nullable: true,
    default: null,
    placeholder: "id",
    help: "stable identifier for this node; required with --router",
  },
  /** The bearer token of node connections; `null` for none. */
  nodeToken: {
    flag: "--node-token",
    env: "KCORAL_NODE_TOKEN",
    type: "string",
    nullable: true,
    nonEmpty: true,
    default: null,
    placeholder: "token",
    help: "bearer token for node connections",
  },
  /** A CA certificate (PEM) trusted for a `https://` Router, besides the system's. */
  caFile: {
    flag: "--ca-file",
    env: "KCORAL_CA_FILE",
    type: "string",
    nullable: true,
    nonEmpty: true,
    default: null,
    placeholder: "path",
    help: "trust this PEM CA certificate for an https:// Router (self-signed deployments)",
  },
  /** Between health probes, and between control heartbeats. */
  healthIntervalSeconds: {
    flag: "--health-interval-seconds",
    type: "number",
    above: 0,
    default: 2,
    placeholder: "s",
    help: "interval between health probes and between control heartbeats",
    hidden: true,
    requires: "routerEndpoint",
  },
  /** One health probe's limit. */
  healthTimeoutSeconds: {
    flag: "--health-timeout-seconds",
    type: "number",
    above: 0,
    default: 1,
    placeholder: "s",
    help: "timeout for each local health probe",
    hidden: true,
    requires: "routerEndpoint",
  },
  /** Consecutive failed probes that restart the server. */
  failureThreshold: {
    flag: "--failure-threshold",
    type: "int",
    min: 1,
    default: 3,
    placeholder: "n",
    help: "consecutive failed health probes before restarting the server",
    hidden: true,
    requires: "routerEndpoint",
  },
  /** Failed probes are not counted for this long after a start. */
  startupGraceSeconds: {
    flag: "--startup-grace-seconds",
    type: "number",
    min: 0,
    default: 30,
    placeholder: "s",
    help: "initial period during which failed health probes do not trigger a restart",
    hidden: true,
    requires: "routerEndpoint",
  },
  /** A healthy run this long resets the restart backoff. */
  stableResetSeconds: {
    flag: "--stable-reset-seconds",
    type: "number",
    min: 0,
    default: 60,
    placeholder: "s",
    help: "healthy running time before resetting restart backoff",
    hidden: true,
    requires: "routerEndpoint",
  },
  /** Between SIGTERM and SIGKILL when restarting an unhealthy server. */
  terminationGraceSeconds: {
    flag: "--termination-grace-seconds",
    type: "number",
    min: 0,
    default: 5,
    placeholder: "s",
    help: "grace period before force-killing an unhealthy server during restart",
    hidden: true,
    requires: "routerEndpoint",
  },
  /** The first restart delay. */
  restartMinDelaySeconds: {
    flag: "--restart-min-delay-seconds",
    type: "number",
    above: 0,
    default: 1,
    placeholder: "s",
    help: "initial restart backoff",
    hidden: true,
    requires: "routerEndpoint",
  },
  /** The largest restart delay, before jitter. */
  restartMaxDelaySeconds: {
    flag: "--restart-max-delay-seconds",
    type: "number",
    above: 0,
    default: 30,
    placeholder: "s",
    help: "maximum restart backoff before jitter",
    hidden: true,
    requires: "routerEndpoint",
  },
  /** Random variation of restart delays. */
  restartJitter: {
    flag: "--restart-jitter",
    type: "number",
    min: 0,
    max: 0.5,
    default: 0.2,
    placeholder: "fraction",
    help: "random variation in restart delay, as a fraction",
    hidden: true,
    requires: "routerEndpoint",
  },
} as const satisfies OptionTable;

/** The node fields of a `kcoral server` configuration (what {@linkcode nodeOptions} sets). */
export interface NodeConfig extends SupervisorTimings {
  /** The Router's HTTP(S) origin; `null` for a standalone server. */
  routerEndpoint: string | null;
  /** The node's stable name; set whenever `routerEndpoint` is. */
  nodeId: string | null;
  /** The bearer token of node connections, or `null`. */
  nodeToken: string | null;
  /** A CA certificate file trusted for a `https://` Router, or `null`. */
  caFile: string | null;
}

// `NodeConfig` is exactly what the table defines.
type Same<A, B> = [A] extends [B] ? [B] extends [A] ? true : false : false;
const sameConfig: Same<NodeConfig, OptionTableValues<typeof nodeOptions>> = true;
void sameConfig;

/** The fields of {@linkcode nodeOptions}. */
export type NodeField = keyof typeof nodeOptions;

/**
 * Why `text` is not a Router endpoint (an `http`/`https` origin: no path other than `/`, no
 * query, no fragment, no credentials), or `null` when it is one.
 */
export function routerEndpointProblem(text: string): string | null {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return "is not a URL";
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return "must be http or https";
  if (url.username !== "" || url.password !== "") return "must not carry credentials";
  if (url.pathname !== "/") return "must have no path";
  if (url.search !== "" || text.includes("?")) return "must have no query";
  if (url.hash !== "" || text.includes("#")) return "must have no fragment";
  return null;
}

const ORIGIN_PROBLEM = "must be an http or https origin (no path, query or fragment)";

/**
 * Relations between node options: an endpoint that is an origin, a valid node id required with
 * `--router`, and restart delays in order.
 */
export const nodeOptionRules: readonly OptionRule<NodeConfig>[] = [
  {
    field: "routerEndpoint",
    problem: ORIGIN_PROBLEM,
    holds: (c) => c.routerEndpoint === null || routerEndpointProblem(c.routerEndpoint) === null,
  },
  {
    field: "nodeId",
    problem: "is required with --router",
    holds: (c) => c.routerEndpoint === null || c.nodeId !== null,
  },
  {
    field: "nodeId",
    problem: "must be 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit",
    holds: (c) => c.routerEndpoint === null || c.nodeId === null || isValidNodeId(c.nodeId),
  },
  {
    field: "restartMaxDelaySeconds",
    problem: "must not be below --restart-min-delay-seconds",
    holds: (c) => c.restartMaxDelaySeconds >= c.restartMinDelaySeconds,
  },
];

/**
 * Checks a node configuration object: fills in the defaults, validates every field and the
 * {@linkcode nodeOptionRules}. Throws a `TypeError` naming the first problem's flag.
 */
export function checkNodeConfig(input: Readonly<Partial<NodeConfig>>): NodeConfig {
  const checked = nodeConfigSchema.check(input);
  if (checked.ok) return checked.values;
  const problem = checked.problems[0];
  throw new TypeError(`${problem.flag ?? problem.path} ${problem.message}`);
}

const nodeConfigSchema: OptionTableSchema<NodeConfig> = optionTableSchema(
  nodeOptions,
  nodeOptionRules,
);

/** A parsed command line, as `parseCommandLine` gives it (other tables' fields are ignored). */
export interface ParsedNodeCommandLine {
  /** What the command line sets. */
  readonly values: Readonly<Record<string, unknown>>;
  /** Where each value came from. */
  readonly sources: Readonly<Record<string, OptionSource | undefined>>;
}

/**
 * The node configuration of a parsed `kcoral server` command line whose table includes
 * {@linkcode nodeOptions}. An empty `KCORAL_ROUTER_ENDPOINT` or `KCORAL_NODE_ID` counts as
 * unset (an explicit empty flag stays an error); an empty `KCORAL_NODE_TOKEN` on a routed node
 * is an error, as an empty `--node-token` is. Throws
 * {@linkcode CommandLineError}: exit status 2 when a supervisor option is given as a flag
 * without a Router, 1 for an invalid setting (`--router and --node-id must be configured
 * together`, `--node-token must not be empty`, ...). `routerEndpoint` `null` means a
 * standalone server.
 */
export function checkNodeCommandLine(
  parsed: ParsedNodeCommandLine,
  name = "kcoral server",
): NodeConfig {
  const values: Record<string, unknown> = {};
  const sources: Record<string, OptionSource | undefined> = {};
  let emptyTokenVariable = false;
  for (const field of Object.keys(nodeOptions)) {
    const value = parsed.values[field];
    const source = parsed.sources[field];
    if (source === "env" && value === "" && field === "nodeToken") emptyTokenVariable = true;
    if (value === undefined || (source === "env" && value === "")) continue;
    values[field] = value;
    sources[field] = source;
  }
  // Upstream's wording and exit status for half a routing configuration (its tests match
  // "configured together"); a token without a Router is unused, as upstream's.
  if ((values.routerEndpoint === undefined) !== (values.nodeId === undefined)) {
    throw new CommandLineError("--router and --node-id must be configured together", 1);
  }
  // A token set empty is a configuration error, as a Router's (spec router §1.2); unused
  // without a Router.
  if (values.routerEndpoint !== undefined && emptyTokenVariable) {
    throw new CommandLineError(EMPTY_NODE_TOKEN_VARIABLE, 1);
  }
  if (values.routerEndpoint === undefined) {
    for (const [field, spec] of Object.entries(nodeOptions) as [NodeField, OptionTable[string]][]) {
      if (
        sources[field] === "flag" &&
        !["routerEndpoint", "nodeId", "nodeToken", "caFile"].includes(field)
      ) {
        throw new CommandLineError(`${name}: error: ${spec.flag} requires --router`, 2);
      }
    }
  }
  const checked = nodeConfigSchema.check(values as Partial<NodeConfig>);
  if (!checked.ok) {
    const problem = checked.problems[0];
    throw new CommandLineError(`${problem.flag ?? problem.path} ${problem.message}`, 1);
  }
  return checked.values;
}

/**
 * The command-line arguments of the supervised server: `argv` without the node options (the
 * child gets the routing settings, token included, through {@linkcode nodeServerEnv}, so the
 * token never appears on a command line). Both `--flag value` and `--flag=value` are removed.
 */
export function childServerArgs(argv: readonly string[]): string[] {
  const flags = new Set<string>(Object.values(nodeOptions).map((spec) => spec.flag));
  const kept: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--") {
      kept.push(...argv.slice(i));
      break;
    }
    if (flags.has(arg)) {
      i++; // and its value
      continue;
    }
    const equals = arg.indexOf("=");
    if (equals > 0 && flags.has(arg.slice(0, equals))) continue;
    kept.push(arg);
  }
  return kept;
}

/** The server side of {@linkcode supervisorOptionsFrom}. */
export interface SupervisedServer {
  /** The server's bind address (`--host`). */
  host: string;
  /** The address it is probed at: `host` resolved (`resolveProbeHost`, probe.ts); default `host`. */
  probeHost?: string;
  /** The server's port (`--port`). */
  port: number;
  /** The server command (e.g. `deno run -A cli.ts server ...`); node variables are added. */
  child: ChildCommand;
  /** Aborted on SIGTERM/SIGINT. */
  signal?: AbortSignal;
  /** Where log lines go; default stderr. */
  log?: (line: string) => void;
  /** The PEM text of `caFile` (read by the caller), for the control link. */
  caCerts?: readonly string[];
}

/**
 * The supervisor's options for a routed node configuration: the probe origin from the server's
 * host and port, and the child's environment with {@linkcode nodeServerEnv}. Throws a
 * `TypeError` when `config` has no Router or node id.
 */
export function supervisorOptionsFrom(
  config: NodeConfig,
  server: SupervisedServer,
): SupervisorOptions {
  if (config.routerEndpoint === null || config.nodeId === null) {
    throw new TypeError("a supervisor needs a Router endpoint and a node id");
  }
  const env = nodeServerEnv({
    routerEndpoint: config.routerEndpoint,
    nodeId: config.nodeId,
    nodeToken: config.nodeToken,
    caFile: config.caFile,
    host: server.host,
    port: server.port,
  });
  return {
    nodeId: config.nodeId,
    routerEndpoint: config.routerEndpoint,
    nodeToken: config.nodeToken,
    caCerts: server.caCerts ?? [],
    serverUrl: probeOrigin(server.probeHost ?? server.host, server.port),
    child: {
      command: server.child.command,
      args: [...server.child.args],
      env: { ...server.child.env, ...env },
    },
    healthIntervalSeconds: config.healthIntervalSeconds,
    healthTimeoutSeconds: config.healthTimeoutSeconds,
    failureThreshold: config.failureThreshold,
    startupGraceSeconds: config.startupGraceSeconds,
    stableResetSeconds: config.stableResetSeconds,
    terminationGraceSeconds: config.terminationGraceSeconds,
    restartMinDelaySeconds: config.restartMinDelaySeconds,
    restartMaxDelaySeconds: config.restartMaxDelaySeconds,
    restartJitter: config.restartJitter,
    signal: server.signal,
    log: server.log,
  };
}

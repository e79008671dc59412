/**
 * The node supervisor of a routed deployment (spec router §5): `kcoral server --router URL
 * --node-id NAME` runs {@linkcode runSupervisor}, which starts the node's KCoral server as a
 * child process, probes it locally, reports the node to the Router over its control connection
 * ({@link ./control_link.ts}), restarts the server when it fails, and drains on shutdown.
 *
 * One *generation* per server process (spec router §5.3):
 *
 * ```
 *   ┌─▶ report "KCoral Server is starting" (unhealthy); spawn the child (own group)
 *   │     │
 *   │     ▼  every health interval from the spawn (first tick at once, late ones delayed)
 *   │   probe GET /internal/worker-status (≤ health timeout); report every result
 *   │     ├─ ok ─────▶ failures = 0; healthy streak ≥ stable reset ─▶ reset the backoff
 *   │     ├─ failed ─▶ streak broken; within the startup grace: only logged;
 *   │     │            else failures += 1, and at the threshold:
 *   │     │              SIGTERM, wait ≤ termination grace, SIGKILL the tree ──┐
 *   │     ├─ the child exits on its own ("child exited with …") ──────────────┤
 *   │     │                                                                 ▼
 *   │     │   kill what is left of the tree (≤ 5 s, else exit 1); report the reason
 *   └─────┼── sleep backoff × U[1 − jitter, 1 + jitter] (1 s, doubling, ≤ 30 s)
 *         │
 *         └─ shutdown (SIGTERM/SIGINT): report "Supervisor is shutting down", close the
 *            control connection (the Router stops dispatching), SIGTERM the child and wait
 *            without limit (its requests finish), kill what is left of the tree, exit 0
 * ```
 *
 * @module
 */
import { isValidNodeId } from "../../link/messages.ts";
import { Backoff, sleepUnlessAborted, withJitter } from "../../link/backoff.ts";
import { errorMessage } from "../../protocol/errors.ts";
import { ControlLink, controlUrl, NodeReport } from "./control_link.ts";
import { type ProbeResult, probeServer } from "./probe.ts";
import { type ChildCommand, DescendantsSurvivedError, ProcessTree } from "./process_tree.ts";

export type { ChildCommand } from "./process_tree.ts";

/**
 * The supervisor's timings: the advanced options of `kcoral server --router`
 * (node/supervisor/options.ts). Durations are in seconds.
 */
export interface SupervisorTimings {
  /** Between probes, and between control heartbeats. */
  healthIntervalSeconds: number;
  /** One probe's limit, connect included. */
  healthTimeoutSeconds: number;
  /** Consecutive counted probe failures that restart the server. */
  failureThreshold: number;
  /** After a spawn, failed probes are not counted for this long. */
  startupGraceSeconds: number;
  /** A healthy streak this long resets the restart backoff. */
  stableResetSeconds: number;
  /** On a restart, how long the server has between SIGTERM and SIGKILL. */
  terminationGraceSeconds: number;
  /** The first restart delay. */
  restartMinDelaySeconds: number;
  /** The largest restart delay (before jitter). */
  restartMaxDelaySeconds: number;
  /** Random variation of restart delays, a fraction in [0, 0.5]. */
  restartJitter: number;
}

/** What {@linkcode runSupervisor} runs and how. Durations are in seconds. */
export interface SupervisorOptions extends SupervisorTimings {
  /** The node's stable name. */
  nodeId: string;
  /** The Router's HTTP(S) origin. */
  routerEndpoint: string;
  /** The shared node token, or `null`. */
  nodeToken: string | null;
  /** Extra trusted certificate authorities (PEM) for a `wss://` Router's control link. */
  caCerts?: readonly string[];
  /** The origin the local server is probed at (see `probeOrigin` in probe.ts). */
  serverUrl: string;
  /** The server command; its `env` should include {@linkcode nodeServerEnv}. */
  child: ChildCommand;
  /** The child's stdout and stderr: the supervisor's (default) or `/dev/null`. */
  childStdio?: "inherit" | "null";
  /** How long the control connection may take to open; default 2. */
  controlConnectTimeoutSeconds?: number;
  /** The first control reconnect delay; default 1. */
  controlReconnectMinDelaySeconds?: number;
  /** The largest control reconnect delay; default 30. */
  controlReconnectMaxDelaySeconds?: number;
  /** Aborting it shuts the supervisor down (the CLI aborts it on SIGTERM and SIGINT). */
  signal?: AbortSignal;
  /** Where log lines go (each already names the node); default stderr. */
  log?: (line: string) => void;
}

/** What `kcoral server` needs to give the supervised server (spec router §1.6). */
export interface NodeServerEnvInput {
  /** The Router's HTTP(S) origin. */
  routerEndpoint: string;
  /** The node's name. */
  nodeId: string;
  /** The node token, or `null`. */
  nodeToken: string | null;
  /** A CA file trusted for a `https://` Router (its path travels), or `null`/absent. */
  caFile?: string | null;
  /** The server's bind address (brackets of an IPv6 address are removed). */
  host: string;
  /** The server's port. */
  port: number;
}

/**
 * The environment of the supervised server: `KCORAL_NODE_SERVER=1` (run the server itself, not
 * another supervisor), the routing variables (the server's slots use the same identity as the
 * control connection) and where to listen. The token travels only here, never on a command
 * line; it is left out when there is none.
 */
export function nodeServerEnv(input: NodeServerEnvInput): Record<string, string> {
  const host = input.host.startsWith("[") && input.host.endsWith("]")
    ? input.host.slice(1, -1)
    : input.host;
  const env: Record<string, string> = {
    KCORAL_NODE_SERVER: "1",
    KCORAL_ROUTER_ENDPOINT: input.routerEndpoint,
    KCORAL_NODE_ID: input.nodeId,
  };
  if (input.nodeToken !== null) env.KCORAL_NODE_TOKEN = input.nodeToken;
  if (input.caFile) env.KCORAL_CA_FILE = input.caFile;
  env.KCORAL_SERVER_HOST = host;
  env.KCORAL_SERVER_PORT = String(input.port);
  return env;
}

/** The status the node reports while its server starts. */
export const STARTING = "KCoral Server is starting";
/** The status the node reports once shutdown has begun. */
export const SHUTTING_DOWN = "Supervisor is shutting down";

type Outcome = { kind: "restart"; reason: string } | { kind: "shutdown" };

/**
 * Runs the supervisor until `options.signal` aborts (exit status 0 once the server has drained)
 * or a fatal error: the server cannot be spawned, or its descendants survive 5 s of SIGKILLs
 * (exit status 1). Throws a `TypeError` for invalid options before anything starts.
 */
export async function runSupervisor(options: SupervisorOptions): Promise<number> {
  checkOptions(options);
  const write = options.log ?? ((line: string) => console.error(line));
  const log = (line: string) => write(`kcoral supervisor [${options.nodeId}]: ${line}`);
  const shutdown = options.signal ?? new AbortController().signal;
  const report = new NodeReport(options.nodeId);
  const link = new ControlLink({
    routerEndpoint: options.routerEndpoint,
    nodeToken: options.nodeToken,
    caCerts: options.caCerts ?? [],
    snapshot: () => report.snapshot(),
    heartbeatSeconds: options.healthIntervalSeconds,
    connectTimeoutSeconds: options.controlConnectTimeoutSeconds,
    reconnectMinDelaySeconds: options.controlReconnectMinDelaySeconds,
    reconnectMaxDelaySeconds: options.controlReconnectMaxDelaySeconds,
    log,
  });
  const stopReporting = report.onChange(() => link.report());
  let linkStopped: Promise<void> | null = null;
  const onShutdown = () => {
    log("shutting down: closing the control connection and draining KCoral Server");
    report.markUnhealthy(SHUTTING_DOWN);
    linkStopped = link.stop();
  };
  log(
    `supervising KCoral Server (pid ${Deno.pid}, probe ${options.serverUrl}, ` +
      `Router ${options.routerEndpoint})`,
  );
  link.start();
  if (shutdown.aborted) onShutdown();
  else shutdown.addEventListener("abort", onShutdown, { once: true });
  const restarts = new Backoff(options.restartMinDelaySeconds, options.restartMaxDelaySeconds);
  let code = 0;
  try {
    while (!shutdown.aborted) {
      const outcome = await generation(options, report, restarts, shutdown, log);
      if (outcome.kind === "shutdown" || shutdown.aborted) break;
      report.markUnhealthy(outcome.reason);
      const delay = withJitter(restarts.next(), options.restartJitter);
      log(`restarting KCoral Server in ${delay.toFixed(2)} s (${outcome.reason})`);
      await sleepUnlessAborted(delay * 1000, shutdown);
    }
    log("stopped");
  } catch (error) {
    if (!(error instanceof DescendantsSurvivedError || error instanceof SpawnError)) throw error;
    log(error.message);
    report.markUnhealthy(error.message);
    code = 1;
  } finally {
    shutdown.removeEventListener("abort", onShutdown);
    stopReporting();
    await (linkStopped ?? link.stop());
  }
  return code;
}

class SpawnError extends Error {}

/** One server process, from spawn to its end (and its tree's cleanup). */
async function generation(
  options: SupervisorOptions,
  report: NodeReport,
  restarts: Backoff,
  shutdown: AbortSignal,
  log: (line: string) => void,
): Promise<Outcome> {
  report.markUnhealthy(STARTING);
  let tree: ProcessTree;
  try {
    tree = ProcessTree.spawn(options.child, { stdio: options.childStdio, log });
  } catch (error) {
    throw new SpawnError(
      `cannot start KCoral Server (${options.child.command}): ${errorMessage(error)}`,
    );
  }
  log(`started KCoral Server (pid ${tree.pid})`);
  const intervalMs = options.healthIntervalSeconds * 1000;
  const spawnedAt = performance.now();
  let nextTick = spawnedAt;
  let failures = 0;
  let streakStart: number | null = null;
  let streakReset = false;
  let announced = "";
  let graceError = "";
  for (;;) {
    const wake = await until(nextTick, tree, shutdown);
    if (wake === "exit") return await exitedOnItsOwn(tree, log);
    if (wake === "shutdown") return await drain(tree, log);
    nextTick = Math.max(nextTick + intervalMs, performance.now());
    const result = await probe(options, tree, shutdown);
    if (result === "exit") return await exitedOnItsOwn(tree, log);
    if (result === "shutdown") return await drain(tree, log);
    const now = performance.now();
    if (result.ok) {
      failures = 0;
      streakStart ??= now;
      if (announced !== result.health.instanceId) {
        announced = result.health.instanceId;
        log(
          `KCoral Server is healthy (instance ${announced}, ${result.health.workerCount} ` +
            `workers)`,
        );
      }
      report.recordHealthy(result.health);
      if (!streakReset && now - streakStart >= options.stableResetSeconds * 1000) {
        streakReset = true;
        restarts.reset();
      }
      continue;
    }
    streakStart = null;
    streakReset = false;
    announced = "";
    report.markUnhealthy(result.error);
    if (now - spawnedAt < options.startupGraceSeconds * 1000) {
      // Logged once per distinct reason: a starting server fails the same way many times.
      if (result.error !== graceError) {
        log(`health probe failed during startup grace: ${result.error}`);
      }
      graceError = result.error;
      continue;
    }
    failures++;
    log(`health probe failed (${failures}/${options.failureThreshold}): ${result.error}`);
    if (failures < options.failureThreshold) continue;
    log(`KCoral Server failed ${failures} health probes; stopping it`);
    const status = await tree.terminate(options.terminationGraceSeconds);
    log(`KCoral Server exited with ${describeStatus(status)}`);
    await tree.cleanup();
    return { kind: "restart", reason: `health probe failed ${failures} times: ${result.error}` };
  }
}

/** Waits until `time` (a `performance.now()` value), the child's exit, or shutdown. */
async function until(
  time: number,
  tree: ProcessTree,
  shutdown: AbortSignal,
): Promise<"tick" | "exit" | "shutdown"> {
  if (shutdown.aborted) return "shutdown";
  if (tree.exitStatus !== null) return "exit";
  const stop = new AbortController();
  const signal = AbortSignal.any([stop.signal, shutdown]);
  const wake = await Promise.race([
    sleepUnlessAborted(time - performance.now(), signal).then((slept) =>
      slept ? "tick" as const : "shutdown" as const
    ),
    tree.exited.then(() => "exit" as const),
  ]);
  stop.abort();
  return wake;
}

/** One probe, abandoned if the child exits or shutdown begins meanwhile. */
async function probe(
  options: SupervisorOptions,
  tree: ProcessTree,
  shutdown: AbortSignal,
): Promise<ProbeResult | "exit" | "shutdown"> {
  const stop = new AbortController();
  const pending = probeServer(
    options.serverUrl,
    options.healthTimeoutSeconds * 1000,
    AbortSignal.any([stop.signal, shutdown]),
  );
  const result = await Promise.race([pending, tree.exited.then(() => "exit" as const)]);
  stop.abort();
  await pending;
  if (result === "exit") return "exit";
  return shutdown.aborted ? "shutdown" : result;
}

async function exitedOnItsOwn(tree: ProcessTree, log: (line: string) => void): Promise<Outcome> {
  const reason = `child exited with ${describeStatus(await tree.exited)}`;
  log(`KCoral Server ${reason}`);
  await tree.cleanup();
  return { kind: "restart", reason };
}

async function drain(tree: ProcessTree, log: (line: string) => void): Promise<Outcome> {
  if (tree.exitStatus === null) {
    log(`sending SIGTERM to KCoral Server (pid ${tree.pid}) and waiting for it to finish`);
  }
  const status = await tree.terminate(null);
  log(`KCoral Server exited with ${describeStatus(status)}`);
  await tree.cleanup();
  return { kind: "shutdown" };
}

function describeStatus(status: Deno.CommandStatus): string {
  return status.signal !== null ? `signal ${status.signal}` : `exit status ${status.code}`;
}

function checkOptions(options: SupervisorOptions): void {
  const problems: string[] = [];
  if (!isValidNodeId(options.nodeId)) problems.push(`invalid node id ${options.nodeId}`);
  try {
    controlUrl(options.routerEndpoint);
  } catch {
    problems.push(`invalid Router endpoint ${options.routerEndpoint}`);
  }
  if (options.nodeToken === "") problems.push("the node token must not be empty");
  const positive = [
    "healthIntervalSeconds",
    "healthTimeoutSeconds",
    "failureThreshold",
    "restartMinDelaySeconds",
    "restartMaxDelaySeconds",
    "controlConnectTimeoutSeconds",
    "controlReconnectMinDelaySeconds",
    "controlReconnectMaxDelaySeconds",
  ] as const;
  for (const name of positive) {
    const value = options[name];
    if (value !== undefined && !(Number.isFinite(value) && value > 0)) {
      problems.push(`${name} must be positive`);
    }
  }
  for (
    const name of ["startupGraceSeconds", "stableResetSeconds", "terminationGraceSeconds"] as const
  ) {
    if (!(Number.isFinite(options[name]) && options[name] >= 0)) {
      problems.push(`${name} must be non-negative`);
    }
  }
  if (!Number.isInteger(options.failureThreshold)) {
    problems.push("failureThreshold must be an integer");
  }
  if (!(options.restartJitter >= 0 && options.restartJitter <= 0.5)) {
    problems.push("restartJitter must be between 0 and 0.5");
  }
  if (options.restartMinDelaySeconds > options.restartMaxDelaySeconds) {
    problems.push("restartMaxDelaySeconds must not be below restartMinDelaySeconds");
  }
  const reconnectMin = options.controlReconnectMinDelaySeconds ?? 1;
  if (reconnectMin > (options.controlReconnectMaxDelaySeconds ?? 30)) {
    problems.push("controlReconnectMaxDelaySeconds must not be below its minimum");
  }
  if (problems.length > 0) throw new TypeError(`supervisor options: ${problems.join("; ")}`);
}

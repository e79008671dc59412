/**
 * A routed deployment as processes on loopback, for the Router benchmark and probes: a
 * `kcoral router` and a node (`kcoral server --router`: its supervisor, its server, its workers),
 * each started and awaited until it is ready.
 */
import { Client, type Program } from "../mod.ts";
import { lengthProgram, randomBytes } from "./_programs.ts";
import { rssMiB } from "./_proc.ts";
import {
  CONTROL_PATH,
  encodeMessage,
  type NodeStatus,
  PROTOCOL_VERSION,
  SLOT_PATH,
} from "../link/messages.ts";
import { decodeRequestFrame, encodeFrame } from "../link/frames.ts";
import { WebSocketClient } from "../link/websocket_client.ts";

const _CLI = new URL("../cli.ts", import.meta.url).pathname;

/** The node's device: a CPU server, simulated GPUs or GPU 0. */
export type NodeMode = "cpu" | "sim" | "gpu";

/** A started process. */
export interface RoutedProcess {
  /** `http://127.0.0.1:<port>`: the Router's, or the node's own server's. */
  url: string;
  /** The process: the Router, or the node's supervisor. */
  pid: number;
  /** SIGTERM, then waits for it. */
  stop(): Promise<void>;
}

/** A free loopback port (bound, read, released). */
export function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

/**
 * Spawns `deno run -A ARGS` (in `cwd`, if given) and waits until its stderr shows `ready`; the
 * rest of its stderr is drained.
 */
export async function spawnUntilReady(
  args: string[],
  ready: string,
  cwd?: string,
): Promise<Deno.ChildProcess> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", ...args],
    cwd,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let seen = "";
  while (!seen.includes(ready)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`exited before it was ready:\n${seen}`);
    seen += value;
  }
  (async () => {
    while (!(await reader.read()).done) { /* drained */ }
  })();
  return child;
}

/**
 * Spawns `kcoral ARGS` until it is ready (`spawnUntilReady`). `tree` is another checkout to run
 * it from (its own `deno.json`), for A/B probes.
 */
async function _spawn(
  args: string[],
  ready: string,
  port: number,
  tree?: string,
): Promise<RoutedProcess> {
  const child = await spawnUntilReady([tree ? `${tree}/cli.ts` : _CLI, ...args], ready, tree);
  return {
    url: `http://127.0.0.1:${port}`,
    pid: child.pid,
    async stop() {
      try {
        child.kill("SIGTERM");
      } catch {
        // gone
      }
      await child.status;
    },
  };
}

/**
 * A node's status report as a load generator or stand-in node sends it: healthy, one worker, no
 * target, `versions` as given.
 */
export function standInStatus(
  nodeId: string,
  serverInstanceId: string,
  versions: Record<string, string> = {},
): NodeStatus {
  return {
    t: "status",
    node_id: nodeId,
    server_healthy: true,
    supervisor_instance_id: crypto.randomUUID(),
    server_instance_id: serverInstanceId,
    worker_count: 1,
    busy_workers: 0,
    target: {},
    versions,
    last_error: "",
    health_age_millis: 0,
  };
}

/**
 * A stand-in supervisor: a control link to the Router at `routerUrl` reporting node `nodeId`
 * (server instance `serverInstanceId`, `workerCount` workers) healthy now and every
 * `everyMs`; resolves once the first report is sent.
 */
export async function standInControl(
  routerUrl: string,
  nodeId: string,
  serverInstanceId: string,
  options: { workerCount?: number; everyMs?: number } = {},
): Promise<WebSocketClient> {
  const control = new WebSocketClient(routerUrl.replace(/^http/, "ws") + CONTROL_PATH);
  await new Promise<void>((resolve) => (control.onopen = resolve));
  const status = encodeMessage({
    ...standInStatus(nodeId, serverInstanceId),
    worker_count: options.workerCount ?? 1,
  });
  control.send(status);
  setInterval(() => control.send(status), options.everyMs ?? 2000);
  return control;
}

const _ANSWER = new TextEncoder().encode('{"status":"COMPLETED"}');
const _ANSWER_HEADERS: [string, string][] = [
  ["content-type", "application/json"],
  ["content-length", String(_ANSWER.length)],
];

/**
 * A stand-in node's slot link to the Router at `routerUrl`: it says hello for `nodeId` and
 * `serverInstanceId`, and answers every request once its end arrives as a node's server answers
 * a small one (head, body and end in one frame, `{"status":"COMPLETED"}`).
 */
export async function standInSlot(
  routerUrl: string,
  nodeId: string,
  serverInstanceId: string,
): Promise<WebSocketClient> {
  const slot = new WebSocketClient(routerUrl.replace(/^http/, "ws") + SLOT_PATH);
  await new Promise<void>((resolve) => (slot.onopen = resolve));
  slot.send(encodeMessage({
    t: "hello",
    node_id: nodeId,
    server_instance_id: serverInstanceId,
    slot_id: crypto.randomUUID(),
    protocol_version: PROTOCOL_VERSION,
  }));
  slot.onmessage = (event) => {
    if (typeof event.data === "string") return;
    const frame = decodeRequestFrame(new Uint8Array(event.data));
    if (frame.end) {
      slot.send(
        encodeFrame(frame.requestId, { status: 200, headers: _ANSWER_HEADERS }, _ANSWER, true),
      );
    }
  };
  return slot;
}

/**
 * `pairs` pairs of one direct request and one routed request of `program`, in that order, each
 * timed alone (ms): alternating them request by request lets drift fall on both alike.
 */
export async function timedPairs(
  direct: Client,
  routed: Client,
  program: Program,
  pairs: number,
): Promise<{ direct: number[]; routed: number[] }> {
  const times = { direct: [] as number[], routed: [] as number[] };
  for (let i = 0; i < pairs; i++) {
    let start = performance.now();
    await direct.execute(program);
    times.direct.push(performance.now() - start);
    start = performance.now();
    await routed.execute(program);
    times.routed.push(performance.now() - start);
  }
  return times;
}

/** Starts `kcoral router` on a free port (`extra` flags after the defaults), from `tree`. */
export function startRouterProcess(extra: string[] = [], tree?: string): Promise<RoutedProcess> {
  const port = freePort();
  return _spawn(
    ["router", "--port", String(port), "--recovery-threshold", "1", ...extra],
    "KCoral router listening",
    port,
    tree,
  );
}

/**
 * Starts a node joined to `routerUrl` with `workers` reused workers, sandbox none; resolves once
 * its supervisor's control link is up. `url` is the node's own server (for direct requests),
 * `pid` its supervisor. `tree`: another checkout to run it from.
 */
export function startNodeProcess(
  mode: NodeMode,
  routerUrl: string,
  workers: number,
  tree?: string,
): Promise<RoutedProcess> {
  const port = freePort();
  const device = mode === "cpu"
    ? ["--device", "cpu", "--num-workers", String(workers)]
    : ["--device", "gpu", "--gpus", "0", "--workers-per-gpu", String(workers)];
  return _spawn(
    [
      "server",
      "--router",
      routerUrl,
      "--node-id",
      "bench-node",
      "--port",
      String(port),
      ...device,
      ...(mode === "sim" ? ["--simulate-gpus"] : []),
      "--sandbox",
      "none",
      "--max-requests-per-worker",
      "0",
      "--log-dir",
      "",
      "--no-log-console",
      "--disk-cache-dir",
      "",
      "--max-request-bytes",
      String(300 << 20),
      // A lenient probe: on a 2-core machine, 8 concurrent 256 MiB uploads hold the server's
      // answers for seconds (docs/operations.md, known limits), and a supervisor with the default
      // 1 s probe would restart it mid-benchmark.
      "--health-timeout-seconds",
      "10",
    ],
    "connected outbound supervisor control stream",
    port,
    tree,
  );
}

/** Waits until the Router's `/health` counts `capacity` slots. */
export async function waitForCapacity(url: string, capacity: number): Promise<void> {
  for (let i = 0; i < 600; i++) {
    const body = await (await fetch(`${url}/health`)).json();
    if (body.load.request_capacity >= capacity) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error("the node did not join the Router");
}

/**
 * The Router's resident memory (MiB) before, and at its peak (sampled every 20 ms) while, 8
 * clients each send a 256 MiB request at once (one program, one 256 MiB blob: every client's
 * first attempt misses and sends the blob).
 */
export async function uploadBurstRss(
  router: RoutedProcess,
): Promise<{ idle: number; peak: number }> {
  const big = lengthProgram(randomBytes(256 << 20));
  const idle = rssMiB(router.pid);
  let peak = idle;
  const sampler = setInterval(() => (peak = Math.max(peak, rssMiB(router.pid))), 20);
  try {
    await Promise.all(Array.from({ length: 8 }, async () => {
      await using client = new Client(router.url);
      const out = await client.execute(big);
      if (out.get("n") !== 256 << 20) throw new Error("wrong length");
    }));
  } finally {
    clearInterval(sampler);
  }
  return { idle, peak };
}

/**
 * `forwardExecute` of two checkouts side by side in one process, as `forward_in_process.ts` runs
 * it (a registered slot whose socket answers each request in a microtask with a whole frame; the
 * metrics listener and a client watch as the Router has them), the trees taking turns in blocks
 * of `--requests` for `--rounds` rounds. Prints per tree the fastest and the median block, in
 * microseconds per request; both include building the request and reading the answer, and the
 * stand-in node's own decoding and encoding.
 *
 *   deno run -A bench/probes/forward_in_process_ab.ts TREE_A TREE_B [--rounds N] [--requests N]
 *
 * @module
 */
import { median, numberArg, positionalArgs } from "./_probe.ts";

/** One tree's forwarding, ready to run requests. */
interface _Way {
  tree: string;
  run: () => Promise<void>;
  flush: () => void;
  blocks: number[];
}

async function _setUp(tree: string): Promise<_Way> {
  const root = new URL(`${tree.replace(/\/$/, "")}/`, `file://${Deno.cwd()}/`);
  const load = (path: string) => import(new URL(path, root).href);
  const { forwardExecute } = await load("router/forward.ts");
  const { NodeRegistry } = await load("router/registry.ts");
  const { RouterSlot } = await load("router/slot_link.ts");
  const { RouterMetrics } = await load("router/metrics.ts");
  const { ClientWatch } = await load("router/client_watch.ts");
  const { EventLog } = await load("http/events.ts");
  const { decodeWholeFrame, encodeWholeFrame } = await load("protocol/node_link.ts");
  const { standInStatus } = await load("bench/_routed.ts");
  const events = new EventLog({
    logDir: null,
    console: true,
    programs: false,
    consoleWrite: () => {},
    consoleBatched: ["request_finished"],
  });
  const registry = new NodeRegistry({
    maxStatusAgeMs: 1e9,
    unhealthyThreshold: 3,
    recoveryThreshold: 1,
    nodeRetentionMs: 600_000,
    statusCheckIntervalMs: 1000,
    maxQueuedRequests: 16,
    queueWaitTimeoutMs: 1000,
  });
  registry.controlStatus({ connectionId: "c", close() {} }, standInStatus("n", "i"), true);
  new RouterMetrics(events, registry);
  const answer = new TextEncoder().encode('{"status":"COMPLETED","outputs":{}}');
  const hello = {
    t: "hello",
    node_id: "n",
    server_instance_id: "i",
    slot_id: "x",
    protocol_version: 1,
    whole: true,
  };
  const socket = {
    send(data: Uint8Array) {
      const { head } = decodeWholeFrame(data);
      const frame = encodeWholeFrame({
        t: "response_head",
        request_id: head.request_id,
        status: 200,
        headers: [
          ["content-type", "application/json"],
          ["content-length", String(answer.length)],
          ["x-request-id", head.request_id],
        ],
      }, answer);
      queueMicrotask(() => slot.receive(frame.buffer));
    },
    close() {},
  };
  const slot = new RouterSlot(socket, hello, () => {});
  registry.registerSlot(hello, slot);
  const ctx = {
    registry,
    maxRequestBytes: 1 << 28,
    events,
    clientWatch: new ClientWatch(),
    onFinished: () => {},
  };
  const headers = {
    "content-length": "1",
    "content-type": "application/octet-stream",
    host: "127.0.0.1:9000",
    "user-agent": "kcoral-ts/0.1",
    accept: "*/*",
    "x-a": "1",
    "x-b": "2",
  };
  const body = new Uint8Array([120]);
  return {
    tree,
    async run() {
      const request = new Request("http://127.0.0.1:9000/execute", {
        method: "POST",
        body,
        headers,
      });
      const response: Response = await forwardExecute(request, ctx);
      if (response.status !== 200) throw new Error(`${tree}: status ${response.status}`);
      await response.arrayBuffer();
    },
    flush: () => events.flush(),
    blocks: [],
  };
}

const trees = positionalArgs();
if (trees.length < 2) throw new Error("usage: forward_in_process_ab.ts TREE_A TREE_B");
const rounds = numberArg("--rounds", 16);
const requests = numberArg("--requests", 3000);
const ways: _Way[] = [];
for (const tree of trees) ways.push(await _setUp(tree));
for (const way of ways) for (let i = 0; i < 5000; i++) await way.run();
for (let round = 0; round < rounds; round++) {
  for (const way of round % 2 === 0 ? ways : [...ways].reverse()) {
    const start = performance.now();
    for (let i = 0; i < requests; i++) await way.run();
    way.blocks.push((performance.now() - start) / requests * 1000);
    way.flush();
  }
}
for (const way of ways) {
  console.log(
    `${way.tree}: fastest block ${Math.min(...way.blocks).toFixed(2)} µs, median ${
      median(way.blocks).toFixed(2)
    } µs per request`,
  );
}
Deno.exit(0);

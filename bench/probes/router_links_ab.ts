/**
 * The Router's CPU per trivial request with many node links, in two checkouts side by side in
 * one run: per round and tree a fresh `kcoral router` of that tree, `--links` stand-in nodes in
 * this process (each a control link with heartbeats every 2 s, as supervisors send them, and one
 * slot answering at once in one frame), a warm-up, then `--requests` one-byte posts one at a time;
 * the Router's own CPU (from /proc) and the client's mean time per request. The trees take turns
 * round by round, so the machine's drift falls on both alike. `--no-heartbeats` leaves the
 * control links silent after their first report.
 *
 *   deno run -A bench/probes/router_links_ab.ts TREE_A TREE_B [--links 500] [--rounds 4]
 *     [--requests 1000] [--no-heartbeats]
 *
 * @module
 */
import type { WebSocketClient } from "../../link/websocket_client.ts";
import { ownCpuMs } from "../_proc.ts";
import { standInControl, standInSlot, startRouterProcess, waitForCapacity } from "../_routed.ts";
import { median, numberArg, positionalArgs } from "./_probe.ts";

const trees = positionalArgs().slice(0, 2);
if (trees.length !== 2) throw new Error("usage: router_links_ab.ts TREE_A TREE_B [--links N]");
const links = numberArg("--links", 500);
const rounds = numberArg("--rounds", 4);
const requests = numberArg("--requests", 1000);
const heartbeats = !Deno.args.includes("--no-heartbeats");
const body = new TextEncoder().encode("x");

/** `count` stand-in nodes linked to `url`: a control link and one slot each; closes them all. */
async function standInNodes(url: string, count: number): Promise<() => void> {
  const sockets: WebSocketClient[] = [];
  for (let i = 0; i < count; i++) {
    const nodeId = `load-${i}`;
    const instance = crypto.randomUUID();
    const control = await standInControl(url, nodeId, instance, {
      everyMs: heartbeats ? 2000 : 1e9,
    });
    const slot = await standInSlot(url, nodeId, instance);
    sockets.push(control, slot);
  }
  return () => sockets.forEach((socket) => socket.close());
}

async function post(url: string): Promise<void> {
  const response = await fetch(`${url}/execute`, {
    method: "POST",
    body,
    headers: { "content-type": "application/octet-stream" },
  });
  await response.arrayBuffer();
}

const cpu = new Map<string, number[]>(trees.map((tree) => [tree, []]));
const time = new Map<string, number[]>(trees.map((tree) => [tree, []]));
for (let round = 1; round <= rounds; round++) {
  for (const tree of trees) {
    // Silent control links would expire after --max-status-age-seconds: let them last.
    const router = await startRouterProcess(
      ["--max-status-age-seconds", "3600", "--node-retention-seconds", "7200"],
      tree,
    );
    const close = await standInNodes(router.url, links);
    try {
      await waitForCapacity(router.url, links);
      for (let i = 0; i < 300; i++) await post(router.url);
      const before = ownCpuMs(router.pid);
      const start = performance.now();
      for (let i = 0; i < requests; i++) await post(router.url);
      const ms = (performance.now() - start) / requests;
      const perRequest = (ownCpuMs(router.pid) - before) / requests;
      cpu.get(tree)!.push(perRequest);
      time.get(tree)!.push(ms);
      console.log(
        `round ${round} ${tree}: ${links} links, CPU ${perRequest.toFixed(3)} ms/request, ` +
          `${ms.toFixed(3)} ms/request at the client`,
      );
    } finally {
      close();
      await router.stop();
    }
  }
}
for (const tree of trees) {
  console.log(
    `${tree}: median CPU ${median(cpu.get(tree)!).toFixed(3)} ms/request, ` +
      `${median(time.get(tree)!).toFixed(3)} ms/request at the client`,
  );
}

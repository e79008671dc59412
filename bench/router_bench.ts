/**
 * The Router's cost (seed 003, issue 18): one node (`kcoral server` linked to a `kcoral router`,
 * both processes on loopback) measured through the Router and directly on the node's own port,
 * alternating, in the same run:
 *
 * - added latency of a trivial request on reused workers (p50 of routed − p50 of direct);
 * - throughput of 8 closed-loop clients, routed / direct;
 * - a 64 MiB request (16 pairs after one uncounted) and then a 64 MiB result (16 pairs), added
 *   ms per MiB, each pair in alternating order (ABBA);
 * - the Router's resident memory while 8 clients each send a 256 MiB request at once;
 * - the Router's CPU per request with 1, 10, 100 and 500 connected nodes, one client: the nodes
 *   are a load generator speaking the node protocol (a control link and one slot each,
 *   answering at once), not real servers. A fresh Router per count and round, the counts taking
 *   turns over 5 rounds, so each row has 5 samples and drift falls on all alike; a last row
 *   gives the largest distance of a row's median from the four medians' mean.
 *
 * The node is a real `kcoral server --router` (its supervisor and its server); direct requests
 * go to that server's own port.
 *
 *   deno run -A bench/router_bench.ts [--mode cpu|sim|gpu] [--quick]
 *
 * @module
 */
import { Client } from "../mod.ts";
import { bytesResultProgram, lengthProgram, randomBytes, trivialProgram } from "./_programs.ts";
import { closedLoop } from "./_load.ts";
import { type BenchRow, row, summarize, table } from "./_stats.ts";
import { WebSocketClient } from "../link/websocket_client.ts";
import { ownCpuMs } from "./_proc.ts";
import {
  type NodeMode,
  standInSlot,
  standInStatus,
  startNodeProcess,
  startRouterProcess,
  timedPairs,
  uploadBurstRss,
  waitForCapacity,
} from "./_routed.ts";
import { CONTROL_PATH, encodeMessage } from "../link/messages.ts";

/** What to measure. */
export interface RouterBenchOptions {
  /** The node's device. */
  mode: NodeMode;
  /** Shorter runs. */
  quick?: boolean;
}

function _progress(phase: string): void {
  console.error(`router bench: ${phase} (${new Date().toISOString()})`);
}

/** Fake nodes: `count` control links and one slot each, answering every request at once. */
async function _fakeNodes(routerUrl: string, count: number, versions: Record<string, string>) {
  // Our client, as real nodes use (the platform's keeps Nagle on: answers would wait for ACKs).
  const sockets: WebSocketClient[] = [];
  const ws = routerUrl.replace(/^http/, "ws");
  const statuses: (() => void)[] = [];
  for (let i = 0; i < count; i++) {
    const nodeId = `load-${i}`;
    const instance = crypto.randomUUID();
    const control = new WebSocketClient(ws + CONTROL_PATH);
    await new Promise<void>((resolve) => (control.onopen = resolve));
    const status = standInStatus(nodeId, instance, versions);
    control.send(encodeMessage(status));
    statuses.push(() => control.send(encodeMessage(status)));
    const slot = await standInSlot(routerUrl, nodeId, instance);
    sockets.push(control, slot);
  }
  // Heartbeats as supervisors send them (every 2 s).
  const timer = setInterval(() => statuses.forEach((send) => send()), 2000);
  return () => {
    clearInterval(timer);
    for (const socket of sockets) socket.close();
  };
}

async function _post(url: string, body: Uint8Array<ArrayBuffer>): Promise<void> {
  const response = await fetch(`${url}/execute`, {
    method: "POST",
    body,
    headers: { "content-type": "application/octet-stream" },
  });
  await response.arrayBuffer();
}

/** Runs the Router benchmark and returns its rows. */
export async function runRouterBench(options: RouterBenchOptions): Promise<BenchRow[]> {
  const quick = options.quick ?? false;
  const rows: BenchRow[] = [];
  const router = await startRouterProcess(["--max-request-bytes", String(300 << 20)]);
  const node = await startNodeProcess(options.mode, router.url, 8);
  try {
    await waitForCapacity(router.url, 8);
    await using direct = new Client(node.url);
    await using routed = new Client(router.url);
    const trivial = trivialProgram();
    for (let i = 0; i < 50; i++) (await direct.execute(trivial), await routed.execute(trivial));

    _progress("latency");
    // Added latency: alternate direct and routed requests so drift affects both alike.
    const rounds = quick ? 3 : 5;
    const added: number[] = [];
    const routedP50: number[] = [];
    const directP50: number[] = [];
    for (let r = 0; r < rounds; r++) {
      const times = await timedPairs(direct, routed, trivial, 200);
      const dm = summarize(times.direct).median;
      const tm = summarize(times.routed).median;
      directP50.push(dm);
      routedP50.push(tm);
      added.push(tm - dm);
    }
    rows.push(row("trivial, reused: direct p50", "ms", directP50));
    rows.push(row("trivial, reused: through the Router p50", "ms", routedP50));
    rows.push(row("added latency per trivial request (p50)", "ms", added, undefined, "≤ 0.5"));

    _progress("throughput");
    // Throughput, 8 clients.
    const ratios: number[] = [];
    const directRates: number[] = [];
    const routedRates: number[] = [];
    const seconds = quick ? 2 : 4;
    for (let r = 0; r < rounds; r++) {
      const d = await closedLoop(node.url, trivial, 8, seconds);
      const t = await closedLoop(router.url, trivial, 8, seconds);
      directRates.push(d.rate);
      routedRates.push(t.rate);
      ratios.push((100 * t.rate) / d.rate);
    }
    rows.push(row("8 closed-loop clients: direct", "req/s", directRates));
    rows.push(row("8 closed-loop clients: through the Router", "req/s", routedRates));
    rows.push(row("throughput through the Router vs direct", "%", ratios, undefined, "≥ 90"));

    _progress("64 MiB");
    // 64 MiB request (a fresh blob each time: resent after CACHE_MISS) and 64 MiB result.
    const mib = 64;
    const requestAdded: number[] = [];
    const resultAdded: number[] = [];
    const resultDirect: number[] = [];
    const resultRouted: number[] = [];
    const result = bytesResultProgram(mib);
    // Each pair alternates which side goes first (ABBA), so neither always follows the other's
    // 64 MiB of freed memory and work deferred past its answer.
    const pair = (r: number) => (r % 2 === 0 ? [direct, routed] : [routed, direct]);
    // One pair first, not counted: the first 64 MiB upload to each side is an outlier (on the
    // H200, −3.13 ms/MiB where the next ten read −0.05 to 0.44). Each pair's figure goes to
    // stderr.
    for (let r = -1; r < (quick ? 4 : 16); r++) {
      const times = new Map<Client, number>();
      for (const client of pair(r + 1)) {
        const program = lengthProgram(randomBytes(mib << 20));
        const start = performance.now();
        const out = await client.execute(program);
        if (out.get("n") !== mib << 20) throw new Error("wrong length");
        times.set(client, performance.now() - start);
      }
      const added = (times.get(routed)! - times.get(direct)!) / mib;
      _progress(`64 MiB request pair ${r + 1}: ${added.toFixed(2)} ms/MiB added`);
      if (r >= 0) requestAdded.push(added);
    }
    // The results in their own pairs, after the uploads (a 64 MiB upload just before a result
    // leaves the client without the buffer it prepares for a large answer, on one side or both).
    for (let r = 0; r < (quick ? 4 : 16); r++) {
      const times = new Map<Client, number>();
      for (const client of pair(r)) {
        const start = performance.now();
        const out = await client.execute(result);
        if ((out.get("data") as Uint8Array).length !== mib << 20) throw new Error("short");
        times.set(client, performance.now() - start);
      }
      resultAdded.push((times.get(routed)! - times.get(direct)!) / mib);
      resultDirect.push(times.get(direct)!);
      resultRouted.push(times.get(routed)!);
    }
    rows.push(
      row("64 MiB request, added through the Router", "ms/MiB", requestAdded, undefined, "≤ 0.2"),
    );
    rows.push(row("64 MiB result: direct", "ms", resultDirect));
    rows.push(row("64 MiB result: through the Router", "ms", resultRouted));
    rows.push(
      row("64 MiB result, added through the Router", "ms/MiB", resultAdded, undefined, "≤ 0.2"),
    );

    // Router memory: 8 clients each send a 256 MiB request at once.
    _progress("memory");
    const { idle, peak } = await uploadBurstRss(router);
    rows.push(row("Router RSS, idle", "MiB", [idle]));
    rows.push(
      row("Router RSS above idle, 8 × 256 MiB in flight", "MiB", [peak - idle], undefined, "≤ 64"),
    );
  } finally {
    await node.stop();
    await router.stop();
  }

  // CPU per request with many connected nodes: a fresh Router per count and round, the counts
  // taking turns round by round, so that the machine's drift over the minutes falls on every
  // count alike (one Router at a time: on a small machine, idle Routers beside it would slow it).
  const counts = [1, 10, 100, 500];
  const rounds = 5;
  const perRound = quick ? 500 : 1500;
  const routers = counts.map((count) => ({ count, cpu: [] as number[] }));
  const body = new TextEncoder().encode("x");
  for (let round = 0; round < rounds; round++) {
    for (const router of routers) {
      _progress(`CPU: round ${round + 1} of ${rounds}, ${router.count} node links`);
      const r = await startRouterProcess();
      const stop = await _fakeNodes(r.url, router.count, {});
      try {
        await waitForCapacity(r.url, router.count);
        // Warm-up: past the new Router's first compilations.
        for (let i = 0; i < 500; i++) await _post(r.url, body);
        // One client: no request waits in the Router's queue, whatever the node count (a queue
        // would add its own work with one link of one slot, and none with 500).
        const before = ownCpuMs(r.pid);
        for (let sent = 0; sent < perRound; sent++) await _post(r.url, body);
        router.cpu.push((ownCpuMs(r.pid) - before) / perRound);
      } finally {
        stop();
        await r.stop();
      }
    }
  }
  const medians: number[] = [];
  for (const { count, cpu } of routers) {
    const summary = row(
      `Router CPU per request, ${count} node link(s) (load generator)`,
      "ms",
      cpu,
    );
    rows.push(summary);
    medians.push(summary.median);
  }
  const mean = medians.reduce((a, b) => a + b, 0) / medians.length;
  const spread = Math.max(...medians.map((m) => Math.abs(m / mean - 1))) * 100;
  rows.push(
    row(
      "Router CPU per request, largest median's distance from their mean",
      "%",
      [spread],
      undefined,
      "≤ 20",
    ),
  );
  return rows;
}

if (import.meta.main) {
  const arg = (name: string) => {
    const i = Deno.args.indexOf(name);
    return i >= 0 ? Deno.args[i + 1] : undefined;
  };
  const mode = (arg("--mode") ?? "cpu") as RouterBenchOptions["mode"];
  console.log(`## Router (${mode}) — ${new Date().toISOString()}\n`);
  console.log(table(await runRouterBench({ mode, quick: Deno.args.includes("--quick") })));
}

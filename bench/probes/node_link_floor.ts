/**
 * The transport's share of a routed trivial request, without a pipeline: one node process
 * answers every request at once with the same small JSON, both ways a node's server takes work —
 * on its own port (`Deno.serve`, as a direct request reaches a server) and through its slot to a
 * real `kcoral router` (`node/slot_links.ts`, as a routed request reaches it; a stand-in control
 * link reports it healthy). Rounds alternate direct and routed requests (one client, keep-alive
 * `fetch`, a one-byte body) and print per way the client's p50 and the CPU per request of the
 * node's process and of the Router's (from /proc); then routed − direct. What this difference
 * leaves out of a real routed request's added latency is the pipeline's own difference.
 *
 *   deno run -A bench/probes/node_link_floor.ts [TREE] [--rounds N] [--requests N] [--slots N]
 *
 * `--slots N`: the node links N slots (a server links one per worker); the Router takes them in
 * turn, so each request finds a connection that was idle for N − 1 requests. `--delay-ms D`: the
 * node waits D ms (a timer) before each answer, as a server waits for its worker: every process
 * on the path then idles as long as it does on a real request.
 *
 * `TREE`: another checkout to take the Router and the node's link code from.
 *
 * @module
 */
import { ownCpuMs } from "../_proc.ts";
import {
  freePort,
  spawnUntilReady,
  standInControl,
  startRouterProcess,
  waitForCapacity,
} from "../_routed.ts";
import { median, numberArg, positionalArgs, timeOneBytePosts } from "./_probe.ts";

const _SELF = new URL(import.meta.url).pathname;
const _ANSWER = '{"status":"COMPLETED","outputs":{}}';

if (Deno.args[0] === "--node") {
  await _node(
    Deno.args[1],
    Number(Deno.args[2]),
    Deno.args[3],
    Number(Deno.args[4] ?? 1),
    Number(Deno.args[5] ?? 0),
  );
} else await _main();

/** The node: its own port, and one slot linked to the Router, both answering at once. */
async function _node(
  routerUrl: string,
  port: number,
  tree: string,
  slots: number,
  delayMs: number,
): Promise<never> {
  const root = new URL(`${tree.replace(/\/$/, "")}/`, `file://${Deno.cwd()}/`);
  // The node's slot links: node/ since the link got its own folders, server/ in older trees.
  const { NodeLink } = await import(
    new URL(
      await Deno.stat(new URL("node/slot_links.ts", root)).then(
        () => "node/slot_links.ts",
        () => "server/node_link.ts",
      ),
      root,
    ).href
  );
  const { EventLog } = await import(new URL("http/events.ts", root).href);
  // As a server waits for its worker: the process idles for `delayMs` before it answers.
  const wait = () => delayMs > 0 ? new Promise((resolve) => setTimeout(resolve, delayMs)) : null;
  const answer = () =>
    new Response(_ANSWER, {
      headers: { "content-type": "application/json", "content-length": String(_ANSWER.length) },
    });
  Deno.serve({ hostname: "127.0.0.1", port, onListen: () => {} }, async (request) => {
    await request.bytes();
    await wait();
    return answer();
  });
  const instance = crypto.randomUUID();
  await standInControl(routerUrl, "link-floor", instance, { workerCount: slots, everyMs: 1000 });
  const link = new NodeLink({
    routerEndpoint: routerUrl,
    nodeId: "link-floor",
    nodeToken: null,
    serverInstanceId: instance,
    slots,
    execute: async (request: Request | { bytes(): Promise<Uint8Array> }) => {
      await request.bytes();
      await wait();
      return answer();
    },
    events: new EventLog({ logDir: null, console: false, programs: false }),
  });
  link.start();
  console.error("ready");
  return await new Promise<never>(() => {});
}

async function _main(): Promise<void> {
  const rounds = numberArg("--rounds", 8);
  const requests = numberArg("--requests", 1000);
  const tree = positionalArgs()[0];
  const slots = numberArg("--slots", 1);
  const router = await startRouterProcess([], tree);
  const port = freePort();
  const node = await spawnUntilReady(
    [
      _SELF,
      "--node",
      router.url,
      String(port),
      tree ?? new URL("../..", import.meta.url).pathname,
      String(slots),
      String(numberArg("--delay-ms", 0)),
    ],
    "ready",
  );
  await waitForCapacity(router.url, slots);
  const ways = [
    { name: "direct", url: `http://127.0.0.1:${port}`, p50: [] as number[], cpu: [] as number[] },
    { name: "routed", url: router.url, p50: [] as number[], cpu: [] as number[] },
  ];
  const routerCpu: number[] = [];
  for (const way of ways) await timeOneBytePosts(way.url, 2000);
  for (let round = 0; round < rounds; round++) {
    for (const way of round % 2 === 0 ? ways : [...ways].reverse()) {
      const before = ownCpuMs(node.pid);
      const routerBefore = ownCpuMs(router.pid);
      way.p50.push(median(await timeOneBytePosts(way.url, requests)));
      way.cpu.push((ownCpuMs(node.pid) - before) / requests);
      if (way.name === "routed") routerCpu.push((ownCpuMs(router.pid) - routerBefore) / requests);
    }
    console.log(
      `round ${round + 1}: direct p50 ${ways[0].p50.at(-1)!.toFixed(3)} ms, routed ${
        ways[1].p50.at(-1)!.toFixed(3)
      } ms; node CPU ${ways[0].cpu.at(-1)!.toFixed(3)} / ${
        ways[1].cpu.at(-1)!.toFixed(3)
      } ms; Router CPU ${routerCpu.at(-1)!.toFixed(3)} ms`,
    );
  }
  const [direct, routed] = ways.map((way) => median(way.p50));
  console.log(
    `direct p50 ${direct.toFixed(3)} ms, routed ${routed.toFixed(3)} ms, added ${
      (routed - direct).toFixed(3)
    } ms; node CPU per request direct ${median(ways[0].cpu).toFixed(3)} ms, routed ${
      median(ways[1].cpu).toFixed(3)
    } ms; Router CPU ${median(routerCpu).toFixed(3)} ms`,
  );
  node.kill("SIGKILL");
  await router.stop();
}

/**
 * The Router's resident memory above idle while 8 clients each send a 256 MiB request at once
 * (`router_bench.ts`'s memory row), in two checkouts: each trial starts a new `kcoral router`
 * and CPU node (8 reused workers, sandbox none) from one tree, so every trial sees the first
 * burst a Router takes (later bursts reuse the memory the first one mapped); the trees
 * alternate. Prints one line per trial and the median per tree.
 *
 *   deno run -A bench/probes/router_memory_ab.ts TREE_A TREE_B [--trials N] [gpu]
 *
 * @module
 */
import {
  startNodeProcess,
  startRouterProcess,
  uploadBurstRss,
  waitForCapacity,
} from "../_routed.ts";
import { summarize } from "../_stats.ts";

const at = Deno.args.indexOf("--trials");
const trials = at >= 0 ? Number(Deno.args[at + 1]) : 3;
const trees = Deno.args.filter((arg, i) =>
  !arg.startsWith("--") && !Deno.args[i - 1]?.startsWith("--") && arg !== "gpu"
).slice(0, 2);
if (trees.length !== 2) throw new Error("usage: router_memory_ab.ts TREE_A TREE_B [--trials N]");
const mode = Deno.args.includes("gpu") ? "gpu" : "cpu";

/** One trial: the peak RSS above idle (MiB) of a new Router from `tree`. */
async function trial(tree: string): Promise<number> {
  const router = await startRouterProcess(["--max-request-bytes", String(300 << 20)], tree);
  const node = await startNodeProcess(mode, router.url, 8, tree);
  try {
    await waitForCapacity(router.url, 8);
    const { idle, peak } = await uploadBurstRss(router);
    return peak - idle;
  } finally {
    await node.stop();
    await router.stop();
  }
}

const results: number[][] = trees.map(() => []);
for (let t = 0; t < trials; t++) {
  for (const [i, tree] of trees.entries()) {
    const above = await trial(tree);
    results[i].push(above);
    console.log(`trial ${t + 1}, ${"AB"[i]} (${tree}): ${above.toFixed(1)} MiB above idle`);
  }
}
for (const [i, tree] of trees.entries()) {
  const s = summarize(results[i]);
  console.log(
    `${"AB"[i]} (${tree}): median ${s.median.toFixed(1)} MiB, min ${s.min.toFixed(1)}, max ${
      s.max.toFixed(1)
    }`,
  );
}

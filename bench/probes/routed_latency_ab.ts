/**
 * The Router's added latency in two checkouts, side by side in one run: each tree gets its own
 * `kcoral router` and node (2 reused workers, sandbox none); rounds alternate the trees, and each
 * round alternates 200 direct requests (the node's own port) with 200 routed ones. Per tree and
 * round: routed p50 − direct p50; then the median over rounds. Two runs of different code on
 * different VMs are never compared (docs/decisions.md, "Published figures").
 *
 *   deno run -A bench/probes/routed_latency_ab.ts TREE_A TREE_B [--rounds N] [gpu]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { trivialProgram } from "../_programs.ts";
import { summarize } from "../_stats.ts";
import { startNodeProcess, startRouterProcess, waitForCapacity } from "../_routed.ts";

const trees = Deno.args.filter((arg) => !arg.startsWith("--") && arg !== "gpu").slice(0, 2);
if (trees.length !== 2) throw new Error("usage: routed_latency_ab.ts TREE_A TREE_B [--rounds N]");
const at = Deno.args.indexOf("--rounds");
const rounds = at >= 0 ? Number(Deno.args[at + 1]) : 8;
const mode = Deno.args.includes("gpu") ? "gpu" : "cpu";

const sides = [];
for (const tree of trees) {
  const router = await startRouterProcess([], tree);
  const node = await startNodeProcess(mode, router.url, 2, tree);
  await waitForCapacity(router.url, 2);
  sides.push({ tree, router, node, direct: new Client(node.url), routed: new Client(router.url) });
}
const program = trivialProgram();
const added: number[][] = sides.map(() => []);
try {
  for (const side of sides) {
    for (let i = 0; i < 50; i++) {
      (await side.direct.execute(program), await side.routed.execute(program));
    }
  }
  for (let round = 0; round < rounds; round++) {
    for (const [k, side] of sides.entries()) {
      const direct: number[] = [];
      const routed: number[] = [];
      for (let i = 0; i < 200; i++) {
        let start = performance.now();
        await side.direct.execute(program);
        direct.push(performance.now() - start);
        start = performance.now();
        await side.routed.execute(program);
        routed.push(performance.now() - start);
      }
      const d = summarize(direct).median;
      const r = summarize(routed).median;
      added[k].push(r - d);
      console.log(
        `round ${round + 1} ${k ? "B" : "A"}: direct ${d.toFixed(3)} ms, routed ${
          r.toFixed(3)
        } ms, added ${(r - d).toFixed(3)} ms`,
      );
    }
  }
  for (const [k, side] of sides.entries()) {
    const s = summarize(added[k]);
    console.log(
      `${k ? "B" : "A"} ${side.tree}: added p50 median ${s.median.toFixed(3)} ms (min ${
        s.min.toFixed(3)
      }, max ${s.max.toFixed(3)})`,
    );
  }
} finally {
  for (const side of sides) {
    side.direct.close();
    side.routed.close();
    await side.node.stop();
    await side.router.stop();
  }
}

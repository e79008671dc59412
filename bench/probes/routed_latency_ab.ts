/**
 * The Router's added latency in two checkouts, side by side in one run (`bench/_routed_ab.ts`):
 * each round alternates 200 direct requests (the node's own port) with 200 routed ones. Per tree
 * and round: routed p50 − direct p50; then the median over rounds.
 *
 *   deno run -A bench/probes/routed_latency_ab.ts TREE_A TREE_B [--rounds N] [--gap MS] [gpu|sim]
 *
 * `gpu` links nodes on GPU 0, `sim` nodes with simulated GPUs (their answers carry GPU receipts
 * from the stand-in NVML, as a GPU node's do), neither CPU nodes.
 *
 * `--gap MS` idles that long after each request (`bench/_routed_ab.ts`): without it, a Router's
 * work deferred past its answer can land on the direct request timed next.
 *
 * @module
 */
import type { Client } from "../../mod.ts";
import { trivialProgram } from "../_programs.ts";
import { runRoutedAB } from "../_routed_ab.ts";

const trees = Deno.args.filter((arg, i) =>
  !arg.startsWith("--") && !Deno.args[i - 1]?.startsWith("--") && arg !== "gpu" && arg !== "sim"
).slice(0, 2);
if (trees.length !== 2) throw new Error("usage: routed_latency_ab.ts TREE_A TREE_B [--rounds N]");
const at = Deno.args.indexOf("--rounds");
const gapAt = Deno.args.indexOf("--gap");
const program = trivialProgram();

await runRoutedAB({
  trees,
  mode: Deno.args.includes("gpu") ? "gpu" : Deno.args.includes("sim") ? "sim" : "cpu",
  rounds: at >= 0 ? Number(Deno.args[at + 1]) : 8,
  perRound: 200,
  warmups: 50,
  gapMs: gapAt >= 0 ? Number(Deno.args[gapAt + 1]) : 0,
  time: async (client: Client) => {
    const start = performance.now();
    await client.execute(program);
    return performance.now() - start;
  },
  added: (direct, routed) => routed - direct,
  unit: "ms",
  digits: 3,
  msDigits: 3,
});

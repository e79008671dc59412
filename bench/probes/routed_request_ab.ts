/**
 * What the Router adds to a large request, in two checkouts side by side in one run
 * (`bench/_routed_ab.ts`): a program that uploads `--mib` MiB of fresh random `bytes` (64 by
 * default; a fresh blob each time, sent after the server's CACHE_MISS, as `router_bench.ts`'s
 * 64 MiB request row) direct and through the Router, `--per-round` times each per round,
 * alternating. Per tree and round: (routed median − direct median) / MiB; then the median over
 * rounds.
 *
 *   deno run -A bench/probes/routed_request_ab.ts TREE_A TREE_B [--rounds N] [--mib N] [gpu]
 *
 * @module
 */
import { numberArg, positionalArgs } from "./_probe.ts";
import type { Client } from "../../mod.ts";
import { lengthProgram, randomBytes } from "../_programs.ts";
import { runRoutedAB } from "../_routed_ab.ts";

const trees = positionalArgs().slice(0, 2);
if (trees.length !== 2) throw new Error("usage: routed_request_ab.ts TREE_A TREE_B [--rounds N]");
const mib = numberArg("--mib", 64);

await runRoutedAB({
  trees,
  mode: Deno.args.includes("gpu") ? "gpu" : "cpu",
  rounds: numberArg("--rounds", 6),
  perRound: numberArg("--per-round", 3),
  warmups: 2,
  time: async (client: Client) => {
    const program = lengthProgram(randomBytes(mib << 20)); // made before the clock starts
    const start = performance.now();
    const out = await client.execute(program);
    if (out.get("n") !== mib << 20) throw new Error("short request");
    return performance.now() - start;
  },
  added: (direct, routed) => (routed - direct) / mib,
  unit: "ms/MiB",
  digits: 2,
  msDigits: 0,
});

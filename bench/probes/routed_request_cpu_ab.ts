/**
 * A large request direct and through the Router in two checkouts, side by side in one run: each
 * tree gets its own `kcoral router` and node (`bench/_routed_ab.ts`); rounds alternate the trees,
 * and each request alternates routed and direct. Per request: the Router process's own CPU time
 * (utime + stime, all its threads, 10 ms ticks; read 50 ms after the answer so that work
 * deferred past it counts), the routed wall time and the direct wall time. Medians, min and max
 * per tree; the added time is routed − direct.
 *
 *   deno run -A bench/probes/routed_request_cpu_ab.ts TREE_A TREE_B [--rounds 4] [--per-round 4]
 *     [--mib 64]
 *
 * @module
 */
import { numberArg, positionalArgs } from "./_probe.ts";
import { lengthProgram, randomBytes } from "../_programs.ts";
import { startRoutedSide, stopRoutedSides } from "../_routed_ab.ts";
import { ownCpuMs } from "../_proc.ts";
import { summarize } from "../_stats.ts";

const trees = positionalArgs().slice(0, 2);
if (trees.length !== 2) throw new Error("usage: routed_request_cpu_ab.ts TREE_A TREE_B");
const rounds = numberArg("--rounds", 4);
const perRound = numberArg("--per-round", 4);
const mib = numberArg("--mib", 64);
const sides = [];
for (const tree of trees) sides.push(await startRoutedSide(tree, "cpu"));
const cpu: number[][] = sides.map(() => []);
const routed: number[][] = sides.map(() => []);
const direct: number[][] = sides.map(() => []);
const fresh = () => lengthProgram(randomBytes(mib << 20)); // a new blob: sent after CACHE_MISS
const span = (xs: number[]) => {
  const s = summarize(xs);
  return `${s.median.toFixed(0)} (${s.min.toFixed(0)}–${s.max.toFixed(0)})`;
};
try {
  for (const side of sides) for (let i = 0; i < 2; i++) await side.routed.execute(fresh());
  for (let round = 0; round < rounds; round++) {
    for (const [k, side] of sides.entries()) {
      for (let i = 0; i < perRound; i++) {
        let program = fresh();
        const cpuBefore = ownCpuMs(side.router.pid);
        let start = performance.now();
        await side.routed.execute(program);
        routed[k].push(performance.now() - start);
        await new Promise((resolve) => setTimeout(resolve, 50));
        cpu[k].push(ownCpuMs(side.router.pid) - cpuBefore);
        program = fresh();
        start = performance.now();
        await side.direct.execute(program);
        direct[k].push(performance.now() - start);
      }
      console.log(`round ${round + 1} ${"AB"[k]} done`);
    }
  }
  console.log(`\n${mib} MiB request, ms: median (min–max) over ${rounds * perRound} requests\n`);
  console.log("| tree | Router CPU | routed | direct | added (medians) |");
  console.log("|---|---|---|---|---|");
  for (const [k, tree] of trees.entries()) {
    const added = summarize(routed[k]).median - summarize(direct[k]).median;
    console.log(
      `| ${"AB"[k]} ${tree} | ${span(cpu[k])} | ${span(routed[k])} | ${span(direct[k])} | ${
        added.toFixed(0)
      } |`,
    );
  }
} finally {
  await stopRoutedSides(sides);
}

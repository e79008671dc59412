/**
 * What the Router adds to a large result with the client of each checkout: per tree, a Router
 * and a node (2 reused workers, `bench/_routed_ab.ts`), then `--pairs` direct/routed pairs of a
 * `--mib` MiB `bytes` result (64 by default) on the tree's own `Client` (imported from the tree),
 * trees taking turns `--turns` times. Unlike `routed_result_ab.ts`, whose one client is the tree
 * it runs from, this shows client changes (reading a chunked answer). Prints per turn and tree the
 * median direct and routed time, routed − direct per MiB, and the client's CPU per request.
 *
 *   deno run -A bench/probes/routed_result_own_client.ts TREE_A [TREE_B] [--pairs N] [--turns N] [gpu]
 *
 * @module
 */
import process from "node:process";
import { median, numberArg, positionalArgs } from "./_probe.ts";

const trees = positionalArgs().map((tree) => Deno.realPathSync(tree));
if (trees.length < 1) throw new Error("usage: routed_result_own_client.ts TREE_A [TREE_B]");
const mib = numberArg("--mib", 64);
const pairs = numberArg("--pairs", 12);
const turns = numberArg("--turns", 2);
const mode = Deno.args.includes("gpu") ? "gpu" : "cpu";

for (let turn = 1; turn <= turns; turn++) {
  for (const tree of trees) {
    const { startRoutedSide, stopRoutedSides } = await import(`${tree}/bench/_routed_ab.ts`);
    const { bytesResultProgram } = await import(`${tree}/bench/_programs.ts`);
    const side = await startRoutedSide(tree, mode);
    const program = bytesResultProgram(mib);
    const rows = { direct: [] as number[][], routed: [] as number[][] };
    try {
      for (let i = 0; i < pairs + 2; i++) {
        for (const way of ["direct", "routed"] as const) {
          const cpu = process.cpuUsage();
          const start = performance.now();
          const out = await side[way].execute(program);
          const elapsed = performance.now() - start;
          const used = process.cpuUsage(cpu);
          if ((out.get("data") as Uint8Array).length !== mib << 20) throw new Error("short result");
          // The first two pairs warm up (and give the client a large answer to prepare for).
          if (i >= 2) rows[way].push([elapsed, (used.user + used.system) / 1000]);
        }
      }
    } finally {
      await stopRoutedSides([side]);
    }
    const direct = median(rows.direct.map((r) => r[0]));
    const routed = median(rows.routed.map((r) => r[0]));
    console.log(
      `turn ${turn} ${tree}: direct ${direct.toFixed(0)} ms, routed ${routed.toFixed(0)} ms, ` +
        `added ${((routed - direct) / mib).toFixed(2)} ms/MiB; client CPU direct ` +
        `${median(rows.direct.map((r) => r[1])).toFixed(0)} ms, routed ` +
        `${median(rows.routed.map((r) => r[1])).toFixed(0)} ms (medians of ${pairs} pairs)`,
    );
  }
}

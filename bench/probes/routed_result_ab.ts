/**
 * What the Router adds to a large result, in two checkouts side by side in one run: each tree
 * gets its own `kcoral router` and node (2 reused workers, sandbox none); rounds alternate the
 * trees, and each round runs the same program (a `bytes` result of `--mib` MiB, 64 by default)
 * direct (the node's own port) and through the Router, `--per-round` times each, alternating.
 * Per tree and round: (routed median − direct median) / MiB; then the median over rounds.
 *
 *   deno run -A bench/probes/routed_result_ab.ts TREE_A TREE_B [--rounds N] [--mib N] [gpu]
 *
 * @module
 */
import { Client, Program } from "../../mod.ts";
import { summarize } from "../_stats.ts";
import { startNodeProcess, startRouterProcess, waitForCapacity } from "../_routed.ts";

const option = (name: string, fallback: number) => {
  const at = Deno.args.indexOf(name);
  return at >= 0 ? Number(Deno.args[at + 1]) : fallback;
};
const trees = Deno.args.filter((arg, i) =>
  !arg.startsWith("--") && !Deno.args[i - 1]?.startsWith("--") && arg !== "gpu"
).slice(0, 2);
if (trees.length !== 2) throw new Error("usage: routed_result_ab.ts TREE_A TREE_B [--rounds N]");
const rounds = option("--rounds", 6);
const mib = option("--mib", 64);
const perRound = option("--per-round", 3);
const mode = Deno.args.includes("gpu") ? "gpu" : "cpu";

const program = new Program();
const mod = program.upload({
  kind: "module",
  source: `def make():\n    return bytes(${mib} * 1024 * 1024)\n`,
});
program.return_({
  key: "data",
  value: program.run({ fn: program.getFunction({ module: mod, name: "make" }), args: [] }),
});

const sides = [];
for (const tree of trees) {
  const router = await startRouterProcess([], tree);
  const node = await startNodeProcess(mode, router.url, 2, tree);
  await waitForCapacity(router.url, 2);
  sides.push({ tree, router, node, direct: new Client(node.url), routed: new Client(router.url) });
}
const timed = async (client: Client) => {
  const start = performance.now();
  const out = await client.execute(program);
  if ((out.get("data") as Uint8Array).length !== mib << 20) throw new Error("short result");
  return performance.now() - start;
};
const added: number[][] = sides.map(() => []);
try {
  for (const side of sides) {
    for (let i = 0; i < 2; i++) (await timed(side.direct), await timed(side.routed));
  }
  for (let round = 0; round < rounds; round++) {
    for (const [k, side] of sides.entries()) {
      const direct: number[] = [];
      const routed: number[] = [];
      for (let i = 0; i < perRound; i++) {
        direct.push(await timed(side.direct));
        routed.push(await timed(side.routed));
      }
      const d = summarize(direct).median;
      const r = summarize(routed).median;
      added[k].push((r - d) / mib);
      console.log(
        `round ${round + 1} ${k ? "B" : "A"}: direct ${d.toFixed(0)} ms, routed ${
          r.toFixed(0)
        } ms, added ${((r - d) / mib).toFixed(2)} ms/MiB`,
      );
    }
  }
  for (const [k, side] of sides.entries()) {
    const s = summarize(added[k]);
    console.log(
      `${k ? "B" : "A"} ${side.tree}: added median ${s.median.toFixed(2)} ms/MiB (min ${
        s.min.toFixed(2)
      }, max ${s.max.toFixed(2)})`,
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

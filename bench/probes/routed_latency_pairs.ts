/**
 * The Router's added latency in two checkouts, interleaved request by request: each tree gets
 * its own `kcoral router` and node (2 reused CPU workers, sandbox none, `bench/_routed.ts`), and
 * every step times one direct request (the node's own port) and one routed request on tree A,
 * then the same on tree B. Drift on a shared machine (other work, warm-up) then falls on both
 * trees alike, where `routed_latency_ab.ts` alternates them by rounds of 200. Prints, per tree,
 * routed p50 − direct p50 over all steps and over each fifth of them, and the CPU per routed
 * request of the Router process and of the node's server process (from /proc, over the same
 * steps, direct requests' share of the server subtracted as measured on the direct ones).
 *
 *   deno run -A bench/probes/routed_latency_pairs.ts TREE_A TREE_B [--steps N] [--warmups N]
 *
 * @module
 */
import type { Client } from "../../mod.ts";
import { trivialProgram } from "../_programs.ts";
import { childPid, ownCpuMs } from "../_proc.ts";
import { startRoutedSide, stopRoutedSides } from "../_routed_ab.ts";
import { median, numberArg, positionalArgs } from "./_probe.ts";

const trees = positionalArgs();
if (trees.length !== 2) throw new Error("usage: routed_latency_pairs.ts TREE_A TREE_B [--steps N]");
const steps = numberArg("--steps", 2000);
const warmups = numberArg("--warmups", 300);
const program = trivialProgram();

const sides = [];
for (const tree of trees) {
  const side = await startRoutedSide(tree, "cpu");
  sides.push({
    ...side,
    server: childPid(side.node.pid) ?? -1,
    times: { direct: [] as number[], routed: [] as number[] },
    cpu: { router: 0, serverDirect: 0, serverRouted: 0 },
  });
}
const time = async (client: Client) => {
  const start = performance.now();
  await client.execute(program);
  return performance.now() - start;
};
try {
  for (let i = 0; i < warmups; i++) {
    for (const side of sides) (await time(side.direct), await time(side.routed));
  }
  for (let i = 0; i < steps; i++) {
    for (const side of sides) {
      let server = ownCpuMs(side.server);
      side.times.direct.push(await time(side.direct));
      const router = ownCpuMs(side.router.pid);
      const between = ownCpuMs(side.server);
      side.cpu.serverDirect += between - server;
      server = between;
      side.times.routed.push(await time(side.routed));
      side.cpu.router += ownCpuMs(side.router.pid) - router;
      side.cpu.serverRouted += ownCpuMs(side.server) - server;
    }
  }
  for (const [k, side] of sides.entries()) {
    const added = (from: number, to: number) =>
      median(side.times.routed.slice(from, to)) - median(side.times.direct.slice(from, to));
    const fifths = [0, 1, 2, 3, 4].map((f) => added(f * steps / 5, (f + 1) * steps / 5));
    console.log(
      `${"AB"[k]} ${side.tree}: added ${added(0, steps).toFixed(3)} ms (fifths ${
        fifths.map((v) => v.toFixed(3)).join(", ")
      }); direct p50 ${median(side.times.direct).toFixed(3)} ms; CPU per request: Router ${
        (side.cpu.router / steps).toFixed(3)
      } ms, node server ${(side.cpu.serverRouted / steps).toFixed(3)} ms routed, ${
        (side.cpu.serverDirect / steps).toFixed(3)
      } ms direct`,
    );
  }
} finally {
  await stopRoutedSides(sides);
}

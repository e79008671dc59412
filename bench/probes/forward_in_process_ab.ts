/**
 * `forwardExecute` of two checkouts side by side in one process, as `forward_in_process.ts` runs
 * it (`_forwarding.ts`, with a client watch as the Router has one), the trees taking turns in blocks
 * of `--requests` for `--rounds` rounds. Prints per tree the fastest and the median block, in
 * microseconds per request; both include building the request and reading the answer, and the
 * stand-in node's own decoding and encoding.
 *
 *   deno run -A bench/probes/forward_in_process_ab.ts TREE_A TREE_B [--rounds N] [--requests N]
 *
 * @module
 */
import { type Forwarding, forwarding } from "./_forwarding.ts";
import { median, numberArg, positionalArgs } from "./_probe.ts";

/** One tree's forwarding and its blocks' times. */
interface _Way {
  tree: string;
  loop: Forwarding;
  blocks: number[];
}

const trees = positionalArgs();
if (trees.length < 2) throw new Error("usage: forward_in_process_ab.ts TREE_A TREE_B");
const rounds = numberArg("--rounds", 16);
const requests = numberArg("--requests", 3000);
const ways: _Way[] = [];
for (const tree of trees) {
  ways.push({ tree, loop: await forwarding(tree, { clientWatch: true }), blocks: [] });
}
for (const way of ways) for (let i = 0; i < 5000; i++) await way.loop.run();
for (let round = 0; round < rounds; round++) {
  for (const way of round % 2 === 0 ? ways : [...ways].reverse()) {
    const start = performance.now();
    for (let i = 0; i < requests; i++) await way.loop.run();
    way.blocks.push((performance.now() - start) / requests * 1000);
    way.loop.events.flush();
  }
}
for (const way of ways) {
  console.log(
    `${way.tree}: fastest block ${Math.min(...way.blocks).toFixed(2)} µs, median ${
      median(way.blocks).toFixed(2)
    } µs per request`,
  );
}
Deno.exit(0);

/**
 * The Router's added cost in two checkouts, side by side in one run (the A/B probes
 * `bench/probes/routed_latency_ab.ts` and `routed_result_ab.ts`): each tree gets its own
 * `kcoral router` and node (2 reused workers, sandbox none); rounds alternate the trees, and
 * each round alternates direct requests (the node's own port) with routed ones. Per tree and
 * round: the added cost from the two medians; then the median over rounds, each tree's direct
 * and routed round medians, and in how many rounds tree B read lower than A. Two runs of
 * different code on different VMs are never compared (docs/decisions/benchmark-method.md).
 *
 * @module
 */
import { Client } from "../mod.ts";
import { summarize } from "./_stats.ts";
import {
  type NodeMode,
  type RoutedProcess,
  startNodeProcess,
  startRouterProcess,
  waitForCapacity,
} from "./_routed.ts";

/** What one A/B probe measures. */
export interface RoutedAB {
  /** The two checkouts. */
  trees: readonly string[];
  /** The node's device. */
  mode: NodeMode;
  /** Rounds per tree. */
  rounds: number;
  /** Direct and routed requests per round (alternating). */
  perRound: number;
  /** Direct and routed pairs per tree before the rounds. */
  warmups: number;
  /**
   * Idle ms after each timed request (default 0), so that work a process defers past an answer
   * (a Router's timer) has run before the next request is timed, instead of landing on it.
   */
  gapMs?: number;
  /** One timed request through `client` (ms). */
  time: (client: Client) => Promise<number>;
  /** The added cost from the round's direct and routed medians (ms). */
  added: (direct: number, routed: number) => number;
  /** The unit of `added` (for the printout) and its decimals; request times get `msDigits`. */
  unit: string;
  digits: number;
  msDigits: number;
}

/** One checkout's Router and node (2 workers) with a client for each. */
export interface RoutedSide {
  tree: string;
  router: RoutedProcess;
  node: RoutedProcess;
  /** A client of the node's own port. */
  direct: Client;
  /** A client of the Router. */
  routed: Client;
}

/** Starts `tree`'s Router and a node behind it, and waits until the node's 2 workers join. */
export async function startRoutedSide(tree: string, mode: NodeMode): Promise<RoutedSide> {
  const router = await startRouterProcess([], tree);
  const node = await startNodeProcess(mode, router.url, 2, tree);
  await waitForCapacity(router.url, 2);
  return { tree, router, node, direct: new Client(node.url), routed: new Client(router.url) };
}

/** Closes the clients and stops the nodes and Routers of `sides`. */
export async function stopRoutedSides(sides: RoutedSide[]): Promise<void> {
  for (const side of sides) {
    side.direct.close();
    side.routed.close();
    await side.node.stop();
    await side.router.stop();
  }
}

/**
 * Runs `ab` and prints each round and the summary; resolves with the per-tree round values.
 */
export async function runRoutedAB(ab: RoutedAB): Promise<number[][]> {
  const sides = [];
  for (const tree of ab.trees) sides.push(await startRoutedSide(tree, ab.mode));
  const name = (k: number) => "AB"[k];
  const added: number[][] = sides.map(() => []);
  const directs: number[][] = sides.map(() => []);
  const routeds: number[][] = sides.map(() => []);
  try {
    for (const side of sides) {
      for (let i = 0; i < ab.warmups; i++) (await ab.time(side.direct), await ab.time(side.routed));
    }
    for (let round = 0; round < ab.rounds; round++) {
      for (const [k, side] of sides.entries()) {
        const direct: number[] = [];
        const routed: number[] = [];
        const gap = () => ab.gapMs ? new Promise((resolve) => setTimeout(resolve, ab.gapMs)) : null;
        for (let i = 0; i < ab.perRound; i++) {
          direct.push(await ab.time(side.direct));
          await gap();
          routed.push(await ab.time(side.routed));
          await gap();
        }
        const d = summarize(direct).median;
        const r = summarize(routed).median;
        added[k].push(ab.added(d, r));
        directs[k].push(d);
        routeds[k].push(r);
        console.log(
          `round ${round + 1} ${name(k)}: direct ${d.toFixed(ab.msDigits)} ms, routed ${
            r.toFixed(ab.msDigits)
          } ms, added ${ab.added(d, r).toFixed(ab.digits)} ${ab.unit}`,
        );
      }
    }
    for (const [k, side] of sides.entries()) {
      const s = summarize(added[k]);
      console.log(
        `${name(k)} ${side.tree}: added median ${s.median.toFixed(ab.digits)} ${ab.unit} (min ${
          s.min.toFixed(ab.digits)
        }, max ${s.max.toFixed(ab.digits)}); round medians: direct ${
          summarize(directs[k]).median.toFixed(ab.msDigits)
        } ms, routed ${summarize(routeds[k]).median.toFixed(ab.msDigits)} ms`,
      );
    }
    // The two trees' direct requests run the same node code: a difference there is the other
    // work of the tree's processes (a Router's deferred work landing on the direct requests that
    // follow its routed ones), which moves `added` without changing what a routed request takes.
    const lower = (values: number[][]) => values[1].filter((v, i) => v < values[0][i]).length;
    console.log(
      `rounds where B is lower: routed ${lower(routeds)} of ${ab.rounds}, direct ${
        lower(directs)
      } of ${ab.rounds}`,
    );
  } finally {
    await stopRoutedSides(sides);
  }
  return added;
}

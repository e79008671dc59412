/**
 * How a fresh Router and node warm up: a `kcoral router` and one node (`bench/_routed.ts`, reused
 * workers, sandbox none), started for this run, then rounds of 200 pairs — one direct request
 * (the node's own port) and one routed, a trivial program each — with no warm-up before the
 * first. Prints per round the direct and routed p50 and their difference, so the added latency
 * right after start can be told from the steady state (`router_bench.ts` measures after 50 pairs).
 *
 *   deno run -A bench/probes/routed_warmup.ts [gpu] [--rounds N]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { trivialProgram } from "../_programs.ts";
import { startNodeProcess, startRouterProcess, timedPairs, waitForCapacity } from "../_routed.ts";
import { median, numberArg } from "./_probe.ts";

const gpu = Deno.args.includes("gpu");
const workers = gpu ? 8 : 2;
const rounds = numberArg("--rounds", 20);
const router = await startRouterProcess();
const node = await startNodeProcess(gpu ? "gpu" : "cpu", router.url, workers);
try {
  await waitForCapacity(router.url, workers);
  await using direct = new Client(node.url);
  await using routed = new Client(router.url);
  const trivial = trivialProgram();
  for (let round = 1; round <= rounds; round++) {
    const times = await timedPairs(direct, routed, trivial, 200);
    const [d, t] = [median(times.direct), median(times.routed)];
    console.log(
      `round ${round} (pairs ${round * 200 - 199}–${round * 200}): direct p50 ${
        d.toFixed(3)
      } ms, routed ${t.toFixed(3)} ms, added ${(t - d).toFixed(3)} ms`,
    );
  }
} finally {
  await node.stop();
  await router.stop();
}

/**
 * Fresh workers (the default: one request per worker process) in one to three checkouts, side
 * by side in one run. Each round starts, per tree, a `kcoral server` with 8 fresh workers on GPU 0
 * (or simulated GPUs with `sim`) and measures:
 *
 * - idle: a trivial request sent once `/health` shows every seat ready and nothing running
 *   (the previous child torn down, its replacement's context created): e2e ms;
 * - paced: one client, a trivial request every 60 ms after the previous answer: e2e ms;
 * - 8 clients: closed loop for `--seconds`, req/s;
 * - from the server's events during the 8 clients: `worker_ready`'s `init_ms` (the context,
 *   created under the lease) and `worker_exited`'s `teardown_ms`.
 *
 * Rounds alternate the trees; the summary gives, per tree, the median of the round medians
 * (and the min and max of the round medians).
 *
 *   deno run -A bench/probes/fresh_workers_ab.ts TREE_A [TREE_B [TREE_C]] [--rounds N] [--seconds S]
 *       [--sandbox none|bubblewrap] [gpu|sim]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { closedLoop } from "../_load.ts";
import { trivialProgram } from "../_programs.ts";
import { summarize } from "../_stats.ts";
import { readEvents, waitIdle } from "../_server_state.ts";
import { startServerProcess } from "./_probe.ts";

const flag = (name: string, fallback: string) => {
  const at = Deno.args.indexOf(name);
  return at >= 0 ? Deno.args[at + 1] : fallback;
};
const valued = new Set(["--rounds", "--seconds", "--sandbox"]);
const trees = Deno.args.filter((arg, i) =>
  !arg.startsWith("--") && !valued.has(Deno.args[i - 1]) && arg !== "gpu" && arg !== "sim"
);
if (trees.length < 1 || trees.length > 3) {
  throw new Error("usage: fresh_workers_ab.ts TREE_A [TREE_B [TREE_C]] [--rounds N] [gpu|sim]");
}
const name = (k: number) => "ABC"[k];
const rounds = Number(flag("--rounds", "3"));
const seconds = Number(flag("--seconds", "8"));
const sandbox = flag("--sandbox", "bubblewrap");
const sim = Deno.args.includes("sim");
const SEATS = 8;

type Metric = "idle" | "paced" | "clients8" | "init" | "teardown";
const metrics: Metric[] = ["idle", "paced", "clients8", "init", "teardown"];
const perTree = trees.map(() => new Map<Metric, number[]>(metrics.map((m) => [m, []])));

async function measure(tree: string, k: number, round: number): Promise<void> {
  const logDir = await Deno.makeTempDir({ prefix: "kcoral-fresh-ab-" });
  const server = await startServerProcess([
    "--workers-per-gpu",
    String(SEATS),
    "--sandbox",
    sandbox,
    "--log-dir",
    logDir,
    "--no-log-programs",
    "--disk-cache-dir",
    "",
  ], { gpu: !sim, tree });
  const program = trivialProgram();
  const m = perTree[k];
  try {
    await using client = new Client(server.url);
    const idle: number[] = [];
    for (let i = 0; i < 14; i++) {
      await waitIdle(server.url, SEATS);
      const start = performance.now();
      const result = await client.execute(program);
      if (!result.completed) throw new Error(JSON.stringify(result.error));
      if (i >= 2) idle.push(performance.now() - start);
    }
    const paced: number[] = [];
    for (let i = 0; i < 50; i++) {
      const start = performance.now();
      const result = await client.execute(program);
      if (!result.completed) throw new Error(JSON.stringify(result.error));
      if (i >= 10) paced.push(performance.now() - start);
      await new Promise((r) => setTimeout(r, 60));
    }
    await waitIdle(server.url, SEATS);
    const loadStart = Date.now();
    const { rate } = await closedLoop(server.url, program, 8, seconds);
    const during = (await readEvents(logDir)).filter((e) =>
      Date.parse(e.timestamp as string) >= loadStart
    );
    const init = during.filter((e) => e.event === "worker_ready").map((e) => e.init_ms as number);
    const teardown = during.filter((e) => e.event === "worker_exited").map((e) =>
      e.teardown_ms as number
    );
    const values: Record<Metric, number> = {
      idle: summarize(idle).median,
      paced: summarize(paced).median,
      clients8: rate,
      init: summarize(init).median,
      teardown: summarize(teardown).median,
    };
    for (const metric of metrics) m.get(metric)!.push(values[metric]);
    console.log(
      `round ${round + 1} ${name(k)}: idle ${values.idle.toFixed(2)} ms, paced ${
        values.paced.toFixed(1)
      } ms, 8 clients ${rate.toFixed(2)} req/s, init ${values.init.toFixed(1)} ms, teardown ${
        values.teardown.toFixed(1)
      } ms`,
    );
  } finally {
    await server.stop();
    await Deno.remove(logDir, { recursive: true }).catch(() => {});
  }
}

for (let round = 0; round < rounds; round++) {
  for (const [k, tree] of trees.entries()) await measure(tree, k, round);
}
const labels: Record<Metric, string> = {
  idle: "trivial e2e, idle server (ms)",
  paced: "trivial e2e, one client, 60 ms apart (ms)",
  clients8: "8 clients (req/s)",
  init: "context creation under the lease, init_ms (ms)",
  teardown: "teardown, teardown_ms (ms)",
};
console.log(`\n${sim ? "simulated GPUs" : "GPU 0"}, ${SEATS} fresh workers, sandbox ${sandbox}`);
console.log(`| metric | ${trees.map((t, k) => `${name(k)} ${t}`).join(" | ")} |`);
console.log(`|---|${trees.map(() => "---").join("|")}|`);
for (const metric of metrics) {
  const cells = perTree.map((m) => {
    const s = summarize(m.get(metric)!);
    return `${s.median.toFixed(2)} (${s.min.toFixed(2)}–${s.max.toFixed(2)})`;
  });
  console.log(`| ${labels[metric]} | ${cells.join(" | ")} |`);
}

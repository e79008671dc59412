/**
 * Why reused workers measuring 16 at once read the 4 MiB add slower than local processes (GPU
 * only; the fidelity run of 2026-12-02: +2.9 % at the median, +2.4 % at the p99). Found with
 * it: the 16 workers read one physical placement (each takes the pages the one before freed),
 * the local processes one each; since `bench/fidelity_kernels.py` draws a placement per
 * measurement the sides agree (docs/decisions.md). One kernel, rounds alternating between:
 *
 * - `reused, at once`: 16 reused workers, 16 clients at once (the fidelity bench's row; the
 *   lease runs them back to back);
 * - `reused, one by one`: the same 16 workers, one request after another;
 * - `local`: 16 long-lived local processes, one after another, the allocator cache emptied
 *   before each measurement (the bench's baseline).
 *
 * Each measurement also gives its wall time per launch: above the GPU's time per iteration (the
 * L2 flush's ~41 µs plus the kernel), the host set the pace and the events timed host gaps.
 *
 *   deno run -A bench/probes/reused_fidelity.ts [--kernel add4] [--rounds 4]
 *
 * @module
 */
import { Client } from "../../mod.ts";
import { serve } from "../../http/serve.ts";
import { gpuServer, LocalHarness, type Measurement, remoteMeasure } from "../fidelity_bench.ts";
import { summarize } from "../_stats.ts";

const option = (name: string, fallback: string) => {
  const at = Deno.args.indexOf(name);
  return at >= 0 ? Deno.args[at + 1] : fallback;
};
const kernel = option("--kernel", "add4");
const rounds = Number(option("--rounds", "4"));
const processes = 16;

const server = await serve(gpuServer(0, processes), {
  port: 0,
  handleSignals: false,
  log: () => {},
});
const clients = Array.from({ length: processes }, () => new Client(server.url));
const locals = Array.from({ length: processes }, () => new LocalHarness("lives"));
const sides: Record<string, Measurement[]> = {
  "reused, at once": [],
  "reused, one by one": [],
  "local": [],
};
try {
  await Promise.all(clients.map((c) => remoteMeasure(c, kernel, 1))); // warm-up
  await Promise.all(locals.map((l) => l.measure(kernel, 1)));
  for (let round = 0; round < rounds; round++) {
    sides["reused, at once"].push(
      ...(await Promise.all(clients.map((c) => remoteMeasure(c, kernel, 1)))).flat(),
    );
    for (const c of clients) sides["reused, one by one"].push(...await remoteMeasure(c, kernel, 1));
    for (const l of locals) sides["local"].push(...await l.measure(kernel, 1));
  }
  const base = summarize(sides["local"].map(([median]) => median)).median;
  console.log(`${kernel}, ${rounds} rounds of ${processes} measurements a side (µs)`);
  console.log(
    "| side | median of medians | vs local | median of p99s | wall per launch: median, max |",
  );
  console.log("|---|---|---|---|---|");
  for (const [side, ms] of Object.entries(sides)) {
    const median = summarize(ms.map(([m]) => m)).median;
    const p99 = summarize(ms.map(([, p]) => p)).median;
    const wall = summarize(ms.map(([, , w]) => w));
    console.log(
      `| ${side} | ${median.toFixed(3)} | ${(100 * (median - base) / base).toFixed(2)} % | ${
        p99.toFixed(3)
      } | ${wall.median.toFixed(1)}, ${wall.max.toFixed(1)} |`,
    );
  }
  // Per process: the median of its measurements, sorted; a systematic shift moves every process,
  // placement moves some.
  for (const [side, ms] of Object.entries(sides)) {
    const perProcess = Array.from(
      { length: processes },
      (_, p) => summarize(ms.filter((_, i) => i % processes === p).map(([m]) => m)).median,
    ).sort((a, b) => a - b);
    console.log(`${side}, per process: ${perProcess.map((m) => m.toFixed(2)).join(" ")}`);
  }
} finally {
  for (const c of clients) c.close();
  await Promise.all(locals.map((l) => l.close()));
  await server.shutdown();
}

/**
 * Time to a verdict (issue 40): `Client.evaluate` of one reference and candidate, `--runs` times,
 * each phase's median/min/max (worker start, input generation, candidate load, candidate
 * correctness and timing, reference, reference timing, comparison, transfer, total, total without
 * the candidate's load), and beside the total the anchor: the same work in ONE program in ONE
 * worker (inputs, both models, comparison and both timings in the candidate's process, as
 * in-process harnesses do), with the ratio split trust costs.
 *
 * ```sh
 * deno run -A bench/eval_bench.ts                                  # a local CPU server, test problem
 * deno run -A bench/eval_bench.ts --mode gpu --reference evals/problems/gemm_fp32/reference.py \
 *   --candidate evals/problems/gemm_fp32/honest/torch_same.py --runs 7
 * deno run -A bench/eval_bench.ts --url http://gpu-box:8000 ...     # a server already running
 * ```
 *
 * Flags: --mode cpu|sim|gpu (the server started here, 4 GiB body limits; gpu: GPU 0 without a
 * sandbox), --url URL
 * (use that server instead), --reference PATH, --candidate PATH, --runs N (default 5),
 * --warmup N, --repeat N (timing settings of both models), --json PATH (every sample).
 *
 * @module
 */
import { Client, Program } from "../mod.ts";
import { createApp } from "../server/app.ts";
import { serve } from "../http/serve.ts";
import { summarize } from "./_stats.ts";

const arg = (name: string, fallback: string) => {
  const i = Deno.args.indexOf(name);
  return i >= 0 ? Deno.args[i + 1] : fallback;
};
const ROOT = decodeURIComponent(new URL("../", import.meta.url).pathname);
const mode = arg("--mode", "cpu");
const runs = Number(arg("--runs", "5"));
const referencePath = arg("--reference", `${ROOT}tests/fixtures/eval/linear_reference.py`);
const candidatePath = arg("--candidate", `${ROOT}tests/fixtures/eval/linear_honest.py`);
const timing: { warmup?: number; repeat?: number } = {};
if (Deno.args.includes("--warmup")) timing.warmup = Number(arg("--warmup", "0"));
if (Deno.args.includes("--repeat")) timing.repeat = Number(arg("--repeat", "1"));

/** The anchor: the whole evaluation in one worker, through the runtime's own pieces. */
const ANCHOR = `
import json, os, time
import torch
from kcoral_runtime import eval_worker as w
from kcoral_runtime.eval_compare import compare_values
from kcoral_runtime.eval_bundle import BundleWriter
from kcoral_runtime.eval_timing import Rotation, time_model

def anchor(reference, candidate, settings_json):
    settings = json.loads(settings_json)
    started = time.perf_counter()
    device = w._device()
    ref = w.load_source(reference, "reference")
    cand = w.load_source(candidate, "candidate")
    init = list(ref.get_init_inputs())
    sets = []
    for seed in range(5):
        torch.manual_seed(1000 + seed)
        sets.append(w._to_device(list(ref.get_inputs()), device))
    with torch.no_grad():
        model = w._build_model(ref.Model, init, 42, device)
        new = w._build_model(getattr(cand, "ModelNew", None) or cand.Model, init, 42, device)
        writer = BundleWriter()
        ok = True
        for s in sets[:3]:
            got = new(*s)
            ok = ok and compare_values(model(*s), writer.describe_value(got), got)["match"]
        t_new = time_model("candidate", Rotation(new, sets[3:]), settings, device)
        t_ref = time_model("reference", Rotation(model, sets[3:]), settings, device)
    return json.dumps({"correct": ok, "ms": (time.perf_counter() - started) * 1e3,
                       "speedup": t_ref["latency_ms_median"] / t_new["latency_ms_median"]})
`;

async function startLocal(): Promise<{ url: string; stop: () => Promise<void> }> {
  const config = mode === "gpu"
    ? { device: "gpu" as const, gpus: [0], workersPerGpu: 3, sandbox: "none" as const }
    : mode === "sim"
    ? {
      device: "gpu" as const,
      simulateGpus: true,
      gpus: [0],
      workersPerGpu: 3,
      sandbox: "none" as const,
    }
    : { device: "cpu" as const, numWorkers: 3, sandbox: "none" as const };
  const app = createApp({
    ...config,
    logDir: null,
    logConsole: false,
    diskCacheDir: null,
    // Large problems' bundles travel in the requests (docs/eval.md, limits).
    maxRequestBytes: 4 * 2 ** 30,
    maxResponseBytes: 4 * 2 ** 30,
  });
  const server = await serve(app, { port: 0, handleSignals: false, log: () => {} });
  return { url: server.url, stop: () => server.shutdown() };
}

const given = arg("--url", "");
const local = given ? null : await startLocal();
const url = given || local!.url;
const reference = await Deno.readTextFile(referencePath);
const candidate = await Deno.readTextFile(candidatePath);
const PHASES = [
  "worker_start",
  "input_generation",
  "candidate_load",
  "candidate_correctness",
  "candidate_timing",
  "reference",
  "reference_timing",
  "comparison",
  "transfer",
  "total",
  "total_excluding_compile",
] as const;
const samples: Record<string, number[]> = Object.fromEntries(PHASES.map((p) => [p, []]));
const anchorMs: number[] = [];
const speedups: number[] = [];
const anchorSpeedups: number[] = [];
try {
  await using client = new Client(url);
  const anchorProgram = new Program();
  const module = anchorProgram.upload({ kind: "module", source: ANCHOR });
  const fn = anchorProgram.getFunction({ module, name: "anchor" });
  anchorProgram.return_({
    key: "out",
    value: anchorProgram.run({ fn, args: [reference, candidate, JSON.stringify(timing)] }),
  });
  for (let i = 0; i <= runs; i++) {
    const verdict = await client.evaluate({ reference, candidate, timing });
    if (!verdict.correct) throw new Error(`not correct: ${JSON.stringify(verdict.checks)}`);
    const t0 = performance.now();
    const result = await client.execute(anchorProgram);
    const anchorWall = performance.now() - t0;
    if (!result.completed) throw new Error(`anchor failed: ${result.error?.message}`);
    const anchor = JSON.parse(result.get("out") as string);
    if (i === 0) continue; // warm-up round: first imports, compile caches
    for (const p of PHASES) samples[p].push(verdict.phases_ms[p]);
    anchorMs.push(anchorWall);
    speedups.push(verdict.speedup ?? NaN);
    anchorSpeedups.push(anchor.speedup);
  }
} finally {
  await local?.stop();
}

const fmt = (n: number) => Number.isNaN(n) ? "n/a" : n >= 100 ? n.toFixed(0) : n.toFixed(2);
console.log(
  `eval_bench: ${mode === "gpu" || given ? url : `local ${mode} server`}, ` +
    `${referencePath.replace(ROOT, "")} vs ${candidatePath.replace(ROOT, "")}, ${runs} runs ` +
    `(after one untimed), ${new Date().toISOString().slice(0, 10)}`,
);
console.log("| phase (ms) | median | min | max | anchor: one worker, no split | ratio |");
console.log("|---|---|---|---|---|---|");
const anchor = summarize(anchorMs);
for (const p of PHASES) {
  const s = summarize(samples[p]);
  const beside = p === "total" ? fmt(anchor.median) : "";
  const ratio = p === "total" ? (s.median / anchor.median).toFixed(2) : "";
  console.log(`| ${p} | ${fmt(s.median)} | ${fmt(s.min)} | ${fmt(s.max)} | ${beside} | ${ratio} |`);
}
const sp = summarize(speedups);
const asp = summarize(anchorSpeedups);
console.log(
  `| speedup (x) | ${sp.median.toFixed(3)} | ${sp.min.toFixed(3)} | ${sp.max.toFixed(3)} | ` +
    `${asp.median.toFixed(3)} | ${(sp.median / asp.median).toFixed(3)} |`,
);
const jsonPath = arg("--json", "");
if (jsonPath) {
  await Deno.writeTextFile(
    jsonPath,
    JSON.stringify({ samples, anchorMs, speedups, anchorSpeedups }, null, 2),
  );
}

/**
 * Time to a verdict (issue 40): `Client.evaluate` of one reference and candidate, `--runs` times,
 * each phase's median/min/max (worker start, input generation, candidate load, candidate
 * correctness and timing, reference, reference timing, comparison, bundle decoding, transfer, the
 * client's own work, their sum, total, total without the candidate's load), and beside the total
 * the anchor: the same work in ONE program in ONE worker (inputs, both models, comparison and
 * both timings in the candidate's process, as in-process harnesses do), with the ratio split
 * trust costs. A second table gives each step's request as the client saw it (its wall time, the
 * server's queue and run times, and the rest: the server's work before and after the run and the
 * transfer), a third the workers' own step timings (`worker_phases_ms`).
 *
 * ```sh
 * deno run -A bench/eval_bench.ts                                  # a local CPU server, test problem
 * deno run -A bench/eval_bench.ts --preload torch                  # the same, torch in every worker
 * deno run -A bench/eval_bench.ts --mode gpu --reference evals/problems/gemm_fp32/reference.py \
 *   --candidate evals/problems/gemm_fp32/honest/torch_same.py --runs 7
 * deno run -A bench/eval_bench.ts --url http://gpu-box:8000 ...     # a server already running
 * deno run -A bench/eval_bench.ts --mode sim --add 4096 --runs 3     # the 4096² GEMM's bundles, cheap work
 * ```
 *
 * Flags: see {@linkcode USAGE} (`--help`).
 *
 * @module
 */
import { Client, DEFAULT_TIMING_SETS, MIN_CORRECTNESS_SETS, Program } from "../mod.ts";
import { type EvaluateClient, evaluateKernel } from "../client/evaluate.ts";
import { createApp } from "../server/app.ts";
import { serve } from "../http/serve.ts";
import { summarize } from "./_stats.ts";

/** The command line's flags, printed by `--help`. */
const USAGE = `deno run -A bench/eval_bench.ts [flags]

  --mode cpu|sim|gpu   the server started here (default cpu; 4 GiB body limits; gpu: GPU 0,
                       no sandbox)
  --url URL            use that server instead of starting one
  --reference PATH     the reference file (default tests/fixtures/eval/linear_reference.py)
  --candidate PATH     the candidate file (default tests/fixtures/eval/linear_honest.py)
  --add N              instead of --reference/--candidate: c = a + b on two N x N fp32
                       matrices, the reference as its own candidate (at N = 4096 the bundles
                       of the 4096² fp32 GEMM: 768 MiB of inputs, 384 MiB of outputs, with
                       elementwise work, so a CPU measures the data's cost)
  --runs N             timed evaluations after one untimed (default 5)
  --warmup N           untimed calls before each model's timing (default: the runtime's)
  --repeat N           timed calls of each model (default: the runtime's)
  --preload MODULES    the local server's --preload-modules (e.g. torch on a CPU server)
  --json PATH          write every sample there
  --help               this text`;

if (Deno.args.includes("--help")) {
  console.log(USAGE);
  Deno.exit(0);
}

const arg = (name: string, fallback: string) => {
  const i = Deno.args.indexOf(name);
  return i >= 0 ? Deno.args[i + 1] : fallback;
};
const ROOT = decodeURIComponent(new URL("../", import.meta.url).pathname);
const mode = arg("--mode", "cpu");
const runs = Number(arg("--runs", "5"));
const addSize = Deno.args.includes("--add") ? Number(arg("--add", "")) : null;
if (addSize !== null && !(Number.isInteger(addSize) && addSize > 0)) {
  console.error("--add takes a positive integer");
  Deno.exit(2);
}
const referencePath = addSize === null
  ? arg("--reference", `${ROOT}tests/fixtures/eval/linear_reference.py`)
  : `--add ${addSize}`;
const candidatePath = addSize === null
  ? arg("--candidate", `${ROOT}tests/fixtures/eval/linear_honest.py`)
  : "the reference";
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

CORRECTNESS = ${MIN_CORRECTNESS_SETS}
SETS = CORRECTNESS + ${DEFAULT_TIMING_SETS}

def anchor(reference, candidate, settings_json):
    settings = json.loads(settings_json)
    started = time.perf_counter()
    device = w._device()
    ref = w.load_source(reference, "reference")
    cand = w.load_source(candidate, "candidate")
    init = list(ref.get_init_inputs())
    sets = []
    for seed in range(SETS):
        torch.manual_seed(1000 + seed)
        sets.append(w._to_device(list(ref.get_inputs()), device))
    with torch.no_grad():
        model = w._build_model(ref.Model, init, 42, device)
        new = w._build_model(getattr(cand, "ModelNew", None) or cand.Model, init, 42, device)
        writer = BundleWriter()
        ok = True
        for s in sets[:CORRECTNESS]:
            got = new(*s)
            ok = ok and compare_values(model(*s), writer.describe_value(got), got)["match"]
        t_new = time_model("candidate", Rotation(new, sets[CORRECTNESS:]), settings, device)
        t_ref = time_model("reference", Rotation(model, sets[CORRECTNESS:]), settings, device)
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
  const preload = arg("--preload", "");
  const app = createApp({
    ...config,
    preloadModules: preload === "" ? [] : preload.split(","),
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
/** `--add N`'s problem: the GEMM's inputs and outputs, an elementwise sum for the work. */
const addReference = (n: number) =>
  `import torch
import torch.nn as nn

N = ${n}


class Model(nn.Module):
    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
`;
const reference = addSize === null ? await Deno.readTextFile(referencePath) : addReference(addSize);
const candidate = addSize === null ? await Deno.readTextFile(candidatePath) : reference;
const PHASES = [
  "worker_start",
  "input_generation",
  "candidate_load",
  "candidate_correctness",
  "candidate_timing",
  "candidate_unfinished",
  "reference",
  "reference_timing",
  "reference_bracket",
  "comparison",
  "bundle_decode",
  "transfer",
  "client",
] as const;
const TOTALS = ["total", "total_excluding_compile"] as const;
const samples: Record<string, number[]> = Object.fromEntries(
  [...PHASES, "sum of phases", ...TOTALS].map((p) => [p, []]),
);
const workerSamples: Record<string, number[]> = {};
/** Per step (`inputs`, `candidate`, `judge`) and measure: the requests as the client saw them. */
const stepSamples: Record<string, number[]> = {};
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
  let step = "";
  let steps: [string, number][] = [];
  // The evaluation's requests, each timed around the client's execute.
  const recording: EvaluateClient = {
    async execute(program, options) {
      const t0 = performance.now();
      const result = await client.execute(program, options);
      const wall = performance.now() - t0;
      const server = result.queueMs + result.elapsedMs;
      steps.push([`${step} wall`, wall], [`${step} queue`, result.queueMs]);
      steps.push([`${step} run`, result.elapsedMs], [`${step} wall - queue - run`, wall - server]);
      return result;
    },
  };
  for (let i = 0; i <= runs; i++) {
    steps = [];
    const verdict = await evaluateKernel(recording, {
      reference,
      candidate,
      timing,
      onStep: (name) => step = name,
    });
    if (!verdict.correct) throw new Error(`not correct: ${JSON.stringify(verdict.checks)}`);
    const t0 = performance.now();
    const result = await client.execute(anchorProgram);
    const anchorWall = performance.now() - t0;
    if (!result.completed) throw new Error(`anchor failed: ${result.error?.message}`);
    const anchor = JSON.parse(result.get("out") as string);
    if (i === 0) continue; // warm-up round: first imports, compile caches
    for (const p of [...PHASES, ...TOTALS]) samples[p].push(verdict.phases_ms[p]);
    samples["sum of phases"].push(PHASES.reduce((t, p) => t + verdict.phases_ms[p], 0));
    for (const [step, ms] of Object.entries(verdict.worker_phases_ms)) {
      if (ms !== null) (workerSamples[step] ??= []).push(ms);
    }
    for (const [name, ms] of steps) (stepSamples[name] ??= []).push(ms);
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
for (const p of [...PHASES, "sum of phases", ...TOTALS]) {
  const s = summarize(samples[p]);
  const beside = p === "total" ? fmt(anchor.median) : "";
  const ratio = p === "total" ? (s.median / anchor.median).toFixed(2) : "";
  console.log(`| ${p} | ${fmt(s.median)} | ${fmt(s.min)} | ${fmt(s.max)} | ${beside} | ${ratio} |`);
}
console.log("\n| step request (ms, as the client saw it) | median | min | max |");
console.log("|---|---|---|---|");
for (const [name, values] of Object.entries(stepSamples)) {
  const s = summarize(values);
  console.log(`| ${name} | ${fmt(s.median)} | ${fmt(s.min)} | ${fmt(s.max)} |`);
}
console.log("\n| worker step (ms, worker_phases_ms) | median | min | max |");
console.log("|---|---|---|---|");
for (const [step, values] of Object.entries(workerSamples)) {
  const s = summarize(values);
  console.log(`| ${step} | ${fmt(s.median)} | ${fmt(s.min)} | ${fmt(s.max)} |`);
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
    JSON.stringify(
      { samples, stepSamples, workerSamples, anchorMs, speedups, anchorSpeedups },
      null,
      2,
    ),
  );
}

/**
 * Where `kcoral eval`'s step 1 (the inputs) spends its time in a worker: the real
 * `generate_inputs` of `evals/problems/gemm_fp32/reference.py` (896 MiB on a GPU: three correctness,
 * three timing and the bracket set) called inside a program whose module times the step's pieces
 * (`describe_seeds`: the sets; `hash_tensors`; `finish`: laying the bundle out in memory, gone
 * since bundles are returned as their pieces; `load_source`) and returns those times beside the
 * bundle. Seven variants, each in a fresh worker, in turn over 3 counted rounds after one that is
 * not: a trivial call with and without `cpu_only` (the guard's own cost), the step with a small
 * return (no bundle), the step returning its bundle as a kept value (`cpu_only` and not), and
 * step 2's intake: a program that names the kept bundle's segments as uploads (the worker reads
 * them before the call), then the same with them copied to the device. Per request: wall time, the
 * server's queue and run times, the step's own times (ms).
 *
 *   deno run -A bench/probes/eval_inputs_step.ts [gpu]
 *
 * Without `gpu` a simulated-GPU server runs the problem's small sizes.
 *
 * @module
 */
import { Client, type KeptReturn, Program } from "../../mod.ts";
import { createApp } from "../../server/app.ts";
import { serve } from "../../http/serve.ts";

const gpu = Deno.args.includes("gpu");
const app = createApp({
  device: "gpu",
  gpus: [0],
  simulateGpus: !gpu,
  workersPerGpu: 3,
  sandbox: "none",
  logDir: null,
  logConsole: false,
  diskCacheDir: null,
  maxRequestBytes: 4 * 2 ** 30,
  maxResponseBytes: 4 * 2 ** 30,
});
const server = await serve(app, { port: 0, handleSignals: false, log: () => {} });
const reference = await Deno.readTextFile(
  new URL("../../evals/problems/gemm_fp32/reference.py", import.meta.url),
);

/** The program's module: the step with its pieces timed (wrapped where the step looks them up). */
const STEP = `
import json, time

def timed(reference, secret, mode):
    started = time.perf_counter()
    from kcoral_runtime import eval_bundle, eval_worker
    marks = {"import": time.perf_counter() - started}

    def wrap(owner, name):
        original = getattr(owner, name)
        def timed_call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                marks[name] = marks.get(name, 0) + time.perf_counter() - t0
        setattr(owner, name, timed_call)

    for owner, name in [(eval_bundle.BundleWriter, "finish"),
                        (eval_bundle.BundleWriter, "hash_tensors"),
                        (eval_worker, "load_source"), (eval_worker, "describe_seeds")]:
        wrap(owner, name)
    out = None if mode == "trivial" else eval_worker.generate_inputs(reference, secret)
    marks["total"] = time.perf_counter() - started
    text = json.dumps({k: round(v * 1e3, 1) for k, v in marks.items()})
    return [out[0], text] if mode == "kept" else text


def intake(to_gpu, *segments):
    """The candidate step's intake: the kept bundle's segments arrive as uploads (read before
    this runs); with to_gpu, all of them are copied to the device (pageable, as sets are)."""
    marks = {"segments": len(segments), "bytes": sum(len(s) for s in segments)}
    if to_gpu:
        import torch
        started = time.perf_counter()
        for segment in segments:
            torch.frombuffer(segment, dtype=torch.uint8).cuda()
        torch.cuda.synchronize()
        marks["to_gpu_ms"] = round((time.perf_counter() - started) * 1e3, 1)
    return json.dumps(marks)
`;

const seed = () => String(Math.floor(Math.random() * 2 ** 40));
const secret = () =>
  JSON.stringify({
    correctness_seeds: [seed(), seed(), seed()],
    timing_seeds: [seed(), seed(), seed()],
    init_seed: 42,
    bracket_seed: seed(),
    header_digest: true,
  });
const VARIANTS: { name: string; mode: string; cpuOnly: boolean }[] = [
  { name: "trivial, cpu_only", mode: "trivial", cpuOnly: true },
  { name: "trivial", mode: "trivial", cpuOnly: false },
  { name: "step, small return, cpu_only", mode: "small", cpuOnly: true },
  { name: "step, bundle kept, cpu_only", mode: "kept", cpuOnly: true },
  { name: "step, bundle kept", mode: "kept", cpuOnly: false },
  { name: "the kept bundle uploaded (step 2's intake)", mode: "intake", cpuOnly: false },
  { name: "the kept bundle uploaded, then copied to the GPU", mode: "intake_gpu", cpuOnly: false },
];
const lines = new Map<string, string[]>();
let bundle: (KeptReturn | Uint8Array)[] | null = null;
try {
  await using client = new Client(server.url);
  for (let round = 0; round <= 3; round++) {
    for (const { name, mode, cpuOnly } of VARIANTS) {
      const program = new Program();
      const module = program.upload({ kind: "module", source: STEP });
      const intake = mode.startsWith("intake");
      if (intake && bundle === null) throw new Error(`${name}: no kept bundle yet`);
      const fn = program.getFunction({ module, name: intake ? "intake" : "timed", cpuOnly });
      const args = intake
        ? [
          mode === "intake_gpu" && gpu,
          ...bundle!.map((value) => program.upload({ kind: "bytes", value })),
        ]
        : [reference, secret(), mode];
      program.return_({ key: "out", value: program.run({ fn, args }) });
      const started = performance.now();
      const result = await client.execute(program, mode === "kept" ? { keepReturns: 1 << 20 } : {});
      const wall = performance.now() - started;
      if (!result.completed) throw new Error(`${name}: ${result.error?.message}`);
      const out = result.get("out");
      // The bundle's segments, each kept (or sent, when small).
      if (mode === "kept" && Array.isArray(out)) bundle = out[0] as (KeptReturn | Uint8Array)[];
      if (round === 0) continue;
      const marks = Array.isArray(out) ? out[1] : out;
      const line = `wall ${wall.toFixed(0)}, queue ${result.queueMs.toFixed(0)}, ` +
        `run ${result.elapsedMs.toFixed(0)}, in the step ${marks}`;
      lines.set(name, [...lines.get(name) ?? [], line]);
    }
  }
} finally {
  await server.shutdown();
}
console.log(`eval_inputs_step: ${gpu ? "GPU 0" : "simulated GPU"}, ms per request`);
for (const [name, list] of lines) {
  console.log(name);
  for (const line of list) console.log(`  ${line}`);
}

/**
 * Kernel-time fidelity (GPU only): the same CUDA-event harness
 * (`kcoral_runtime.builtins.benchmark`) timing the same kernel, once in a local Python process
 * and once through a KCoral server on the same GPU — idle, and while 7 other clients keep the
 * server's other workers busy with GPU work. The lease must keep the measurement undisturbed.
 *
 *   deno run -A bench/fidelity_bench.ts          # needs a GPU
 */
import { Client, Program } from "../mod.ts";
import { createApp } from "../server/app.ts";
import { serve } from "../server/serve.ts";
import { type BenchRow, row, summarize, table } from "./_stats.ts";

const _HARNESS = `
import torch
from kcoral_runtime.builtins import benchmark

def measure(mib, rounds):
    n = mib * 1024 * 1024 // 4
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    c = torch.empty_like(a)
    medians = []
    for _ in range(rounds):
        stats = benchmark(lambda: torch.add(a, b, out=c), warmup=100, repeat=1000)
        medians.append(stats["latency_ms_median"] * 1000.0)
    return medians
`;

const _NOISE = `
import torch

def noise():
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        x = x @ x
        x = x / x.norm()
    torch.cuda.synchronize()
    return 0
`;

const _RUNTIME = new URL("../runtime_py", import.meta.url).pathname;

async function _local(mib: number, rounds: number): Promise<number[]> {
  const code = `${_HARNESS}\nimport json\nprint(json.dumps(measure(${mib}, ${rounds})))\n`;
  const output = await new Deno.Command("python3", {
    args: ["-c", code],
    env: { PYTHONPATH: _RUNTIME },
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!output.success) throw new Error(new TextDecoder().decode(output.stderr));
  return JSON.parse(new TextDecoder().decode(output.stdout).trim().split("\n").at(-1)!);
}

async function _remote(client: Client, mib: number, rounds: number): Promise<number[]> {
  const program = new Program();
  const mod = program.upload({ kind: "module", source: _HARNESS });
  const fn = program.getFunction({ module: mod, name: "measure" });
  program.return_({ key: "us", value: program.run({ fn, args: [mib, rounds] }) });
  const result = await client.execute(program, { timeoutSeconds: 600 });
  if (!result.completed) throw new Error(JSON.stringify(result.error));
  return (result.get("us") as unknown[]).map(Number);
}

/** Runs the fidelity comparison on GPU 0; returns the rows. */
export async function runFidelityBench(quick = false): Promise<BenchRow[]> {
  const rounds = quick ? 5 : 15;
  const app = createApp({
    device: "gpu",
    gpus: [0],
    workersPerGpu: 8,
    maxRequestsPerWorker: 0,
    sandbox: "none",
    logDir: null,
    logConsole: false,
    diskCacheDir: null,
  });
  const server = await serve(app, { port: 0, handleSignals: false, log: () => {} });
  const rows: BenchRow[] = [];
  try {
    await using client = new Client(server.url);
    for (const mib of [4, 64]) {
      const local = await _local(mib, rounds);
      const idle = await _remote(client, mib, rounds);
      let stop = false;
      const noise = Array.from({ length: 7 }, async () => {
        await using c = new Client(server.url);
        const p = new Program();
        const m = p.upload({ kind: "module", source: _NOISE });
        p.run({ fn: p.getFunction({ module: m, name: "noise" }) });
        while (!stop) await c.execute(p);
      });
      const loaded = await _remote(client, mib, rounds);
      stop = true;
      await Promise.all(noise);
      const base = summarize(local).median;
      rows.push(row(`c = a + b, ${mib} MiB, local harness`, "µs", local));
      rows.push(row(`  through KCoral, idle server`, "µs", idle));
      rows.push(row(`  through KCoral, 7 other clients busy`, "µs", loaded));
      rows.push(
        row(
          `  difference of medians (idle / busy)`,
          "%",
          [idle, loaded].map((s) => (100 * (summarize(s).median - base)) / base),
          "within 0.13 µs",
          "within 1%",
        ),
      );
    }
  } finally {
    await server.shutdown();
  }
  return rows;
}

if (import.meta.main) {
  console.log(table(await runFidelityBench(Deno.args.includes("--quick"))));
}

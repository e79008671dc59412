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

/** A long-lived local Python process running the same harness (one line per measurement). */
class _LocalHarness {
  #child: Deno.ChildProcess;
  #writer: WritableStreamDefaultWriter<Uint8Array>;
  #lines: AsyncIterator<string>;

  constructor() {
    const code = `${_HARNESS}\nimport json, sys\nfor line in sys.stdin:\n` +
      `    mib, rounds = map(int, line.split())\n    print(json.dumps(measure(mib, rounds)), flush=True)\n`;
    this.#child = new Deno.Command("python3", {
      args: ["-c", code],
      env: { PYTHONPATH: _RUNTIME },
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    this.#writer = this.#child.stdin.getWriter();
    this.#lines = this.#child.stdout.pipeThrough(new TextDecoderStream()).pipeThrough(
      new _LineSplitter(),
    )[Symbol.asyncIterator]();
  }

  async measure(mib: number, rounds: number): Promise<number[]> {
    await this.#writer.write(new TextEncoder().encode(`${mib} ${rounds}\n`));
    const { value, done } = await this.#lines.next();
    if (done) throw new Error("the local harness exited");
    return JSON.parse(value);
  }

  async close(): Promise<void> {
    await this.#writer.close();
    await this.#child.status;
  }
}

class _LineSplitter extends TransformStream<string, string> {
  constructor() {
    let rest = "";
    super({
      transform(chunk, controller) {
        const lines = (rest + chunk).split("\n");
        rest = lines.pop()!;
        for (const line of lines) if (line.trim()) controller.enqueue(line);
      },
    });
  }
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
  const local = new _LocalHarness();
  try {
    await using client = new Client(server.url);
    for (const mib of [4, 64]) {
      // Local and remote rounds alternate, so clock or thermal drift hits both alike.
      const localUs: number[] = [];
      const idle: number[] = [];
      await local.measure(mib, 1); // warm-up
      await _remote(client, mib, 1);
      for (let i = 0; i < rounds; i++) {
        localUs.push(...await local.measure(mib, 1));
        idle.push(...await _remote(client, mib, 1));
      }
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
      const base = summarize(localUs).median;
      rows.push(row(`c = a + b, ${mib} MiB, local harness`, "µs", localUs));
      rows.push(row(`  through KCoral, idle server (interleaved)`, "µs", idle));
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
      rows.push(
        row(
          `  difference of medians (idle / busy)`,
          "µs",
          [idle, loaded].map((s) => summarize(s).median - base),
        ),
      );
    }
  } finally {
    await local.close();
    await server.shutdown();
  }
  return rows;
}

if (import.meta.main) {
  console.log(table(await runFidelityBench(Deno.args.includes("--quick"))));
}

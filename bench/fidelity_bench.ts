/**
 * Kernel-time fidelity (GPU only): the same CUDA-event harness
 * (`kcoral_runtime.builtins.benchmark`) timing the same kernel in local Python processes and
 * through KCoral servers on the same GPU — fresh and reused workers, idle, and while 7 other
 * clients keep the reused server's other workers busy with GPU work. The lease must keep the
 * measurement undisturbed.
 *
 *   deno run -A bench/fidelity_bench.ts          # needs a GPU
 */
import { Client, Program } from "../mod.ts";
import { createApp } from "../server/app.ts";
import { serve } from "../http/serve.ts";
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

function _gpuServer(maxRequestsPerWorker: number, workersPerGpu: number) {
  return createApp({
    device: "gpu",
    gpus: [0],
    workersPerGpu,
    maxRequestsPerWorker,
    sandbox: "none",
    logDir: null,
    logConsole: false,
    diskCacheDir: null,
  });
}

/**
 * Runs the fidelity comparison on GPU 0; returns the rows.
 *
 * A process's kernel time carries an offset of its own (where its allocations land): on the H200
 * the same harness reads 7.58 µs in one process and 7.94 µs in another at 4 MiB, steady within
 * each. One local process against one worker compares two draws of that offset, so each side
 * measures in many processes (16) and the table compares medians over them:
 *
 * - local harness: 16 processes, one measurement each;
 * - fresh workers (the default): every request a new process and CUDA context;
 * - reused workers: 16 clients measure at once on a server of 16 reused workers (the lease runs
 *   them one after another; each lands on its own worker), 4 times;
 * - busy: fresh workers while 7 other clients keep the same server busy with matmuls, each of
 *   their requests also creating and destroying a CUDA context (under the lease).
 *
 * One measurement is the median of 1000 timed launches; local and fresh measurements alternate,
 * so clock or thermal drift hits both alike.
 */
export async function runFidelityBench(quick = false): Promise<BenchRow[]> {
  const processes = quick ? 4 : 16;
  const options = { port: 0, handleSignals: false, log: () => {} };
  const fresh = await serve(_gpuServer(1, 8), options);
  const reused = await serve(_gpuServer(0, processes), options);
  const rows: BenchRow[] = [];
  const locals = Array.from({ length: processes }, () => new _LocalHarness());
  try {
    await using freshClient = new Client(fresh.url);
    const reusedClients = Array.from({ length: processes }, () => new Client(reused.url));
    try {
      for (const mib of [4, 64]) {
        const localUs: number[] = [];
        const freshUs: number[] = [];
        const reusedUs: number[] = [];
        await Promise.all(locals.map((local) => local.measure(mib, 1))); // warm-up
        await _remote(freshClient, mib, 1);
        await Promise.all(reusedClients.map((c) => _remote(c, mib, 1)));
        for (const local of locals) {
          localUs.push(...await local.measure(mib, 1));
          freshUs.push(...await _remote(freshClient, mib, 1));
        }
        for (let i = 0; i < (quick ? 1 : 4); i++) {
          const all = await Promise.all(reusedClients.map((c) => _remote(c, mib, 1)));
          reusedUs.push(...all.flat());
        }
        let stop = false;
        const noise = Array.from({ length: 7 }, async () => {
          await using c = new Client(fresh.url);
          const p = new Program();
          const m = p.upload({ kind: "module", source: _NOISE });
          p.run({ fn: p.getFunction({ module: m, name: "noise" }) });
          while (!stop) await c.execute(p);
        });
        const busy: number[] = [];
        for (let i = 0; i < processes / 2; i++) {
          busy.push(...await _remote(freshClient, mib, 1));
        }
        stop = true;
        await Promise.all(noise);
        const base = summarize(localUs).median;
        const measured = [freshUs, reusedUs, busy];
        rows.push(
          row(`c = a + b, ${mib} MiB, local harness (${processes} processes)`, "µs", localUs),
        );
        rows.push(row(`  through KCoral, fresh workers (default), idle`, "µs", freshUs));
        rows.push(
          row(`  through KCoral, ${processes} reused workers, all clients at once`, "µs", reusedUs),
        );
        rows.push(row(`  through KCoral, fresh workers, 7 other clients busy`, "µs", busy));
        rows.push(
          row(
            `  difference of medians (fresh / reused / busy)`,
            "%",
            measured.map((s) => (100 * (summarize(s).median - base)) / base),
            "within 0.13 µs",
            "within 1%",
          ),
        );
        rows.push(
          row(
            `  difference of medians (fresh / reused / busy)`,
            "µs",
            measured.map((s) => summarize(s).median - base),
          ),
        );
      }
    } finally {
      for (const c of reusedClients) c.close();
    }
  } finally {
    await Promise.all(locals.map((local) => local.close()));
    await fresh.shutdown();
    await reused.shutdown();
  }
  return rows;
}

if (import.meta.main) {
  console.log(table(await runFidelityBench(Deno.args.includes("--quick"))));
}

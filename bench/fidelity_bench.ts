/**
 * Kernel-time fidelity (GPU only): the same CUDA-event measurement
 * (`kcoral_runtime.builtins.launch_times`, what `benchmark` summarises) timing the same four
 * kernels in local Python processes and through KCoral servers on the same GPU — fresh and
 * reused workers, idle, and while 7 other clients keep the reused server's other workers busy
 * with GPU work — compared at the median and the p99 of the launches. The lease must keep the
 * measurement undisturbed.
 *
 *   deno run -A bench/fidelity_bench.ts [--quick] [--kernels add4,add64,gemm,tiny]  # needs a GPU
 */
import { Client, Program } from "../mod.ts";
import { createApp } from "../server/app.ts";
import type { ServerStatusData } from "../server/status.ts";
import { serve } from "../http/serve.ts";
import { type BenchRow, row, summarize, table } from "./_stats.ts";

/**
 * The harness (`bench/fidelity_kernels.py`): `measure(name, rounds)` gives `[median, p99, wall]`s.
 */
const _HARNESS = Deno.readTextFileSync(new URL("./fidelity_kernels.py", import.meta.url));

/** The kernels compared, by the harness's name for each. */
const _KERNELS = [
  { name: "add4", label: "c = a + b, 4 MiB" },
  { name: "add64", label: "c = a + b, 64 MiB" },
  { name: "gemm", label: "4096² bf16 GEMM (compute-bound)" },
  { name: "tiny", label: "1-element add (launch-bound)" },
];

/**
 * One measurement: the median and the p99 of 1000 timed launches, and the wall time per launch
 * of the whole measurement (warmup included), µs.
 */
export type Measurement = [median: number, p99: number, wall: number];

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

/**
 * A local Python process running the same harness (one line per measurement), in one of the two
 * process lifecycles a worker has:
 * - `"forks"`: the process imports torch and the harness but never touches CUDA, and forks a new
 *   process for each measurement (as a zygote forks a fresh worker, which has a CUDA context of
 *   its own); the baseline of fresh workers;
 * - `"lives"`: the process measures in itself, one measurement after another, emptying torch's
 *   allocator cache before each (as a reused worker does at the end of every request); the
 *   baseline of reused workers.
 *
 * A launch-bound kernel's time depends on where the process's allocations lie (on the H200 a
 * 1-element add reads ~4.5 µs in a new process and alternates 3.9 / 4.5 µs between successive
 * measurements in a long-lived one; `bench/probes/tiny_kernel_layout.py`), so each kind of worker
 * is compared with a local process that lives as it does.
 */
export class LocalHarness {
  #child: Deno.ChildProcess;
  #writer: WritableStreamDefaultWriter<Uint8Array>;
  #lines: AsyncIterator<string>;

  constructor(lifecycle: "forks" | "lives") {
    // A forked child's answer is passed on only once it has exited: its context's teardown,
    // which takes no lease, must not overlap the next measurement on any side.
    const measureLine = lifecycle === "forks"
      ? `    r, w = os.pipe()\n` +
        `    pid = os.fork()\n` +
        `    if pid == 0:\n` +
        `        try:\n` +
        `            os.close(r)\n` +
        `            os.write(w, json.dumps(measure(name, int(rounds))).encode())\n` +
        `        finally:\n` +
        `            os._exit(0)\n` +
        `    os.close(w)\n` +
        `    with os.fdopen(r, "rb") as answer:\n` +
        `        line = answer.read().decode()\n` +
        `    os.waitpid(pid, 0)\n` +
        `    print(line, flush=True)\n`
      : `    torch.cuda.empty_cache()\n` +
        `    print(json.dumps(measure(name, int(rounds))), flush=True)\n`;
    const code = `${_HARNESS}\nimport json, os, sys\nfor line in sys.stdin:\n` +
      `    name, rounds = line.split()\n` + measureLine;
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

  async measure(kernel: string, rounds: number): Promise<Measurement[]> {
    await this.#writer.write(new TextEncoder().encode(`${kernel} ${rounds}\n`));
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

/** `rounds` measurements of `kernel` by one request through `client`. */
export async function remoteMeasure(
  client: Client,
  kernel: string,
  rounds: number,
): Promise<Measurement[]> {
  const program = new Program();
  const mod = program.upload({ kind: "module", source: _HARNESS });
  const fn = program.getFunction({ module: mod, name: "measure" });
  program.return_({ key: "us", value: program.run({ fn, args: [kernel, rounds] }) });
  const result = await client.execute(program, { timeoutSeconds: 600 });
  if (!result.completed) throw new Error(JSON.stringify(result.error));
  return result.get("us") as Measurement[];
}

/**
 * Resolves once the server at `url` does nothing on its GPU: every seat holds a ready worker
 * (none busy, starting or being replaced) and no one holds its lease (`/status/data`). A
 * fresh-worker server readies the next worker after each request: a teardown and a new context.
 */
async function _settled(url: string): Promise<void> {
  for (;;) {
    const status = await (await fetch(`${url}/status/data`)).json() as ServerStatusData;
    if (
      status.workers.every((w) => w.state === "idle") &&
      status.gpus.every((gpu) => gpu.holders.length === 0)
    ) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** A server app on GPU 0, no sandbox, no logs: `workersPerGpu` seats, each worker serving
 * `maxRequestsPerWorker` requests (0: reused). */
export function gpuServer(
  maxRequestsPerWorker: number,
  workersPerGpu: number,
): ReturnType<typeof createApp> {
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
 * One kernel's rows: local, fresh, reused and busy measurements, and their differences. Fresh
 * and busy are compared with local measurements in new processes (`forks`), reused with local
 * long-lived processes (`locals`) measuring as often as each reused worker does.
 */
async function _compareKernel(
  kernel: { name: string; label: string },
  locals: LocalHarness[],
  forks: LocalHarness,
  freshClient: Client,
  reusedClients: Client[],
  freshUrl: string,
  quick: boolean,
): Promise<BenchRow[]> {
  const rounds = quick ? 1 : 4;
  const newProcess: Measurement[] = [];
  const longLived: Measurement[] = [];
  const fresh: Measurement[] = [];
  const reused: Measurement[] = [];
  await Promise.all(locals.map((harness) => harness.measure(kernel.name, 1))); // warm-up
  await forks.measure(kernel.name, 1);
  await remoteMeasure(freshClient, kernel.name, 1);
  await Promise.all(reusedClients.map((c) => remoteMeasure(c, kernel.name, 1)));
  // Each measurement below waits until the fresh server has readied its next worker: that
  // context work holds the fresh server's lease, which local processes and the reused server
  // do not take. (Busy measurements do not wait: there the lease is what is measured.)
  for (const _ of locals) {
    await _settled(freshUrl);
    newProcess.push(...await forks.measure(kernel.name, 1));
    await _settled(freshUrl);
    fresh.push(...await remoteMeasure(freshClient, kernel.name, 1));
  }
  for (let i = 0; i < rounds; i++) {
    for (const harness of locals) {
      await _settled(freshUrl);
      longLived.push(...await harness.measure(kernel.name, 1));
    }
    await _settled(freshUrl);
    const all = await Promise.all(reusedClients.map((c) => remoteMeasure(c, kernel.name, 1)));
    reused.push(...all.flat());
  }
  let stop = false;
  const noise = Array.from({ length: 7 }, async () => {
    await using c = new Client(freshUrl);
    const p = new Program();
    const m = p.upload({ kind: "module", source: _NOISE });
    p.run({ fn: p.getFunction({ module: m, name: "noise" }) });
    while (!stop) await c.execute(p);
  });
  const busy: Measurement[] = [];
  for (let i = 0; i < locals.length / 2; i++) {
    busy.push(...await remoteMeasure(freshClient, kernel.name, 1));
  }
  stop = true;
  await Promise.all(noise);

  const medians = (ms: Measurement[]) => ms.map(([median]) => median);
  const p99s = (ms: Measurement[]) => ms.map(([, p99]) => p99);
  /** Fresh / reused / busy against their local baselines, by `pick`'s statistic. */
  const pairs: [Measurement[], Measurement[]][] = [
    [fresh, newProcess],
    [reused, longLived],
    [busy, newProcess],
  ];
  const off = (pick: (ms: Measurement[]) => number[], percent: boolean) =>
    pairs.map(([ms, local]) => {
      const base = summarize(pick(local)).median;
      const difference = summarize(pick(ms)).median - base;
      return percent ? (100 * difference) / base : difference;
    });
  const kinds = [
    "fresh vs new local processes",
    "reused vs long-lived local processes",
    "busy vs new local processes",
  ];
  const medianOff = off(medians, true);
  const medianOffUs = off(medians, false);
  const p99Off = off(p99s, true);
  return [
    row(
      `${kernel.label}, local, a new process per measurement (${newProcess.length})`,
      "µs",
      medians(newProcess),
    ),
    row(
      `  local, ${locals.length} long-lived processes, ${rounds} measurements each`,
      "µs",
      medians(longLived),
    ),
    row(`  through KCoral, fresh workers (default), idle`, "µs", medians(fresh)),
    row(
      `  through KCoral, ${reusedClients.length} reused workers, all clients at once`,
      "µs",
      medians(reused),
    ),
    row(`  through KCoral, fresh workers, 7 other clients busy`, "µs", medians(busy)),
    ...kinds.map((kind, i) =>
      row(`  difference of medians, ${kind}`, "%", [medianOff[i]], undefined, "within 1%")
    ),
    ...kinds.map((kind, i) => row(`  difference of medians, ${kind}`, "µs", [medianOffUs[i]])),
    row(`  p99 of launches, local, new processes`, "µs", p99s(newProcess)),
    row(`  p99 of launches, local, long-lived processes`, "µs", p99s(longLived)),
    ...kinds.map((kind, i) =>
      row(`  difference of p99s, ${kind}`, "%", [p99Off[i]], undefined, "within 2%")
    ),
  ];
}

/**
 * Runs the fidelity comparison on GPU 0; returns the rows.
 *
 * A process's kernel time carries an offset of its own (where its allocations land): on the H200
 * the same harness reads 7.58 µs in one process and 7.94 µs in another at 4 MiB, steady within
 * each. One local process against one worker compares two draws of that offset, so each side
 * measures in many processes (16), each measurement on newly placed memory (a random 0-63 MiB
 * allocated first, `fidelity_kernels.py`), and the table compares medians over them:
 *
 * - local harness: a new process per measurement (16), forked as a zygote forks a fresh worker,
 *   the baseline of fresh and busy; and 16 long-lived processes measuring 4 times each, torch's
 *   allocator cache emptied before each measurement as a reused worker empties it after each
 *   request, the baseline of reused workers (a launch-bound kernel's time follows the process's
 *   allocation history, see `LocalHarness`);
 * - fresh workers (the default): every request a new process and CUDA context;
 * - reused workers: 16 clients measure at once on a server of 16 reused workers (the lease runs
 *   them one after another; each lands on its own worker), 4 times;
 * - busy: fresh workers while 7 other clients keep the same server busy with matmuls, each of
 *   their requests also creating and destroying a CUDA context (under the lease).
 *
 * One measurement is the median and the p99 of 1000 timed launches (`launch_times`, the
 * measurement of `benchmark`); a row compares the medians of those over the measurements. Local
 * and remote measurements alternate, so clock or thermal drift hits both alike. Four kernels: the
 * 4 MiB and 64 MiB `c = a + b` (memory-bound), a 4096² bf16 GEMM (compute-bound) and a 1-element
 * add (launch-bound).
 */
export async function runFidelityBench(
  quick = false,
  kernels: string[] = _KERNELS.map((k) => k.name),
): Promise<BenchRow[]> {
  const processes = quick ? 4 : 16;
  const options = { port: 0, handleSignals: false, log: () => {} };
  const fresh = await serve(gpuServer(1, 8), options);
  const reused = await serve(gpuServer(0, processes), options);
  const rows: BenchRow[] = [];
  const locals = Array.from({ length: processes }, () => new LocalHarness("lives"));
  const forks = new LocalHarness("forks");
  try {
    await using freshClient = new Client(fresh.url);
    const reusedClients = Array.from({ length: processes }, () => new Client(reused.url));
    try {
      for (const kernel of _KERNELS.filter((k) => kernels.includes(k.name))) {
        rows.push(
          ...await _compareKernel(
            kernel,
            locals,
            forks,
            freshClient,
            reusedClients,
            fresh.url,
            quick,
          ),
        );
      }
    } finally {
      for (const c of reusedClients) c.close();
    }
  } finally {
    await Promise.all([...locals, forks].map((local) => local.close()));
    await fresh.shutdown();
    await reused.shutdown();
  }
  return rows;
}

if (import.meta.main) {
  const at = Deno.args.indexOf("--kernels");
  const kernels = at >= 0 ? Deno.args[at + 1].split(",") : undefined;
  console.log(table(await runFidelityBench(Deno.args.includes("--quick"), kernels)));
}

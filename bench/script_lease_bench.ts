/**
 * Scripts on a shared GPU (issue 41): `CLIENTS` clients each send `SCRIPTS` `kcoral run python`
 * requests whose script imports torch and times `GEMMS` matrix products of `SIZE`² (float32,
 * CUDA events around each), to a real `kcoral server` with its default fresh workers, once with
 * the GPU gate and once without (`--no-gpu-gate`: the lease held from the script's start to its
 * end). Reports per request the lease held, the elapsed and queued time, the wait for the lease,
 * the whole run's wall time and rate, and how many replacement workers deferred their CUDA
 * context (initialized while requests waited: a script's request then creates and tears down no
 * context of the worker's under the lease) or created it (`kcoral_workers_ready_total`); on a
 * GPU also the kernel times measured inside the scripts against the same script run as a local
 * process (fidelity), half of those local runs before the served ones and half after.
 *
 *   deno run -A bench/script_lease_bench.ts --mode gpu              # GPU 0, bubblewrap
 *   deno run -A bench/script_lease_bench.ts --mode gpu --gate on    # only the gated server
 *   deno run -A bench/script_lease_bench.ts --mode sim --sandbox none --clients 2 --scripts 2
 *
 * Flags: --mode gpu|sim, --sandbox bubblewrap|none, --gate both|on|off, --clients N,
 * --scripts N, --gemms N, --size N, --local N (local runs for fidelity, gpu only; 0: none),
 * --json PATH (every sample).
 *
 * @module
 */
import { Client } from "../mod.ts";
import { decodeOutcome } from "../cli/run/outcome.ts";
import { buildToolProgram } from "../cli/run/program.ts";
import { readToolSources } from "../cli/run/sources.ts";
import { writeTar } from "../cli/run/tar.ts";
import { type BenchRow, row, table } from "./_stats.ts";

/** The benchmark's settings. */
export interface ScriptLeaseOptions {
  mode: "gpu" | "sim";
  sandbox: "bubblewrap" | "none";
  gates: ("on" | "off")[];
  clients: number;
  scripts: number;
  gemms: number;
  size: number;
  localRuns: number;
}

/** One request's timings and the kernel times its script measured (ms). */
export interface ScriptSample {
  leaseHeldMs: number;
  leaseWaitMs: number;
  elapsedMs: number;
  queueMs: number;
  kernelMs: number[];
}

const _CLI = new URL("../cli.ts", import.meta.url).pathname;

/**
 * The script: import torch (outside the lease with the gate), then `gemms` timed products on
 * CUDA (on the CPU when torch sees no GPU: a simulated server), printed as one JSON line.
 *
 * @example
 * ```ts
 * import { benchScript } from "./script_lease_bench.ts";
 *
 * if (!benchScript(50, 2048).includes("import torch")) throw new Error();
 * ```
 */
export function benchScript(gemms: number, size: number): string {
  return `import json, time
import torch
cuda = torch.cuda.is_available()
device = "cuda" if cuda else "cpu"
a = torch.randn(${size}, ${size}, device=device)
b = torch.randn(${size}, ${size}, device=device)
times = []
for _ in range(${gemms}):
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        c = a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    else:
        t0 = time.perf_counter()
        c = a @ b
        times.append((time.perf_counter() - t0) * 1000)
print(json.dumps({"kernel_ms": times}))
`;
}

async function _startServer(
  options: ScriptLeaseOptions,
  gate: "on" | "off",
): Promise<{ url: string; stop(): Promise<void> }> {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  const logDir = await Deno.makeTempDir({ prefix: "kcoral-bench-logs-" });
  const args = [
    "run",
    "-A",
    _CLI,
    "server",
    "--port",
    String(port),
    "--log-dir",
    logDir,
    "--no-log-console",
    "--no-log-programs",
    "--sandbox",
    options.sandbox,
    "--disk-cache-dir",
    "",
    "--device",
    "gpu",
    "--gpus",
    "0",
    "--workers-per-gpu",
    "8",
    ...(options.mode === "sim" ? ["--simulate-gpus"] : []),
    ...(gate === "off" ? ["--no-gpu-gate"] : []),
  ];
  const child = new Deno.Command(Deno.execPath(), { args, stdin: "null", stdout: "null" })
    .spawn();
  const deadline = Date.now() + 180_000;
  while (true) {
    try {
      const health = await fetch(`http://127.0.0.1:${port}/health`);
      const body = await health.json();
      if (health.ok && body.status === "ok") break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) throw new Error("the server did not become healthy in 180 s");
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  return {
    url: `http://127.0.0.1:${port}`,
    async stop() {
      child.kill("SIGTERM");
      await child.status;
      await Deno.remove(logDir, { recursive: true }).catch(() => {});
    },
  };
}

async function _oneScript(url: string, options: ScriptLeaseOptions): Promise<ScriptSample> {
  const archive = writeTar([{
    name: "script.py",
    data: new TextEncoder().encode(benchScript(options.gemms, options.size)),
    mode: 0o600,
  }]);
  const { program, options: execute } = buildToolProgram(
    await readToolSources("python"),
    archive,
    {
      forwarded: ["script.py"],
      env: {},
      fetch: [],
      timeoutSeconds: 600,
      outputLimitBytes: 1 << 20,
    },
  );
  await using client = new Client(url);
  const result = await client.execute(program, execute);
  const outcome = result.completed ? decodeOutcome(result.get("outcome")) : null;
  if (outcome === null || outcome.returncode !== 0) {
    throw new Error(`a script failed: ${JSON.stringify(result.error)} ${result.stderr}`);
  }
  const line = result.stdout.trim().split("\n").pop() ?? "{}";
  return {
    leaseHeldMs: result.leaseHeldMs,
    leaseWaitMs: result.leaseWaitMs,
    elapsedMs: result.elapsedMs,
    queueMs: result.queueMs,
    kernelMs: JSON.parse(line).kernel_ms ?? [],
  };
}

/** Workers that became ready so far, by context (`kcoral_workers_ready_total` on /metrics). */
async function _workersReady(url: string): Promise<{ created: number; deferred: number }> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const count = (context: string) => {
    const line = text.split("\n").find((l) =>
      l.startsWith(`kcoral_workers_ready_total{context="${context}"} `)
    );
    return line ? Number(line.split(" ").at(-1)) : 0;
  };
  return { created: count("created"), deferred: count("deferred") };
}

/**
 * `clients` clients, each sending `scripts` requests one after another; the workers that became
 * ready meanwhile, by context.
 */
async function _load(
  url: string,
  options: ScriptLeaseOptions,
): Promise<
  { samples: ScriptSample[]; wallMs: number; contexts: { created: number; deferred: number } }
> {
  await _oneScript(url, { ...options, gemms: 1 }); // warm-up (caches the inputs blob's runner)
  const before = await _workersReady(url);
  const started = performance.now();
  const perClient = await Promise.all(
    Array.from({ length: options.clients }, async () => {
      const out: ScriptSample[] = [];
      for (let i = 0; i < options.scripts; i++) out.push(await _oneScript(url, options));
      return out;
    }),
  );
  const wallMs = performance.now() - started;
  const after = await _workersReady(url);
  const contexts = {
    created: after.created - before.created,
    deferred: after.deferred - before.deferred,
  };
  return { samples: perClient.flat(), wallMs, contexts };
}

/** The same script as a local process, `runs` times (fidelity's control). */
async function _local(options: ScriptLeaseOptions, runs: number): Promise<number[]> {
  const dir = await Deno.makeTempDir({ prefix: "kcoral-bench-local-" });
  const script = `${dir}/script.py`;
  await Deno.writeTextFile(script, benchScript(options.gemms, options.size));
  const times: number[] = [];
  try {
    for (let i = 0; i < runs; i++) {
      const out = await new Deno.Command("python3", { args: [script], stderr: "inherit" })
        .output();
      if (!out.success) throw new Error("the local script failed");
      const line = new TextDecoder().decode(out.stdout).trim().split("\n").pop() ?? "{}";
      times.push(...JSON.parse(line).kernel_ms);
    }
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
  return times;
}

function _quantile(samples: number[], q: number): number {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] : NaN;
}

/**
 * Runs the benchmark and returns its rows (and every sample, by gate).
 *
 * @example
 * ```ts ignore
 * import { scriptLeaseBench } from "./script_lease_bench.ts";
 *
 * const { rows } = await scriptLeaseBench({ mode: "sim", sandbox: "none", gates: ["on"],
 *   clients: 2, scripts: 1, gemms: 5, size: 256, localRuns: 0 });
 * ```
 */
export async function scriptLeaseBench(
  options: ScriptLeaseOptions,
): Promise<{ rows: (BenchRow & { target?: string })[]; samples: Record<string, unknown> }> {
  const rows: (BenchRow & { target?: string })[] = [];
  const all: Record<string, unknown> = {};
  const kernels: Record<string, number[]> = {};
  const count = options.clients * options.scripts;
  // The local control brackets the served runs (half before, half after), so that a GPU whose
  // clocks drift over the run (warming up, power capping) moves both sides alike; the drift
  // between the two halves is printed as the control's own noise.
  const fidelity = options.mode === "gpu" && options.localRuns > 0;
  const localBefore = fidelity ? await _local(options, Math.ceil(options.localRuns / 2)) : [];
  for (const gate of options.gates) {
    const server = await _startServer(options, gate);
    try {
      const { samples, wallMs, contexts } = await _load(server.url, options);
      const tag = `gate ${gate}`;
      const pick = (f: (s: ScriptSample) => number) => samples.map(f);
      rows.push(
        row(
          `${tag}: lease held per script`,
          "ms",
          pick((s) => s.leaseHeldMs),
          undefined,
          "≤ 600 (664 with eager contexts, 3130 before the gate)",
        ),
        row(
          `${tag}: elapsed per script`,
          "ms",
          pick((s) => s.elapsedMs),
          undefined,
          "(6260 before)",
        ),
        row(`${tag}: queued per script`, "ms", pick((s) => s.queueMs), undefined, "(19900 before)"),
        row(`${tag}: lease wait per script`, "ms", pick((s) => s.leaseWaitMs)),
        row(
          `${tag}: ${options.clients} × ${options.scripts} scripts, total`,
          "s",
          [
            wallMs / 1000,
          ],
          undefined,
          "≤ 20 (27.0 with eager contexts, 79 before the gate)",
        ),
        row(`${tag}: rate`, "req/s", [count / (wallMs / 1000)], undefined, "(0.30 before)"),
        row(
          `${tag}: replacement workers, context deferred`,
          "workers",
          [contexts.deferred],
          undefined,
          "most of them",
        ),
        row(`${tag}: replacement workers, context created`, "workers", [contexts.created]),
      );
      kernels[gate] = samples.flatMap((s) => s.kernelMs);
      all[gate] = { wallMs, contexts, samples };
    } finally {
      await server.stop();
    }
  }
  if (fidelity) {
    const localAfter = await _local(options, Math.floor(options.localRuns / 2));
    const local = [...localBefore, ...localAfter];
    all.local = { before: localBefore, after: localAfter };
    if (localAfter.length) {
      const drift = 100 * (_quantile(localAfter, 0.5) / _quantile(localBefore, 0.5) - 1);
      rows.push(row("local control: median after vs before", "%", [drift], undefined, "(noise)"));
    }
    for (const [gate, times] of Object.entries(kernels)) {
      const ratio = (q: number) => 100 * (_quantile(times, q) / _quantile(local, q) - 1);
      rows.push(
        row(`gate ${gate}: kernel median vs local`, "%", [ratio(0.5)], undefined, "within 1"),
        row(`gate ${gate}: kernel p99 vs local`, "%", [ratio(0.99)], undefined, "within 2"),
      );
    }
  }
  return { rows, samples: all };
}

function _parse(args: string[]): { options: ScriptLeaseOptions; json: string | null } {
  const options: ScriptLeaseOptions = {
    mode: "gpu",
    sandbox: "bubblewrap",
    gates: ["on", "off"],
    clients: 8,
    scripts: 3,
    gemms: 50,
    size: 2048,
    localRuns: 8,
  };
  let json: string | null = null;
  for (let i = 0; i < args.length; i += 2) {
    const [flag, value] = [args[i], args[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    const int = () => {
      const n = Number(value);
      if (!Number.isInteger(n) || n < 0) throw new Error(`${flag} expects an integer: ${value}`);
      return n;
    };
    if (flag === "--mode" && (value === "gpu" || value === "sim")) options.mode = value;
    else if (flag === "--sandbox" && (value === "bubblewrap" || value === "none")) {
      options.sandbox = value;
    } else if (flag === "--gate" && ["both", "on", "off"].includes(value)) {
      options.gates = value === "both" ? ["on", "off"] : [value as "on" | "off"];
    } else if (flag === "--clients") options.clients = Math.max(1, int());
    else if (flag === "--scripts") options.scripts = Math.max(1, int());
    else if (flag === "--gemms") options.gemms = Math.max(1, int());
    else if (flag === "--size") options.size = Math.max(1, int());
    else if (flag === "--local") options.localRuns = int();
    else if (flag === "--json") json = value;
    else throw new Error(`unknown flag or value: ${flag} ${value}`);
  }
  return { options, json };
}

if (import.meta.main) {
  const { options, json } = _parse(Deno.args);
  const { rows, samples } = await scriptLeaseBench(options);
  console.log(
    `script lease bench: ${options.mode}, sandbox ${options.sandbox}, ${options.clients} clients` +
      ` × ${options.scripts} scripts, ${options.gemms} GEMMs of ${options.size}²`,
  );
  console.log(table(rows));
  if (json) await Deno.writeTextFile(json, JSON.stringify({ options, samples }, null, 2));
}

/**
 * GPU check of the bubblewrap sandbox (issue 5), for a machine with an NVIDIA GPU:
 *
 *   deno run -A tests/gpu/sandbox_gpu.ts [--gpu 0] [--requests 200] [--workers 8]
 *
 * Starts real GPU servers (`device: "gpu"`, one GPU) on loopback and checks, inside the
 * sandbox: a CUDA tensor round trip, kernel launches (torch, and Triton when the interpreter
 * has it), that `/dev` shows only the server's own `/dev/nvidia<minor>` plus the control nodes,
 * that `/proc` is writable, and that a reused sandboxed worker survives CUDA programs. Then it
 * measures the end-to-end latency of a trivial program (median of `--requests`, sequential,
 * after warm-up) with and without the sandbox, in fresh and reused modes, and prints a table
 * with the sandbox's overhead. Prints one PASS/FAIL line per check; exits 1 on any FAIL.
 *
 * @module
 */
import { Client, Program } from "../../mod.ts";
import { callProgram, postProgram, startServer, type TestServer } from "../_server.ts";

interface Check {
  name: string;
  ok: boolean;
  detail: string;
}

interface Latency {
  mode: "fresh" | "reused";
  sandbox: "bubblewrap" | "none";
  median: number;
  p10: number;
  p90: number;
  min: number;
  max: number;
  retired: number;
}

const CONTROL_NODE = /^nvidia(ctl|-uvm|-uvm-tools|-caps|-modeset)$/;
const TRIVIAL = callProgram("def f():\n    return 1\n", "f");

function flag(name: string, fallback: number): number {
  const i = Deno.args.indexOf(`--${name}`);
  if (i < 0) return fallback;
  const value = Number(Deno.args[i + 1]);
  if (!Number.isInteger(value) || value < 0) throw new Error(`--${name} needs an integer`);
  return value;
}

const gpu = flag("gpu", 0);
const requests = flag("requests", 200);
const workers = flag("workers", 8);
const checks: Check[] = [];

function check(name: string, ok: boolean, detail = ""): void {
  checks.push({ name, ok, detail });
  console.log(`${ok ? "PASS" : "FAIL"} ${name}${detail ? `: ${detail}` : ""}`);
}

async function attempt(name: string, body: () => Promise<string | void>): Promise<void> {
  try {
    check(name, true, (await body()) ?? "");
  } catch (error) {
    check(name, false, error instanceof Error ? error.message : String(error));
  }
}

function percentile(sorted: number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * (sorted.length - 1) + 0.5))];
}

/** The `/dev/nvidia<minor>` node NVML gives GPU `index`, read outside any sandbox. */
async function expectedNode(python: string, index: number): Promise<string> {
  const runtime = new URL("../../runtime_py", import.meta.url).pathname;
  const output = await new Deno.Command(python, {
    args: ["-m", "kcoral_runtime.nvml"],
    env: { PYTHONPATH: runtime },
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!output.success) throw new Error(new TextDecoder().decode(output.stderr));
  const gpus = JSON.parse(new TextDecoder().decode(output.stdout)) as {
    index: number;
    minor: number | null;
  }[];
  const minor = gpus.find((g) => g.index === index)?.minor;
  if (minor === undefined || minor === null) throw new Error(`NVML has no minor for GPU ${index}`);
  return `nvidia${minor}`;
}

async function hasModule(python: string, module: string): Promise<boolean> {
  const output = await new Deno.Command(python, {
    args: ["-c", `import ${module}`],
    stdout: "null",
    stderr: "null",
  }).output();
  return output.success;
}

async function runJson(server: TestServer, source: string): Promise<Record<string, unknown>> {
  const { status, json } = await postProgram(
    server.url,
    callProgram(`import json, os\n${source}`, "f"),
  );
  if (status !== 200 || json.status !== "COMPLETED") {
    throw new Error(`HTTP ${status} ${json.status}: ${JSON.stringify(json.error ?? json)}`);
  }
  return JSON.parse((json.results as { out: { value: string } }).out.value);
}

/** Functional checks inside the sandbox of `server` (label: fresh or reused). */
async function functionalChecks(server: TestServer, label: string, python: string) {
  const client = new Client(server.url);
  await attempt(`[${label}] CUDA tensor round trip inside the sandbox`, async () => {
    const program = new Program();
    const mod = program.upload({
      kind: "module",
      source: "import torch\n" +
        "def f(x):\n" +
        "    assert x.is_cuda, x.device\n" +
        "    return x * 2 + 1\n" +
        "def where(x):\n" +
        "    return str(x.device)\n",
    });
    const values = new Float32Array(4096).map((_, i) => i / 7);
    const x = program.upload({ kind: "tensor", value: values, shape: [64, 64] });
    program.return_({
      key: "y",
      value: program.run({ fn: program.getFunction({ module: mod, name: "f" }), args: [x] }),
    });
    program.return_({
      key: "device",
      value: program.run({ fn: program.getFunction({ module: mod, name: "where" }), args: [x] }),
    });
    const result = await client.execute(program);
    if (result.status !== "COMPLETED") throw new Error(JSON.stringify(result.error));
    const y = result.get("y") as unknown as { shape: number[]; data: Float32Array };
    const expected = values.map((v) => Math.fround(v * 2 + 1));
    if (y.shape.join("x") !== "64x64") throw new Error(`shape ${y.shape}`);
    if (y.data.some((v, i) => v !== expected[i])) throw new Error("values differ");
    return `device ${result.get("device")}`;
  });
  await attempt(`[${label}] torch kernel launch inside the sandbox`, async () => {
    const out = await runJson(
      server,
      "import torch\n" +
        "def f():\n" +
        "    a = torch.arange(1 << 20, device='cuda', dtype=torch.float64)\n" +
        "    m = torch.randn(512, 512, device='cuda') @ torch.eye(512, device='cuda')\n" +
        "    torch.cuda.synchronize()\n" +
        "    return json.dumps({'sum': float((a * 2).sum().item()), 'mm': m.shape[0]})\n",
    );
    const n = 1 << 20;
    if (out.sum !== n * (n - 1)) throw new Error(`sum ${out.sum}`);
  });
  if (await hasModule(python, "triton")) {
    await attempt(`[${label}] Triton JIT kernel inside the sandbox`, async () => {
      const out = await runJson(
        server,
        "import torch, triton, triton.language as tl\n" +
          "@triton.jit\n" +
          "def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):\n" +
          "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n" +
          "    mask = offs < n\n" +
          "    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)\n" +
          "def f():\n" +
          "    x = torch.arange(1000, device='cuda', dtype=torch.float32)\n" +
          "    out = torch.empty_like(x)\n" +
          "    _add[(triton.cdiv(1000, 256),)](x, torch.ones_like(x), out, 1000, BLOCK=256)\n" +
          "    torch.cuda.synchronize()\n" +
          "    cache = os.environ.get('TRITON_CACHE_DIR')\n" +
          "    return json.dumps({'ok': bool(torch.equal(out, x + 1)), 'cache': cache,\n" +
          "                       'cached': bool(os.listdir(cache))})\n",
      );
      if (!out.ok) throw new Error("wrong result");
      if (out.cache !== "/work/.kcoral/triton" || !out.cached) {
        throw new Error(`Triton cache ${out.cache} (used: ${out.cached})`);
      }
    });
  } else {
    console.log(`note [${label}] Triton is not installed for ${python}: no Triton kernel check`);
  }
  await attempt(`[${label}] /dev shows only this GPU's node and control nodes`, async () => {
    const own = await expectedNode(python, gpu);
    const out = await runJson(
      server,
      "def f():\n" +
        "    names = sorted(os.listdir('/dev'))\n" +
        "    caps = sorted(os.listdir('/dev/nvidia-caps')) if os.path.isdir('/dev/nvidia-caps') else []\n" +
        "    return json.dumps({'dev': names, 'caps': caps})\n",
    );
    const dev = out.dev as string[];
    const gpuNodes = dev.filter((n) => /^nvidia\d+$/.test(n));
    const hostNodes = [...Deno.readDirSync("/dev")].map((e) => e.name).filter((n) =>
      /^nvidia\d+$/.test(n)
    );
    if (gpuNodes.join() !== own) throw new Error(`GPU nodes ${gpuNodes} (expected ${own})`);
    const other = dev.filter((n) => n.startsWith("nvidia") && n !== own && !CONTROL_NODE.test(n));
    if (other.length) throw new Error(`unexpected nodes ${other}`);
    const base = ["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom"]
      .concat(["zero"]);
    const extra = dev.filter((n) => !n.startsWith("nvidia") && !base.includes(n));
    if (extra.length) throw new Error(`unexpected /dev entries ${extra}`);
    return `inside: ${dev.filter((n) => n.startsWith("nvidia")).join(" ")}; host GPU nodes: ` +
      `${hostNodes.sort().join(" ")}${hostNodes.length < 2 ? " (one GPU: weaker check)" : ""}`;
  });
  await attempt(`[${label}] /proc is writable for GPU workers`, async () => {
    const out = await runJson(
      server,
      "def f():\n" +
        "    line = [l.split() for l in open('/proc/self/mounts') if l.split()[1] == '/proc'][0]\n" +
        "    return json.dumps({'options': line[3]})\n",
    );
    if (!String(out.options).split(",").includes("rw")) throw new Error(String(out.options));
  });
  await attempt(`[${label}] the sandbox hides the host (no network, no host /tmp)`, async () => {
    const out = await runJson(
      server,
      "import socket\n" +
        "def f():\n" +
        "    return json.dumps({'ifaces': [n for _, n in socket.if_nameindex()],\n" +
        "                       'tmp': os.path.realpath('/tmp'), 'cwd': os.getcwd()})\n",
    );
    const want = JSON.stringify({ ifaces: ["lo"], tmp: "/work/.kcoral/tmp", cwd: "/work" });
    if (JSON.stringify(out) !== want) throw new Error(JSON.stringify(out));
  });
}

async function measure(server: TestServer): Promise<number[]> {
  for (let i = 0; i < 5; i++) await postProgram(server.url, TRIVIAL);
  await server.pool.settled();
  const times: number[] = [];
  for (let i = 0; i < requests; i++) {
    const started = performance.now();
    const { status, json } = await postProgram(server.url, TRIVIAL);
    times.push(performance.now() - started);
    if (status !== 200 || json.status !== "COMPLETED") {
      throw new Error(`request ${i}: HTTP ${status} ${JSON.stringify(json.error ?? json)}`);
    }
  }
  return times;
}

const latencies: Latency[] = [];
const python = "python3";
for (const mode of ["fresh", "reused"] as const) {
  for (const sandbox of ["bubblewrap", "none"] as const) {
    const label = `${mode}, ${sandbox === "none" ? "no sandbox" : "sandbox"}`;
    let server: TestServer | null = null;
    try {
      const started = performance.now();
      server = await startServer({
        device: "gpu",
        gpus: [gpu],
        workersPerGpu: workers,
        sandbox,
        maxRequestsPerWorker: mode === "fresh" ? 1 : 0,
        python,
        diskCacheDir: null,
      });
      const startMs = performance.now() - started;
      if (sandbox === "bubblewrap") {
        const reason = server.events.find((e) => e.event === "sandbox_disabled")?.error;
        check(
          `[${mode}] bubblewrap sandbox active on the GPU server`,
          server.app.sandbox === "bubblewrap",
          reason ? String(reason) : `started in ${startMs.toFixed(0)} ms`,
        );
        if (server.app.sandbox !== "bubblewrap") continue;
        await functionalChecks(server, mode, python);
        if (mode === "reused") {
          // A Triton JIT kernel keeps its cached .so (under /work/.kcoral/triton) mapped, which
          // retires a reused sandboxed worker by design (sandbox_cleanup, as upstream).
          const retired = server.events.filter((e) =>
            e.event === "worker_retired" && e.reason !== "sandbox_cleanup"
          );
          check(
            "[reused] sandboxed GPU workers survive the CUDA programs (JIT caches aside)",
            retired.length === 0,
            retired.map((e) => `${e.worker_id}: ${e.reason}`).join(", "),
          );
        }
      }
      const before = server.events.filter((e) => e.event === "worker_retired").length;
      const times = (await measure(server)).sort((a, b) => a - b);
      const retired = server.events.filter((e) => e.event === "worker_retired").length - before;
      latencies.push({
        mode,
        sandbox,
        median: percentile(times, 0.5),
        p10: percentile(times, 0.1),
        p90: percentile(times, 0.9),
        min: times[0],
        max: times.at(-1)!,
        retired,
      });
      if (mode === "reused") {
        check(`[${label}] no worker retired during the latency run`, retired === 0, `${retired}`);
      }
    } catch (error) {
      check(`[${label}] server run`, false, error instanceof Error ? error.message : String(error));
    } finally {
      await server?.stop();
    }
  }
}

console.log(
  `\nTrivial program, end to end over loopback: ${requests} sequential requests, GPU ${gpu}, ` +
    `${workers} workers per GPU (ms)`,
);
console.log("| workers | sandbox    | median | p10    | p90    | min    | max    | retired |");
console.log("|---------|------------|--------|--------|--------|--------|--------|---------|");
const f = (n: number) => n.toFixed(2).padStart(6);
for (const l of latencies) {
  console.log(
    `| ${l.mode.padEnd(7)} | ${l.sandbox.padEnd(10)} | ${f(l.median)} | ${f(l.p10)} | ` +
      `${f(l.p90)} | ${f(l.min)} | ${f(l.max)} | ${String(l.retired).padStart(7)} |`,
  );
}
for (const mode of ["fresh", "reused"] as const) {
  const on = latencies.find((l) => l.mode === mode && l.sandbox === "bubblewrap");
  const off = latencies.find((l) => l.mode === mode && l.sandbox === "none");
  if (on && off) {
    const delta = on.median - off.median;
    console.log(
      `sandbox overhead (${mode}): ${delta >= 0 ? "+" : ""}${delta.toFixed(2)} ms median ` +
        `(${((delta / off.median) * 100).toFixed(1)}%)`,
    );
  }
}
const failed = checks.filter((c) => !c.ok);
console.log(
  failed.length ? `\nFAIL: ${failed.length} of ${checks.length} checks` : `\nPASS: all checks`,
);
Deno.exit(failed.length ? 1 : 0);

/**
 * Two-GPU check, for a machine with two NVIDIA GPUs (run from the project root):
 *
 *   deno run -A tests/gpu/two_gpu.ts [--simulate] [--sandbox none|bubblewrap]
 *
 * Starts GPU servers with `gpus: [0, 1]` in-process and checks:
 * 1. a `gpu_count=2` request sees both GPUs (`CUDA_VISIBLE_DEVICES` holds the two UUIDs torch
 *    reports, a kernel runs on each, the response's `gpuIds` are `[0, 1]`);
 * 2. inside such a request, an NCCL all-reduce over two spawned ranks (one per GPU) is exact, and
 *    the worker and the ranks have NVLink multicast off (the server's own environment is given
 *    without those variables, so the server must set them itself);
 * 3. a `cpu_only` step of a `gpu_count=2` request frees both GPUs: a single-GPU request runs
 *    during it, and the next GPU step waits for that request and re-takes both GPUs;
 * 4. concurrent single-GPU requests spread over both GPUs, and a `gpu_count=2` request queued
 *    behind them finishes before the single-GPU requests submitted after it;
 * 5. with bubblewrap, a worker of one GPU sees and can open only its own `/dev/nvidia<minor>`.
 *
 * `--sandbox` (or `KCORAL_TEST_SANDBOX`) sets the sandbox of checks 1-4 (default `none`); check 5
 * always uses bubblewrap. `--simulate` runs against simulated GPUs (torch CPU tensors, `gloo`
 * instead of NCCL, `sim-<i>` instead of UUIDs) and skips check 5. Prints one PASS/FAIL line per
 * check; exits 1 on any FAIL.
 *
 * @module
 */
import { Client, Program, type ProgramResult } from "../../mod.ts";
import { startServer, type TestServer } from "../_server.ts";

const SIM = Deno.args.includes("--simulate");
const sandboxFlag = Deno.args.indexOf("--sandbox");
const SANDBOX = (sandboxFlag >= 0 ? Deno.args[sandboxFlag + 1] : undefined) ??
  Deno.env.get("KCORAL_TEST_SANDBOX") ?? "none";
if (SANDBOX !== "none" && SANDBOX !== "bubblewrap") throw new Error(`bad sandbox ${SANDBOX}`);
const MULTICAST_OFF: Record<string, string> = {
  NCCL_NVLS_ENABLE: "0",
  TORCH_SYMM_MEM_DISABLE_MULTICAST: "1",
  NVSHMEM_DISABLE_NVLS: "1",
};
const NO_MULTICAST = Object.keys(MULTICAST_OFF);
const MARKER = "two_gpu_cpu_phase";
const UUID = SIM ? /^sim-\d+$/ : /^GPU-[0-9a-f-]{36}$/;
const N = 1 << 20;

const SOURCE = `import json, os, subprocess, sys, tempfile, time
import torch

SIM = ${SIM ? "True" : "False"}
NO_MULTICAST = ${JSON.stringify(NO_MULTICAST)}

def devices():
    visible = [e for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e]
    if SIM:
        from kcoral_runtime.devices import visible_sim_devices
        return visible, visible_sim_devices(",".join(visible), 2)
    count = torch.cuda.device_count()
    return visible, ["GPU-" + str(torch.cuda.get_device_properties(i).uuid) for i in range(count)]

def gpu_sleep(seconds):
    end = time.time() + seconds
    while time.time() < end:
        if SIM:
            time.sleep(0.005)
        else:
            torch.cuda._sleep(5_000_000)
            torch.cuda.synchronize()

def step(seconds=0.0):
    t0 = time.time()
    visible, seen = devices()
    sums = []
    for i in range(len(seen)):
        x = torch.arange(${N}, dtype=torch.float64, device="cpu" if SIM else f"cuda:{i}")
        sums.append((x * 2).sum().item())
    gpu_sleep(seconds)
    return json.dumps({"t0": t0, "t1": time.time(), "visible": visible, "seen": seen,
                       "sums": sums, "env": {k: os.environ.get(k) for k in NO_MULTICAST}})

def cpu_phase(seconds):
    t0 = time.time()
    open("${MARKER}", "w").close()
    time.sleep(seconds)
    return json.dumps({"t0": t0, "t1": time.time()})

def nodes(minors):
    found = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia") and n[6:].isdigit())
    opened = {}
    for m in minors:
        try:
            os.close(os.open(f"/dev/nvidia{m}", os.O_RDWR))
            opened[str(m)] = "ok"
        except OSError as e:
            opened[str(m)] = e.strerror
    return json.dumps({"nodes": found, "open": opened})

RANK = """
import json, os, sys, torch, torch.distributed as dist
rank, world, init, sim = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
if not sim:
    torch.cuda.set_device(rank)
dist.init_process_group("gloo" if sim else "nccl", init_method=init, rank=rank, world_size=world)
x = torch.arange(4096, dtype=torch.float32, device="cpu" if sim else "cuda") * (rank + 1)
dist.all_reduce(x)
want = torch.arange(4096, dtype=torch.float32) * (world * (world + 1) // 2)
print(json.dumps({"rank": rank, "exact": bool(torch.equal(x.cpu(), want)), "device": str(x.device),
                  "backend": str(dist.get_backend()),
                  "env": {k: os.environ.get(k) for k in sys.argv[5].split(",")}}))
dist.destroy_process_group()
"""

def all_reduce(world):
    folder = tempfile.mkdtemp(dir=os.getcwd())
    script = os.path.join(folder, "rank.py")
    with open(script, "w") as f:
        f.write(RANK)
    init = "file://" + os.path.join(folder, "store")
    argv = lambda r: [sys.executable, script, str(r), str(world), init, "1" if SIM else "0",
                      ",".join(NO_MULTICAST)]
    procs = [subprocess.Popen(argv(r), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    deadline, ranks, errors = time.time() + 180, [], []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
        if p.returncode == 0 and out.strip():
            ranks.append(json.loads(out.strip().splitlines()[-1]))
        else:
            errors.append(f"exit {p.returncode}: {err[-1500:]}")
    return json.dumps({"ranks": ranks, "errors": errors})
`;

/** What `step` returns: times, CUDA_VISIBLE_DEVICES entries, devices seen, kernel sums. */
type Step = Record<"t0" | "t1", number> & Record<"visible" | "seen", string[]> & {
  sums: number[];
  env: Record<string, string | null>;
};
// deno-lint-ignore no-explicit-any
type Out = Record<string, any>;
interface Call {
  key: string;
  fn: string;
  args?: unknown[];
  cpuOnly?: boolean;
}

const checks: { ok: boolean }[] = [];
function check(name: string, ok: boolean, detail = ""): void {
  checks.push({ ok });
  console.log(`${ok ? "PASS" : "FAIL"} ${name}${detail ? `: ${detail}` : ""}`);
}

async function group(name: string, body: () => Promise<void>): Promise<void> {
  try {
    await body();
  } catch (error) {
    check(name, false, error instanceof Error ? error.message : String(error));
  }
}

/** Runs `calls` (one uploaded module) and parses each returned JSON string. */
async function execute(
  client: Client,
  calls: Call[],
  gpuCount?: number,
): Promise<{ result: ProgramResult; out: Out }> {
  const p = new Program();
  const module = p.upload({ kind: "module", source: SOURCE });
  const fns = new Map<string, ReturnType<Program["getFunction"]>>();
  for (const call of calls) {
    const name = `${call.fn}${call.cpuOnly ? "/cpu" : ""}`;
    if (!fns.has(name)) {
      fns.set(name, p.getFunction({ module, name: call.fn, cpuOnly: call.cpuOnly }));
    }
    p.return_({ key: call.key, value: p.run({ fn: fns.get(name)!, args: call.args ?? [] }) });
  }
  const result = await client.execute(p, gpuCount ? { gpuCount } : {});
  if (!result.completed) throw new Error(`${result.status}: ${JSON.stringify(result.error)}`);
  const out: Out = {};
  for (const [key, value] of result.results) out[key] = JSON.parse(String(value));
  return { result, out };
}

/** One `step` result: `count` devices seen, in CUDA_VISIBLE_DEVICES order, kernels exact. */
function devicesOk(step: Step, count: number): boolean {
  return step.seen.length === count && step.visible.join() === step.seen.join() &&
    step.visible.every((u) => UUID.test(u)) && new Set(step.visible).size === count &&
    step.sums.length === count && step.sums.every((s) => s === N * (N - 1));
}

const same = (a: readonly unknown[], b: readonly unknown[]) => a.join() === b.join();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const routedGpu = (server: TestServer, requestId: string) =>
  server.events.find((e) => e.event === "request_routed" && e.request_id === requestId)?.gpu_id;

async function waitFor(what: string, condition: () => boolean, ms = 120_000): Promise<void> {
  for (const deadline = Date.now() + ms; !condition(); await sleep(20)) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
  }
}

function stat(path: string): Deno.FileInfo | null {
  try {
    return Deno.statSync(path);
  } catch {
    return null;
  }
}

/** Checks 1-4 on one server with `gpus: [0, 1]`. */
async function setChecks(server: TestServer, client: Client): Promise<void> {
  const uuidOf = new Map<number, string>();
  await group("(1) gpu_count=2 request", async () => {
    const { result, out } = await execute(client, [{ key: "s", fn: "step" }], 2);
    const s = out.s as Step;
    result.gpuIds.forEach((gpu, i) => uuidOf.set(gpu, s.visible[i]));
    check(
      "(1) gpu_count=2: response gpuIds are [0, 1]",
      same(result.gpuIds, [0, 1]),
      `${result.gpuIds}`,
    );
    check(
      `(1) gpu_count=2: ${SIM ? "the runtime" : "torch"} sees 2 devices, CUDA_VISIBLE_DEVICES ` +
        `holds their ${SIM ? "sim ids" : "UUIDs"}, a kernel runs on each`,
      devicesOk(s, 2),
      `CUDA_VISIBLE_DEVICES=${s.visible.join(",")}; seen ${s.seen.join(",")}`,
    );
  });

  await group("(2) all-reduce across both GPUs", async () => {
    const { out } = await execute(client, [
      { key: "s", fn: "step" },
      { key: "ar", fn: "all_reduce", args: [2] },
    ], 2);
    const ranks = out.ar.ranks as { exact: boolean; device: string; backend: string; env: Out }[];
    const envs = [out.s.env, ...ranks.map((r) => r.env)];
    check(
      "(2) NVLink multicast is off in the worker and in its spawned ranks",
      envs.length === 3 && envs.every((e) => NO_MULTICAST.every((k) => e[k] === MULTICAST_OFF[k])),
      `worker + ${ranks.length} ranks: ${[...new Set(envs.map((e) => JSON.stringify(e)))]} ` +
        "(the server's own environment lacks them)",
    );
    const backend = SIM ? "gloo" : "nccl";
    const devs = ranks.map((r) => r.device).sort();
    check(
      `(2) ${backend} all-reduce over 2 ranks (one per GPU) returns the exact sum`,
      ranks.length === 2 && ranks.every((r) => r.exact && r.backend === backend) &&
        same(devs, SIM ? ["cpu", "cpu"] : ["cuda:0", "cuda:1"]),
      out.ar.errors.length ? out.ar.errors.join(" | ") : `devices ${devs}, backend ${backend}`,
    );
  });

  await group("(3) cpu_only phase of a gpu_count=2 request", async () => {
    await server.pool.settled();
    const set = execute(client, [
      { key: "before", fn: "step", args: [0.2] },
      { key: "cpu", fn: "cpu_phase", args: [3], cpuOnly: true },
      { key: "after", fn: "step" },
    ], 2);
    let setDone = false;
    set.finally(() => (setDone = true)).catch(() => {});
    const marker = () =>
      server.pool.seats.some((seat) => stat(`${seat.workspaces.hostPath}/${MARKER}`));
    await waitFor("the cpu_only phase", () => marker() || setDone);
    const single = await execute(client, [{ key: "s", fn: "step", args: [4] }]);
    const { result, out } = await set;
    const s = single.out.s as Step;
    const cpu = out.cpu as { t0: number; t1: number };
    const after = out.after as Step;
    const rel = (t: number) => `${((t - cpu.t0) * 1000).toFixed(0)} ms`;
    check(
      "(3) a single-GPU request gets its GPU during the set's cpu_only phase",
      cpu.t0 <= s.t0 && s.t0 < cpu.t1 && devicesOk(s, 1),
      `cpu_only phase 0..${rel(cpu.t1)}, single ran ${rel(s.t0)}..${rel(s.t1)} on ` +
        `${s.visible} (lease wait ${single.result.leaseWaitMs.toFixed(1)} ms)`,
    );
    check(
      "(3) the set's next GPU step re-takes both GPUs (after the single one is done)",
      same(result.gpuIds, [0, 1]) && devicesOk(after, 2) && after.t0 >= s.t1 &&
        after.t0 >= cpu.t1,
      `gpuIds ${result.gpuIds}, after-step at ${rel(after.t0)} sees ${after.seen.length} ` +
        `devices; set lease wait ${result.leaseWaitMs.toFixed(0)} ms`,
    );
  });

  await group("(4) scheduling of single and set requests", async () => {
    await server.pool.settled();
    const finished: string[] = [];
    const run = (name: string, calls: Call[], gpuCount?: number) =>
      execute(client, calls, gpuCount).finally(() => finished.push(name));
    const early = [0, 1, 2, 3].map((i) =>
      run(`early${i}`, [{ key: "s", fn: "step", args: [0.5] }])
    );
    await waitFor(
      "4 requests in progress",
      () => server.app.health().load.requests_in_progress >= 4,
    );
    const set = run("set", [{ key: "s", fn: "step", args: [0.3] }], 2);
    await sleep(150);
    const late = [0, 1, 2, 3, 4, 5].map((i) =>
      run(`late${i}`, [{ key: "s", fn: "step", args: [0.1] }])
    );
    const results = await Promise.all(early);
    const perGpu = [0, 0];
    let consistent = true;
    for (const { result, out } of results) {
      const gpu = routedGpu(server, result.requestId) as number;
      perGpu[gpu]++;
      consistent &&= devicesOk(out.s, 1) && out.s.visible[0] === uuidOf.get(gpu);
    }
    check(
      "(4) 4 concurrent single-GPU requests spread evenly over both GPUs",
      perGpu[0] === 2 && perGpu[1] === 2 && consistent,
      `GPU 0: ${perGpu[0]}, GPU 1: ${perGpu[1]}; each saw only its routed GPU: ${consistent}`,
    );
    const { result } = await set;
    await Promise.all(late);
    const setAt = finished.indexOf("set");
    check(
      "(4) a queued gpu_count=2 request finishes before the single-GPU requests sent after it",
      same(result.gpuIds, [0, 1]) && finished.every((n, i) => !n.startsWith("late") || i > setAt),
      `order ${finished.join(" ")}; set waited ${result.leaseWaitMs.toFixed(0)} ms for GPUs`,
    );
  });
}

/** Check 5: bubblewrap hides the other GPU's device node from a single-GPU worker. */
async function isolationChecks(): Promise<void> {
  const runtime = new URL("../../runtime_py", import.meta.url).pathname;
  const nvml = await new Deno.Command("python3", {
    args: ["-m", "kcoral_runtime.nvml"],
    env: { PYTHONPATH: runtime },
    stdout: "piped",
  }).output();
  const listed = JSON.parse(new TextDecoder().decode(nvml.stdout)) as Out[];
  const minor = new Map(listed.map((g) => [g.index as number, g.minor as number]));
  const minors = [minor.get(0)!, minor.get(1)!];
  const onHost = minors.every((m) => stat(`/dev/nvidia${m}`)?.isCharDevice);
  check(
    "(5) the host has both GPU nodes",
    onHost,
    `GPU 0 → nvidia${minors[0]}, GPU 1 → nvidia${minors[1]}`,
  );
  const server = await startServer({
    device: "gpu",
    gpus: [0, 1],
    workersPerGpu: 1,
    maxRequestsPerWorker: 0,
    sandbox: "bubblewrap",
  });
  const client = new Client(server.url);
  try {
    const reason = server.events.find((e) => e.event === "sandbox_disabled")?.error;
    check("(5) bubblewrap sandbox active", server.app.sandbox === "bubblewrap", `${reason ?? ""}`);
    if (server.app.sandbox !== "bubblewrap") return;
    const calls: Call[] = [
      { key: "s", fn: "step", args: [0.5] },
      { key: "n", fn: "nodes", args: [minors] },
    ];
    const runs = await Promise.all([execute(client, calls), execute(client, calls)]);
    for (const { result, out } of runs) {
      const gpu = routedGpu(server, result.requestId) as number;
      const own = minors[gpu], other = minors[1 - gpu];
      check(
        `(5) a sandboxed worker of GPU ${gpu} uses its GPU, cannot open /dev/nvidia${other}`,
        devicesOk(out.s, 1) && same(out.n.nodes, [`nvidia${own}`]) &&
          out.n.open[own] === "ok" && out.n.open[other] !== "ok",
        `/dev: ${out.n.nodes.join(" ")}; open: ${JSON.stringify(out.n.open)}`,
      );
    }
    const { out } = await execute(client, calls, 2);
    const both = minors.map((m) => `nvidia${m}`).sort();
    check(
      "(5) a sandboxed gpu_count=2 worker sees both GPU nodes and both GPUs",
      devicesOk(out.s, 2) && same(out.n.nodes, both) && minors.every((m) => out.n.open[m] === "ok"),
      `/dev: ${out.n.nodes.join(" ")}`,
    );
  } finally {
    client.close();
    await server.stop();
  }
}

const started = performance.now();
const env = Deno.env.toObject();
for (const name of NO_MULTICAST) delete env[name];
let server: TestServer | null = null;
let client: Client | null = null;
await group(`server (gpus [0, 1], sandbox ${SANDBOX}${SIM ? ", simulated" : ""})`, async () => {
  server = await startServer({
    device: "gpu",
    gpus: [0, 1],
    simulateGpus: SIM,
    workersPerGpu: 3,
    maxRequestsPerWorker: 0,
    sandbox: SANDBOX,
  }, { env });
  if (server.app.sandbox !== SANDBOX) throw new Error(`sandbox is ${server.app.sandbox}`);
  client = new Client(server.url);
  await setChecks(server, client);
});
(client as Client | null)?.close();
await (server as TestServer | null)?.stop();
if (SIM) console.log("SKIP (simulated) (5) bubblewrap GPU node isolation: no /dev/nvidia* nodes");
else await group("(5) isolation", isolationChecks);

const failed = checks.filter((c) => !c.ok).length;
const seconds = ((performance.now() - started) / 1000).toFixed(1);
console.log(
  failed
    ? `\nFAIL: ${failed} of ${checks.length} checks (${seconds} s)`
    : `\nPASS: all ${checks.length} checks (${seconds} s)`,
);
Deno.exit(failed ? 1 : 0);

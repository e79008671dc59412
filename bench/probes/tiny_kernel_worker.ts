/**
 * Why a launch-bound kernel (a 1-element add) reads slower in fresh workers than in local
 * processes (GPU only; the fidelity bench's 2026-12-02 runs: 4.62–4.66 µs against 3.90–3.98).
 * One program measures it several ways in one process (`launch_times`, 100 warmup + 1000 timed,
 * median µs): first, again, after a 0.3 s sleep, on a tensor allocated after 64 MiB, without the
 * L2 flush; the wall time per iteration of the whole loop against the flush's own GPU time (is the
 * loop host-bound?); and reports what could differ between processes (the tensor's address, CUPTI
 * mapped, CUDA/torch environment, scheduling, threads). It runs in new local processes, in fresh
 * workers (8 seats, as the bench), in fresh workers of a 1-seat server, and in reused workers.
 *
 *   deno run -A bench/probes/tiny_kernel_worker.ts [--runs 4]
 *
 * @module
 */
import { startServer } from "../../tests/_server.ts";
import { Client, Program } from "../../mod.ts";

const PROBE = `
import os, statistics, time, torch
from kcoral_runtime.builtins import launch_times

def _median(fn, **kwargs):
    times = sorted(launch_times(fn, warmup=100, repeat=1000, **kwargs))
    return round(statistics.median(times) * 1000.0, 3)

def probe():
    out = {}
    x = torch.zeros(1, device="cuda")
    out["first"] = _median(lambda: x.add_(1))
    out["again"] = _median(lambda: x.add_(1))
    time.sleep(0.3)
    out["after_sleep"] = _median(lambda: x.add_(1))
    big = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    y = torch.zeros(1, device="cuda")
    out["other_block"] = _median(lambda: y.add_(1))
    out["no_flush"] = _median(lambda: x.add_(1), flush_l2=False)
    # Wall time per launch of the whole measurement (host side): if it exceeds the GPU's time
    # per iteration (the flush plus the kernel), the loop is host-bound and the events time
    # host gaps too.
    start = time.perf_counter()
    _median(lambda: x.add_(1))
    out["wall_us_per_iteration"] = round((time.perf_counter() - start) / 1100 * 1e6, 2)
    flush = torch.empty(120 << 20, dtype=torch.uint8, device="cuda")
    out["flush_alone"] = _median(lambda: flush.zero_(), flush_l2=False)
    del flush
    del big
    out["ptr"] = hex(x.data_ptr())
    with open("/proc/self/maps") as maps:
        text = maps.read()
    out["cupti"] = "cupti" in text
    out["env"] = sorted(k for k in os.environ if k.startswith(("CUDA", "PYTORCH", "TORCH", "NCCL", "LD_")))
    out["sched"] = [os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0), len(os.sched_getaffinity(0))]
    out["threads"] = len(os.listdir("/proc/self/task"))
    out["profile"] = [repr(__import__("sys").getprofile()), repr(__import__("sys").gettrace())]
    return out
`;
const RUNTIME = new URL("../../runtime_py", import.meta.url).pathname;
const at = Deno.args.indexOf("--runs");
const runs = at >= 0 ? Number(Deno.args[at + 1]) : 4;

async function local(): Promise<string> {
  const out = await new Deno.Command("python3", {
    args: ["-c", `${PROBE}\nimport json\nprint(json.dumps(probe()))`],
    env: { PYTHONPATH: RUNTIME },
    stderr: "inherit",
  }).output();
  return new TextDecoder().decode(out.stdout).trim();
}

async function remote(client: Client): Promise<string> {
  const program = new Program();
  const module = program.upload({ kind: "module", source: PROBE });
  program.return_({
    key: "r",
    value: program.run({ fn: program.getFunction({ module, name: "probe" }) }),
  });
  const result = await client.execute(program, { timeoutSeconds: 300 });
  if (!result.completed) throw new Error(JSON.stringify(result.error));
  // A returned dict decodes to a Map.
  return JSON.stringify(result.get("r"), (_, v) => v instanceof Map ? Object.fromEntries(v) : v);
}

for (let i = 0; i < runs; i++) console.log("local", await local());
for (
  const [label, seats, maxRequests] of [
    ["fresh x8", 8, 1],
    ["fresh x1", 1, 1],
    ["reused x1", 1, 0],
  ] as const
) {
  const server = await startServer(
    { device: "gpu", gpus: [0], workersPerGpu: seats, maxRequestsPerWorker: maxRequests } as never,
  );
  await using client = new Client(server.url);
  await remote(client); // warm-up
  for (let i = 0; i < runs; i++) console.log(label, await remote(client));
  await server.stop();
}
for (let i = 0; i < 2; i++) console.log("local", await local());

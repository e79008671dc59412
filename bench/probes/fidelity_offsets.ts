/**
 * Per-process kernel-time offsets (GPU only): the fidelity harness's median for c = a + b at 64
 * and 4 MiB in fresh local processes and through servers of 8 reused, 1 reused and fresh
 * workers, with each process's pid, allocation addresses and CUDA environment.
 *
 *   deno run -A bench/probes/fidelity_offsets.ts
 *
 * @module
 */
import { startServer } from "../../tests/_server.ts";
import { Client, Program } from "../../mod.ts";
const H = `
import os, torch
from kcoral_runtime.builtins import benchmark
def measure(mib, rounds):
    n = mib * 1024 * 1024 // 4
    a = torch.randn(n, device="cuda"); b = torch.randn(n, device="cuda"); c = torch.empty_like(a)
    ms = []
    for _ in range(rounds):
        ms.append(benchmark(lambda: torch.add(a, b, out=c), warmup=100, repeat=1000)["latency_ms_median"] * 1000.0)
    ms.sort()
    return [os.getpid(), hex(a.data_ptr()), hex(b.data_ptr()), hex(c.data_ptr()), round(ms[len(ms)//2], 3), torch.cuda.memory_reserved() >> 20, os.environ.get("CUDA_VISIBLE_DEVICES", "")[:12], os.environ.get("CUDA_MODULE_LOADING", ""), os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")]
`;
const RT = new URL("../../runtime_py", import.meta.url).pathname;
async function local(mib: number) {
  const code = `${H}\nimport json\nprint(json.dumps(measure(${mib}, 3)))`;
  const o = await new Deno.Command("python3", {
    args: ["-c", code],
    env: { PYTHONPATH: RT },
    stderr: "inherit",
  }).output();
  return new TextDecoder().decode(o.stdout).trim();
}
async function remote(c: Client, mib: number) {
  const p = new Program();
  const m = p.upload({ kind: "module", source: H });
  p.return_({
    key: "r",
    value: p.run({ fn: p.getFunction({ module: m, name: "measure" }), args: [mib, 3] }),
  });
  const r = await c.execute(p, { timeoutSeconds: 300 });
  if (!r.completed) throw new Error(JSON.stringify(r.error));
  return JSON.stringify(r.get("r"));
}
for (const mib of [64, 4]) {
  console.log(`--- ${mib} MiB local fresh processes`);
  for (let i = 0; i < 5; i++) console.log("local", await local(mib));
  for (
    const [label, wpg, mrpw] of [["reused x8", 8, 0], ["reused x1", 1, 0], [
      "fresh x2",
      2,
      1,
    ]] as const
  ) {
    const s = await startServer(
      { device: "gpu", gpus: [0], workersPerGpu: wpg, maxRequestsPerWorker: mrpw } as never,
    );
    await using c = new Client(s.url);
    console.log(`--- ${mib} MiB server ${label}`);
    for (let i = 0; i < 5; i++) console.log(label, await remote(c, mib));
    await s.stop();
  }
  console.log(`--- ${mib} MiB local again`);
  for (let i = 0; i < 3; i++) console.log("local", await local(mib));
}

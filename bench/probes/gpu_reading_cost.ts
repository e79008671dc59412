/**
 * What the server's own GPU reading costs (server/workers/gpu_reading.ts): the time from asking
 * to having the report, for the receipt of a request whose worker died or was killed. Against the
 * stand-in NVML (runtime_py/tests/fixtures/nvml/fake_nvml.c, compiled here) unless `--real`
 * (the driver's NVML, a GPU host: pass the GPUs' UUIDs with `--ids`). Prints median, min and max
 * over `--runs` runs (default 9), in ms; on the reading's path the answer waits for it, under the
 * lease where the request still holds it.
 *
 *   deno run -A bench/probes/gpu_reading_cost.ts [--runs N] [--real --ids GPU-…,GPU-…]
 *
 * @module
 */
import { readGpuState } from "../../server/workers/gpu_reading.ts";
import { median } from "./_probe.ts";

const arg = (name: string) => {
  const at = Deno.args.indexOf(name);
  return at >= 0 ? Deno.args[at + 1] : undefined;
};
const runs = Number(arg("--runs") ?? 9);
const real = Deno.args.includes("--real");
const ids = (arg("--ids") ?? "sim-0").split(",");
const env = Deno.env.toObject();
if (!real) {
  const dir = await Deno.makeTempDir({ prefix: "kcoral-reading-cost-" });
  const source = new URL("../../runtime_py/tests/fixtures/nvml/fake_nvml.c", import.meta.url);
  const out = `${dir}/libfake_nvml.so`;
  const cc = await new Deno.Command(env.CC ?? "cc", {
    args: ["-shared", "-fPIC", "-O2", source.pathname, "-o", out, "-lpthread"],
  }).output();
  if (!cc.success) throw new Error("cannot compile the stand-in NVML");
  env.KCORAL_NVML_LIBRARY = out;
}
const command = {
  python: "python3",
  runtimePath: new URL("../../runtime_py", import.meta.url).pathname,
  env,
};
const ms: number[] = [];
for (let run = 0; run < runs; run++) {
  const started = performance.now();
  const reading = await readGpuState(ids, command);
  ms.push(performance.now() - started);
  if (reading.error !== undefined) throw new Error(reading.error);
}
const bare: number[] = [];
for (let run = 0; run < runs; run++) {
  const started = performance.now();
  await new Deno.Command("python3", { args: ["-c", "pass"] }).output();
  bare.push(performance.now() - started);
}
const row = (label: string, values: number[]) =>
  console.log(
    `${label.padEnd(34)} ${median(values).toFixed(0)} ms [${Math.min(...values).toFixed(0)}–${
      Math.max(...values).toFixed(0)
    }]`,
  );
row(`reading of ${ids.length} GPU(s)${real ? "" : " (stand-in)"}`, ms);
row("python3 -c pass (the start alone)", bare);

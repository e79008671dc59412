/**
 * All benchmarks: `deno task bench [--mode cpu|sim|gpu] [--quick] [--sandbox bubblewrap]
 * [--only codec|server|router|fidelity]`.
 * Prints Markdown tables (median, min, max, the upstream anchor and our target). Speed targets
 * are checked here, never by timed assertions in tests.
 *
 * Modes: `gpu` measures GPU 0 for real (and adds the kernel-time fidelity table); `sim` runs the
 * same server benchmarks with simulated GPUs (torch CPU tensors); `cpu` a CPU server. Default:
 * `gpu` when nvidia-smi sees a GPU, else `sim`.
 */
import { runCodecBench } from "./codec_bench.ts";
import { runFidelityBench } from "./fidelity_bench.ts";
import { runRouterBench } from "./router_bench.ts";
import { runServerBench, type ServerBenchOptions } from "./server_bench.ts";
import { table } from "./_stats.ts";

const arg = (name: string) => {
  const i = Deno.args.indexOf(name);
  return i >= 0 ? Deno.args[i + 1] : undefined;
};
const quick = Deno.args.includes("--quick");
const mode = (arg("--mode") ?? (await _gpuVisible() ? "gpu" : "sim")) as ServerBenchOptions["mode"];
const sandbox = (arg("--sandbox") ?? "none") as "none" | "bubblewrap";
const only = arg("--only");

console.log(
  `# KCoral benchmarks (${mode}${quick ? ", quick" : ""}) — ${new Date().toISOString()}\n`,
);
if (!only || only === "codec") {
  console.log("## Protocol codec (256 MiB body)\n");
  console.log(table(await runCodecBench({ mib: quick ? 64 : 256, iterations: quick ? 3 : 5 })));
  console.log();
}
if (!only || only === "server") {
  console.log(`## Server, end to end (${mode}, sandbox ${sandbox})\n`);
  const transport = (arg("--transport") ?? "auto") as "auto" | "fetch";
  console.log(table(await runServerBench({ mode, quick, sandbox, transport })));
  console.log();
}
if (!only || only === "router") {
  console.log(`## Router: one node (${mode}) through \`kcoral router\` vs direct\n`);
  console.log(table(await runRouterBench({ mode, quick })));
  console.log();
}
if (mode === "gpu" && (!only || only === "fidelity")) {
  console.log("## Kernel-time fidelity (CUDA events, 100 warmup + 1000 timed per round)\n");
  console.log(table(await runFidelityBench(quick)));
  console.log();
}

async function _gpuVisible(): Promise<boolean> {
  try {
    const out = await new Deno.Command("nvidia-smi", {
      args: ["-L"],
      stdout: "piped",
      stderr: "null",
    })
      .output();
    return out.success && new TextDecoder().decode(out.stdout).includes("GPU 0");
  } catch {
    return false;
  }
}

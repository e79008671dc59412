/**
 * The `benchmark_kernel` tool: compile a CUDA source for the server's target and time one
 * entry point. Two requests, as in docs/remote-compilation.md: the compile (a `cpu_only`
 * `compile_cuda`, on `compile_url` when given, e.g. a CPU server, else on the server itself
 * with its GPU lease released), then the timing on the server (`benchmark`: each call's GPU
 * activity span on every stream, cold L2 before every call). Returns median/mean/min/max in
 * milliseconds with the median's 95 % interval, the trust flags (`activities_stable`,
 * `escaped_work`, throttled calls, persisting-L2 carve-outs), the GPU-state receipt and the exact
 * settings used: arch, nvcc command, flags, arguments, warmup, repeat, L2 flush, device.
 *
 * @module
 */
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { z } from "zod";
import { type BenchmarkResult, benchmarkResult, Client } from "../../../client/mod.ts";
import { fetchHealth } from "../../health.ts";
import { type CallContext, remoteFailure, runCall, type ToolExtra, ToolFailure } from "../call.ts";
import {
  compileProgram,
  KERNEL_NAME,
  LIBRARY_KEY,
  nvccCommand,
  STATS_KEY,
  timingProgram,
} from "../kernel_harness.ts";
import { timingsOf, timingsSchema } from "../results.ts";
import type { McpSettings } from "../settings.ts";
import { HEALTH_TIMEOUT_MS } from "./health.ts";

const _DTYPES = [
  "float16",
  "bfloat16",
  "float32",
  "float64",
  "int8",
  "int16",
  "int32",
  "int64",
  "uint8",
  "bool",
] as const;

const _argSchema = z.union([
  z.object({
    tensor: z.object({
      dtype: z.enum(_DTYPES),
      shape: z.array(z.number().int().nonnegative()),
      init: z.enum(["rand", "randn", "zeros", "ones", "full", "arange", "empty"]).default("rand"),
      value: z.number().optional().describe("the fill value of init full"),
      seed: z.number().int().optional().describe(
        "generator seed of rand/randn (default: the index)",
      ),
    }).strict(),
  }).strict().describe("a CUDA tensor, passed as DLTensor*"),
  z.object({ int: z.number().int() }).strict().describe("passed as int64_t"),
  z.object({ float: z.number() }).strict().describe("passed as double"),
  z.object({ string: z.string() }).strict().describe("passed as const char*"),
]);

/** The input of `benchmark_kernel`. */
export const benchmarkKernelInput = {
  source: z.string().optional().describe("the CUDA source (compiled as kernel.cu)"),
  sources: z.record(z.string(), z.string()).optional().describe(
    "several files {name: text}: .cu/.c/.cc/.cpp/.cxx are compiled, others (headers) written beside",
  ),
  entry: z.string().min(1).describe(
    'the exported entry point: extern "C" int ENTRY(...), plain C ABI (DLTensor* for tensors, ' +
      "int64_t, double, const char*), returning 0 on success",
  ),
  args: z.array(_argSchema).default([]).describe(
    "the entry point's arguments in order, created on the GPU before timing",
  ),
  arch: z.string().optional().describe(
    "GPU arch to compile for (default: the server's target.arch)",
  ),
  flags: z.array(z.string()).default([]).describe('extra nvcc flags, e.g. ["-lineinfo"]'),
  warmup: z.number().int().min(0).default(25).describe("untimed calls first"),
  repeat: z.number().int().min(1).default(100).describe("timed calls"),
  flush_l2: z.boolean().default(true).describe(
    "reset persisting L2 and overwrite twice the L2 size before every call",
  ),
  adaptive: z.boolean().default(false).describe(
    "time rounds of `repeat` calls until the median's 95 % CI half-width is at most " +
      "target_rel_ci of it, or budget_s has passed",
  ),
  target_rel_ci: z.number().positive().default(0.005).describe(
    "adaptive: the target relative half-width of the median's 95 % CI",
  ),
  budget_s: z.number().positive().default(10).describe("adaptive: the time budget in seconds"),
  discard_throttled: z.boolean().default(false).describe(
    "leave calls that overlapped a power/thermal throttle reading out of the statistics",
  ),
  compile_url: z.string().optional().describe(
    "a KCoral server to compile on (e.g. a CPU server with nvcc); default: kcoral mcp --compile-url, else the server itself",
  ),
  timeout_seconds: z.number().int().positive().default(300).describe(
    "deadline of each of the two requests, in seconds",
  ),
};

/** The structured result of `benchmark_kernel`. */
export const benchmarkKernelOutput = {
  entry: z.string(),
  device: z.string().describe("the GPU that ran it"),
  latency_ms: z.object({
    median: z.number(),
    mean: z.number(),
    min: z.number(),
    max: z.number(),
    ci95: z.tuple([z.number(), z.number()]).nullable().describe(
      "the median's 95 % confidence interval (null below 6 calls)",
    ),
    ci95_rel_half_width: z.number().nullable().describe("half the interval over the median"),
    samples: z.number().int().describe("calls the statistics are over"),
  }).describe("per-call time of the GPU work each call launched, in milliseconds"),
  trust: z.object({
    timing: z.string().describe(
      "cupti_activity (GPU spans on every stream) or cuda_events_device_sync (no CUPTI)",
    ),
    activities_stable: z.boolean().nullable().describe(
      "every timed call launched the same GPU work (false: caching, skipping, alternating)",
    ),
    escaped_work: z.boolean().nullable().describe(
      "GPU work ran outside every call's window (left behind by a thread or callback)",
    ),
    calls_without_activity: z.number().int().nullable(),
    throttled_calls: z.number().int().describe("calls that overlapped a throttle reading"),
    discarded_calls: z.number().int(),
    persisting_l2_calls: z.number().int().nullable().describe(
      "after how many calls a persisting-L2 carve-out was found (undone before every call)",
    ),
    kernels: z.array(z.string()).describe("kernels the first timed call launched"),
    adaptive: z.object({
      target_rel_ci: z.number(),
      budget_s: z.number(),
      reached: z.boolean(),
      rounds: z.number().int(),
    }).nullable(),
  }).describe("what tells an honest timing from one that was gamed or disturbed"),
  receipt: z.object({
    gpu: z.record(z.string(), z.unknown()).describe("name, uuid, driver, clocks' limits"),
    versions: z.record(z.string(), z.unknown()).describe("torch, cuda_runtime, cupti, python"),
    clocks: z.record(z.string(), z.unknown()).nullable().describe(
      "SM/memory clocks, temperature, power (min/median/max), reasons seen, throttled samples",
    ),
    nvml_error: z.string().nullable(),
    timing_fallback_reason: z.string().nullable(),
    measured_at: z.string(),
  }).describe("the GPU's identity and state while the calls ran"),
  settings: z.object({
    arch: z.string(),
    nvcc_command: z.string(),
    flags: z.array(z.string()),
    warmup: z.number().int(),
    repeat: z.number().int(),
    flush_l2: z.boolean(),
    args: z.array(z.unknown()).describe("the argument specs, defaults filled in"),
    timing: z.string().describe("how the latency is measured"),
    compiled_on: z.string(),
    timed_on: z.string(),
  }),
  library_bytes: z.number().int().describe("size of the compiled shared library"),
  compiler_output: z.string().describe("nvcc's warnings, if any"),
  compile_timings: timingsSchema,
  timing_timings: timingsSchema,
};

type _Input = z.infer<z.ZodObject<typeof benchmarkKernelInput>>;

/**
 * The sources of a call: one of `source` or `sources`, and the compiled units' names.
 *
 * @throws {ToolFailure} kind `invalid_input` when neither or both are given.
 *
 * @example
 * ```ts
 * import { kernelSources } from "./benchmark_kernel.ts";
 *
 * const { units } = kernelSources({ sources: { "k.cu": "", "k.cuh": "" } });
 * if (units.join() !== "k.cu") throw new Error();
 * ```
 */
export function kernelSources(
  input: { source?: string; sources?: Record<string, string> },
): { sources: string | Record<string, string>; units: string[] } {
  if ((input.source === undefined) === (input.sources === undefined)) {
    throw new ToolFailure("invalid_input", "give exactly one of source (one .cu text) or sources");
  }
  if (input.source !== undefined) return { sources: input.source, units: [`${KERNEL_NAME}.cu`] };
  const units = Object.keys(input.sources!).filter((name) => /\.(cu|c|cc|cpp|cxx)$/.test(name));
  if (units.length === 0) {
    throw new ToolFailure(
      "invalid_input",
      "sources has no file to compile (.cu, .c, .cc, .cpp, .cxx)",
    );
  }
  return { sources: input.sources!, units };
}

/**
 * Register `benchmark_kernel` on `server`.
 *
 * @example
 * ```ts ignore
 * registerBenchmarkKernel(server, settings);
 * ```
 */
export function registerBenchmarkKernel(server: McpServer, settings: McpSettings): void {
  server.registerTool(
    "benchmark_kernel",
    {
      title: "Compile and time a CUDA kernel",
      description: "Compile a CUDA source with nvcc for the server's GPU (target.arch) and time " +
        'one exported entry point (extern "C" int ENTRY(DLTensor*, ..., int64_t, double, const ' +
        "char*), 0 on success) by the GPU activity each call launched on any stream, with a cold " +
        "L2 before every call. Arguments are created on the GPU from specs. Returns median/mean/" +
        "min/max latency in ms with the median's 95 % CI, trust flags (activities_stable, " +
        "escaped_work, throttled calls), the GPU-state receipt (clocks, temperature, power) and " +
        "the exact settings used. Needs a GPU server; compiling may happen on a CPU server " +
        "(compile_url).",
      inputSchema: benchmarkKernelInput,
      outputSchema: benchmarkKernelOutput,
      annotations: { openWorldHint: true },
    },
    (input: z.infer<z.ZodObject<typeof benchmarkKernelInput>>, extra: ToolExtra) =>
      runCall("benchmark_kernel", extra, (call) => _benchmark(input, settings, call), settings.log),
  );
}

async function _benchmark(input: _Input, settings: McpSettings, call: CallContext) {
  const { sources, units } = kernelSources(input);
  const compileUrl = input.compile_url ?? settings.compileUrl ?? settings.url;
  let arch = input.arch;
  if (arch === undefined) {
    call.progress.phase(`reading the compilation target of ${settings.url}`);
    let target: Record<string, string>;
    try {
      target = (await fetchHealth(settings.url, HEALTH_TIMEOUT_MS)).body.target;
    } catch (error) {
      throw new ToolFailure("unreachable", (error as Error).message);
    }
    arch = target.arch;
    if (arch === undefined) {
      throw new ToolFailure(
        "unavailable",
        `${settings.url} reports no compilation target: it has no GPU to time on (a CPU ` +
          "server, or a Router with no GPU node); point kcoral mcp --url at a GPU server",
      );
    }
  }

  call.progress.phase(`compiling for ${arch} on ${compileUrl}`);
  let compiler: Client;
  try {
    compiler = new Client(compileUrl, settings.client);
  } catch (error) {
    throw new ToolFailure("invalid_input", `compile_url: ${(error as Error).message}`);
  }
  let compiled;
  try {
    compiled = await compiler.execute(compileProgram(sources, arch, input.flags), {
      timeoutSeconds: input.timeout_seconds,
      signal: call.signal,
      onProgress: (p) => call.progress.transfer(p),
    });
  } finally {
    compiler.close();
  }
  if (!compiled.completed) throw remoteFailure(compiled, `compiling for ${arch}: `);
  const library = compiled.get(LIBRARY_KEY);
  if (!(library instanceof Uint8Array)) {
    throw new ToolFailure("protocol", "the compile request returned no library bytes");
  }

  call.progress.phase(`timing ${input.entry} on ${settings.url}`);
  const timing = {
    warmup: input.warmup,
    repeat: input.repeat,
    flushL2: input.flush_l2,
    adaptive: input.adaptive,
    targetRelCi: input.target_rel_ci,
    budgetS: input.budget_s,
    discardThrottled: input.discard_throttled,
  };
  await using client = new Client(settings.url, settings.client);
  const timed = await client.execute(timingProgram(library, input.entry, input.args, timing), {
    timeoutSeconds: input.timeout_seconds,
    signal: call.signal,
    onProgress: (p) => call.progress.transfer(p),
  });
  if (!timed.completed) {
    throw remoteFailure(
      timed,
      `compiled for ${arch} (${library.length} bytes), then timing ${input.entry}: `,
    );
  }
  let stats: BenchmarkResult;
  try {
    stats = benchmarkResult(timed.get(STATS_KEY));
  } catch (error) {
    throw new ToolFailure("protocol", (error as Error).message);
  }
  return {
    entry: input.entry,
    device: String(stats.device ?? "?"),
    latency_ms: {
      median: stats.latency_ms_median,
      mean: stats.latency_ms_mean,
      min: stats.latency_ms_min,
      max: stats.latency_ms_max,
      ci95: stats.ci95_ms,
      ci95_rel_half_width: stats.ci95_rel_half_width,
      samples: stats.samples,
    },
    trust: {
      timing: stats.timing,
      activities_stable: stats.activities_stable,
      escaped_work: stats.escaped_work,
      calls_without_activity: stats.calls_without_activity,
      throttled_calls: stats.throttled_calls,
      discarded_calls: stats.discarded_calls,
      persisting_l2_calls: stats.persisting_l2_calls,
      kernels: stats.kernels,
      adaptive: stats.adaptive,
    },
    receipt: {
      gpu: stats.receipt.gpu,
      versions: stats.receipt.versions,
      clocks: stats.receipt.clocks as Record<string, unknown> | null,
      nvml_error: stats.receipt.nvml_error,
      timing_fallback_reason: stats.receipt.timing_fallback_reason,
      measured_at: stats.receipt.measured_at,
    },
    settings: {
      arch,
      nvcc_command: nvccCommand(arch, input.flags, units),
      flags: input.flags,
      warmup: input.warmup,
      repeat: input.repeat,
      flush_l2: input.flush_l2,
      args: input.args,
      timing: "kcoral_runtime.builtins.benchmark: each call isolated by device synchronizes and " +
        "timed from the first start to the last end of the kernels, copies and sets it launched " +
        `on any stream (CUPTI activity records)${
          input.flush_l2
            ? ", persisting L2 reset and 2x the L2 (>= 64 MiB) overwritten before every call " +
              "outside the timed span"
            : ""
        }${input.adaptive ? `, adaptive to a ${input.target_rel_ci} relative CI half-width` : ""}`,
      compiled_on: compileUrl,
      timed_on: settings.url,
    },
    library_bytes: library.length,
    compiler_output: compiled.stderr,
    compile_timings: timingsOf(compiled),
    timing_timings: timingsOf(timed),
  };
}

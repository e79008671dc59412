/**
 * The two programs of `benchmark_kernel`, built the way docs/remote-compilation.md describes:
 *
 * 1. compile: a `cpu_only` function calls `kcoral_runtime.builtins.compile_cuda(sources, arch,
 *    flags, name)` and returns the shared library (on a CPU server, or on the GPU server with the
 *    GPU lease released);
 * 2. time: upload the library, bind the entry point (plain C ABI, docs/c-abi.md), create its
 *    arguments on the GPU from their specs and time it with `kcoral_runtime.builtins.benchmark`
 *    (CUDA events, L2 flushed before every call).
 *
 * @module
 */
import { Program } from "../../client/mod.ts";

/** Return key of the compiled library. */
export const LIBRARY_KEY = "library";
/** Return key of the latency statistics. */
export const STATS_KEY = "stats";
/** Base name of the compiled source (`kernel.cu`) when a single source is given. */
export const KERNEL_NAME = "kernel";

/** Python of the compile request. */
export const COMPILE_MODULE = `from kcoral_runtime.builtins import compile_cuda


def build(sources, arch, flags, name):
    return compile_cuda(sources, arch=arch, flags=flags, name=name)
`;

/**
 * Python of the timing request: \`make_args(specs)\` creates the arguments on the current CUDA
 * device (tensors from {dtype, shape, init, value, seed}; ints, floats, strings as they are),
 * \`time_it\` calls \`benchmark\` and adds the device name.
 */
export const TIME_MODULE = `from kcoral_runtime.builtins import benchmark
from kcoral_runtime.errors import ExecutionError

_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _torch():
    try:
        import torch
    except ImportError:
        raise ExecutionError("unavailable", "benchmark requires a CUDA device") from None
    if not torch.cuda.is_available():
        raise ExecutionError("unavailable", "benchmark requires a CUDA device")
    return torch


def _tensor(torch, index, spec):
    dtype = getattr(torch, spec["dtype"])
    shape = tuple(spec["shape"])
    init = spec.get("init", "rand")
    device = torch.device("cuda", torch.cuda.current_device())
    generator = torch.Generator(device=device)
    generator.manual_seed(int(spec.get("seed", index)))
    if init in ("rand", "randn") and spec["dtype"] not in _FLOATS:
        if init == "randn":
            raise ExecutionError("runtime", f"argument {index}: init randn needs a float dtype")
        if spec["dtype"] == "bool":
            return torch.randint(0, 2, shape, generator=generator, device=device).to(dtype)
        return torch.randint(0, 100, shape, generator=generator, device=device, dtype=dtype)
    if init == "rand":
        return torch.rand(shape, generator=generator, device=device, dtype=dtype)
    if init == "randn":
        return torch.randn(shape, generator=generator, device=device, dtype=dtype)
    if init == "zeros":
        return torch.zeros(shape, device=device, dtype=dtype)
    if init == "ones":
        return torch.ones(shape, device=device, dtype=dtype)
    if init == "empty":
        return torch.empty(shape, device=device, dtype=dtype)
    if init == "full":
        return torch.full(shape, spec.get("value", 0), device=device, dtype=dtype)
    if init == "arange":
        count = 1
        for size in shape:
            count *= size
        return torch.arange(count, device=device).to(dtype).reshape(shape)
    raise ExecutionError("runtime", f"argument {index}: unknown init {init!r}")


def make_args(specs):
    torch = _torch()
    values = []
    for index, spec in enumerate(specs):
        if "tensor" in spec:
            values.append(_tensor(torch, index, spec["tensor"]))
        elif "int" in spec:
            values.append(int(spec["int"]))
        elif "float" in spec:
            values.append(float(spec["float"]))
        else:
            values.append(str(spec["string"]))
    torch.cuda.synchronize()
    return values


def time_it(fn, values, warmup, repeat, flush_l2, adaptive=False, target_rel_ci=0.005,
            budget_s=10.0, discard_throttled=False):
    torch = _torch()
    stats = benchmark(fn, *values, warmup=warmup, repeat=repeat, flush_l2=flush_l2,
                      adaptive=adaptive, target_rel_ci=target_rel_ci, budget_s=budget_s,
                      discard_throttled=discard_throttled)
    stats["device"] = torch.cuda.get_device_name(torch.cuda.current_device())
    return stats
`;

/**
 * The compile program: `build(sources, arch, flags, name)` as a `cpu_only` function, its
 * library returned under {@linkcode LIBRARY_KEY}.
 *
 * @example
 * ```ts
 * import { compileProgram } from "./kernel_harness.ts";
 *
 * const program = compileProgram("extern \"C\" int f() { return 0; }", "sm_90a", ["-lineinfo"]);
 * const run = program.instructions.find((i) => i.op === "run");
 * if (JSON.stringify(run?.args) !== '["extern \\"C\\" int f() { return 0; }","sm_90a",["-lineinfo"],"kernel"]') {
 *   throw new Error(JSON.stringify(run?.args));
 * }
 * ```
 */
export function compileProgram(
  sources: string | Record<string, string>,
  arch: string,
  flags: readonly string[],
): Program {
  const program = new Program();
  const module = program.upload({ kind: "module", source: COMPILE_MODULE, id: "compiler" });
  const build = program.getFunction({ module, name: "build", cpuOnly: true, id: "build" });
  const library = program.run({
    fn: build,
    args: [typeof sources === "string" ? sources : new Map(Object.entries(sources)), arch, [
      ...flags,
    ], KERNEL_NAME],
    id: "compile",
  });
  program.return_({ key: LIBRARY_KEY, value: library });
  return program;
}

/** How to time the entry point. */
export interface TimingSettings {
  /** Untimed calls first. */
  warmup: number;
  /** Timed calls. */
  repeat: number;
  /** Reset persisting L2 and overwrite a buffer of twice the L2 size before every call. */
  flushL2: boolean;
  /** Time rounds of `repeat` calls until the median's 95 % CI half-width is at most
   * `targetRelCi` of it or `budgetS` seconds have passed (default false: exactly `repeat`). */
  adaptive?: boolean;
  /** The adaptive mode's target relative half-width (default 0.005). */
  targetRelCi?: number;
  /** The adaptive mode's time budget in seconds (default 10). */
  budgetS?: number;
  /** Leave calls that overlapped a power/thermal throttle reading out of the statistics. */
  discardThrottled?: boolean;
}

/**
 * The timing program: upload `library`, bind `entry`, make the arguments from `specs`, time
 * with `benchmark`; the statistics come back under {@linkcode STATS_KEY}.
 *
 * @example
 * ```ts
 * import { timingProgram } from "./kernel_harness.ts";
 *
 * const program = timingProgram(new Uint8Array([0x7f, 0x45, 0x4c, 0x46]), "add_one",
 *   [{ tensor: { dtype: "float32", shape: [1024] } }], { warmup: 5, repeat: 20, flushL2: true });
 * const ids = program.instructions.map((i) => i.id ?? i.key);
 * if (ids.join(",") !== "library,entry,harness,make_args,time_it,args,time,stats") throw new Error(ids.join(","));
 * ```
 */
export function timingProgram(
  library: Uint8Array,
  entry: string,
  specs: readonly unknown[],
  settings: TimingSettings,
): Program {
  const program = new Program();
  const lib = program.upload({ kind: "library", value: library, id: "library" });
  const fn = program.getFunction({ module: lib, name: entry, id: "entry" });
  const harness = program.upload({ kind: "module", source: TIME_MODULE, id: "harness" });
  const makeArgs = program.getFunction({ module: harness, name: "make_args", id: "make_args" });
  const timeIt = program.getFunction({ module: harness, name: "time_it", id: "time_it" });
  const values = program.run({ fn: makeArgs, args: [[...specs]], id: "args" });
  const stats = program.run({
    fn: timeIt,
    args: [
      fn,
      values,
      settings.warmup,
      settings.repeat,
      settings.flushL2,
      settings.adaptive ?? false,
      settings.targetRelCi ?? 0.005,
      settings.budgetS ?? 10,
      settings.discardThrottled ?? false,
    ],
    id: "time",
  });
  program.return_({ key: STATS_KEY, value: stats });
  return program;
}

/**
 * The nvcc command `compile_cuda` runs (in its private directory), for the result's settings.
 *
 * @example
 * ```ts
 * import { nvccCommand } from "./kernel_harness.ts";
 *
 * const command = nvccCommand("sm_90a", ["-lineinfo"], ["kernel.cu"]);
 * if (command !== "nvcc -shared -Xcompiler -fPIC -O3 -arch=sm_90a -lineinfo kernel.cu -o lib.so") {
 *   throw new Error(command);
 * }
 * ```
 */
export function nvccCommand(
  arch: string,
  flags: readonly string[],
  units: readonly string[],
): string {
  return [
    "nvcc",
    "-shared",
    "-Xcompiler",
    "-fPIC",
    "-O3",
    `-arch=${arch}`,
    ...flags,
    ...units,
    "-o",
    "lib.so",
  ]
    .join(" ");
}

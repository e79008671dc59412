/**
 * Remote compilation: compile a CUDA kernel on a CPU server, run and time it on a GPU server.
 *
 * 1. Read the GPU server's compilation target (`/health` `target.arch`, e.g. `sm_90a`).
 * 2. On the CPU server (`kcoral server --device cpu`, which has nvcc but no GPU), run a
 *    `cpu_only` function that calls `kcoral_runtime.builtins.compile_cuda` for that arch and
 *    returns the shared library's bytes.
 * 3. On the GPU server, upload those bytes as a `library`, bind `add_one` (plain C ABI:
 *    `extern "C" int add_one(DLTensor* x, DLTensor* y)`, see docs/c-abi.md), run it on 1M
 *    float32 values created on the GPU, check `y == x + 1`, and time it with
 *    `kcoral_runtime.builtins.benchmark` (CUDA events, L2 flushed between calls).
 *
 * ```sh
 * # two running servers
 * deno run -A examples/remote_compilation.ts --cpu http://cpu-box:8000 --gpu http://gpu-box:8000
 * # or KCORAL_CPU_URL / KCORAL_GPU_URL in the environment
 * # or both servers started here (this machine needs nvcc and a GPU)
 * deno run -A examples/remote_compilation.ts --local
 * ```
 *
 * docs/remote-compilation.md walks through it.
 *
 * @module
 */
import { parseArgs } from "node:util";
import {
  Client,
  createApp,
  Program,
  RemoteExecutionError,
  type ResultValue,
  type RunningServer,
  serve,
} from "../mod.ts";

/**
 * `add_one.cu`: `y = x + 1` for contiguous float32 CUDA tensors, exported with the plain C ABI
 * (`int add_one(DLTensor* x, DLTensor* y)`; 0 is success, otherwise `kcoral_last_error()`
 * says why).
 */
export const ADD_ONE_CU: string =
  `// add_one.cu: y = x + 1 for contiguous float32 CUDA tensors (KCoral plain C ABI).
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

// DLPack v1 types, layout-identical to dlpack.h.
enum { kDLCPU = 1, kDLCUDA = 2 };
enum { kDLFloat = 2 };
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

static char g_error[512];

extern "C" const char* kcoral_last_error(void) { return g_error; }

#define FAIL(...) (snprintf(g_error, sizeof g_error, __VA_ARGS__), 1)

static int check_tensor(const DLTensor* t, const char* what) {
  if (t == nullptr) return FAIL("add_one: %s is NULL (pass a tensor)", what);
  if (t->device.device_type != kDLCUDA)
    return FAIL("add_one: %s must be a CUDA tensor (device_type %d)", what, t->device.device_type);
  if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1)
    return FAIL("add_one: %s must be float32 (code %d, bits %d)", what, t->dtype.code, t->dtype.bits);
  int64_t expected = 1;
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->strides[i] != expected)
      return FAIL("add_one: %s must be contiguous", what);
    expected *= t->shape[i];
  }
  return 0;
}

__global__ void add_one_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
    y[i] = x[i] + 1.0f;
}

extern "C" int add_one(DLTensor* x, DLTensor* y) {
  g_error[0] = 0;
  if (check_tensor(x, "x") || check_tensor(y, "y")) return 1;
  if (x->ndim != y->ndim) return FAIL("add_one: x and y must have the same shape");
  int64_t n = 1;
  for (int32_t i = 0; i < x->ndim; i++) {
    if (x->shape[i] != y->shape[i]) return FAIL("add_one: x and y must have the same shape");
    n *= x->shape[i];
  }
  if (x->device.device_id != y->device.device_id)
    return FAIL("add_one: x and y must be on the same device");
  if (n == 0) return 0;

  int previous = 0;
  cudaError_t err = cudaGetDevice(&previous);
  if (err == cudaSuccess && previous != x->device.device_id) err = cudaSetDevice(x->device.device_id);
  if (err != cudaSuccess) return FAIL("add_one: cannot select device: %s", cudaGetErrorString(err));

  const float* xp = (const float*)((const char*)x->data + x->byte_offset);
  float* yp = (float*)((char*)y->data + y->byte_offset);
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;  // the grid-stride loop covers the rest
  add_one_kernel<<<(unsigned)blocks, threads>>>(xp, yp, n);  // legacy default stream
  err = cudaGetLastError();

  if (previous != x->device.device_id) cudaSetDevice(previous);
  if (err != cudaSuccess) return FAIL("add_one: launch failed: %s", cudaGetErrorString(err));
  return 0;
}
`;

/** Python run on the CPU server (inside a `cpu_only` run): nvcc through `compile_cuda`. */
export const COMPILE_MODULE: string = [
  "from kcoral_runtime.builtins import compile_cuda",
  "",
  "def build(source, arch):",
  "    return compile_cuda(source, arch=arch, name='add_one')",
  "",
].join("\n");

/** Python run on the GPU server: makes the data on the GPU, checks, times with CUDA events. */
export const GPU_MODULE: string = [
  "import torch",
  "from kcoral_runtime.builtins import benchmark",
  "",
  "def make_input(n):",
  "    generator = torch.Generator(device='cuda')",
  "    generator.manual_seed(7)",
  "    return torch.rand(n, device='cuda', generator=generator)",
  "",
  "def make_output(x):",
  "    return torch.full_like(x, float('nan'))",
  "",
  "def check(x, y):",
  "    expected = x + 1",
  "    return {",
  "        'n': x.numel(),",
  "        'device': str(y.device),",
  "        'equal': bool(torch.equal(y, expected)),",
  "        'max_abs_error': (y - expected).abs().max().item(),",
  "        'head': y[:4].tolist(),",
  "    }",
  "",
  "def time_it(fn, x, y, warmup, repeat):",
  "    return benchmark(fn, x, y, warmup=warmup, repeat=repeat)",
  "",
].join("\n");

/** What {@linkcode runRemoteCompilation} measured. */
export interface RemoteCompilationReport {
  /** The GPU server's `target.arch` the library was built for. */
  arch: string;
  /** Size of the compiled `.so`. */
  libraryBytes: number;
  /** Compile request: milliseconds on the CPU worker (nvcc included). */
  compileElapsedMs: number;
  /** Compile request: GPU lease held (0 on a CPU server). */
  compileLeaseHeldMs: number;
  /** Number of float32 elements. */
  n: number;
  /** `torch.equal(y, x + 1)` on the GPU. */
  correct: boolean;
  /** Largest `|y - (x + 1)|`. */
  maxAbsError: number;
  /** The first values of `y`. */
  head: number[];
  /** Device of the result, e.g. `cuda:0`. */
  device: string;
  /** GPU request: milliseconds on the worker. */
  gpuElapsedMs: number;
  /** GPU request: GPU lease held. */
  gpuLeaseHeldMs: number;
  /** `benchmark` latency of one `add_one` call, in milliseconds. */
  latency: { medianMs: number; meanMs: number; minMs: number; maxMs: number };
  /** Warm-up and timed calls. */
  warmup: number;
  /** Timed calls. */
  repeat: number;
  /** Effective bandwidth at the median latency (8 bytes per element), in GB/s. */
  bandwidthGBs: number;
}

/** Options of {@linkcode runRemoteCompilation}. */
export interface RemoteCompilationOptions {
  /** The CPU server (compiles). */
  cpuUrl: string;
  /** The GPU server (runs). */
  gpuUrl: string;
  /** Elements (default 1 << 20). */
  n?: number;
  /** Untimed calls before timing (default 25). */
  warmup?: number;
  /** Timed calls (default 100). */
  repeat?: number;
  /** CUDA source exporting `add_one` (default {@linkcode ADD_ONE_CU}). */
  source?: string;
  /** Progress lines (default: none). */
  log?: (line: string) => void;
}

/**
 * The CPU-server program: `build(source, arch)` as a `cpu_only` function, its bytes returned
 * under `library`.
 *
 * @example
 * ```ts
 * import { ADD_ONE_CU, compileProgram } from "./remote_compilation.ts";
 *
 * const program = compileProgram(ADD_ONE_CU, "sm_90a");
 * if (program.instructions.length !== 4) throw new Error();
 * ```
 */
export function compileProgram(source: string, arch: string): Program {
  const program = new Program();
  const module = program.upload({ kind: "module", source: COMPILE_MODULE, id: "compiler" });
  const build = program.getFunction({ module, name: "build", cpuOnly: true, id: "build" });
  const library = program.run({ fn: build, args: [source, arch], id: "library" });
  program.return_({ key: "library", value: library });
  return program;
}

/**
 * Compiles `source` for `arch` on the CPU server behind `client`; returns the `.so` bytes.
 *
 * @throws {RemoteExecutionError} when the compile program FAILED (e.g. kind `compile` with
 * nvcc's diagnostics, or `unavailable` when the server has no nvcc).
 */
export async function compileOnCpuServer(
  client: Client,
  source: string,
  arch: string,
): Promise<{ library: Uint8Array; elapsedMs: number; leaseHeldMs: number }> {
  const result = await client.execute(compileProgram(source, arch), { timeoutSeconds: 600 });
  if (!result.completed) throw new RemoteExecutionError(result);
  const library = result.get("library");
  if (!(library instanceof Uint8Array)) throw new TypeError("build did not return bytes");
  return { library, elapsedMs: result.elapsedMs, leaseHeldMs: result.leaseHeldMs };
}

/**
 * The GPU-server program: the library uploaded and `add_one` bound; data made on the GPU;
 * `add_one(x, y)` run as an instruction; `check` and `time_it` results returned.
 *
 * @example
 * ```ts
 * import { gpuProgram } from "./remote_compilation.ts";
 *
 * const program = gpuProgram(new Uint8Array([0x7f, 0x45, 0x4c, 0x46]), 1024, 5, 20);
 * if (!program.instructions.some((i) => i.op === "get_function")) throw new Error();
 * ```
 */
export function gpuProgram(
  library: Uint8Array,
  n: number,
  warmup: number,
  repeat: number,
): Program {
  const program = new Program();
  const lib = program.upload({ kind: "library", value: library, id: "lib" });
  const addOne = program.getFunction({ module: lib, name: "add_one", id: "add_one" });
  const module = program.upload({ kind: "module", source: GPU_MODULE, id: "harness" });
  const fn = (name: string) => program.getFunction({ module, name, id: name });
  const x = program.run({ fn: fn("make_input"), args: [n], id: "x" });
  const y = program.run({ fn: fn("make_output"), args: [x], id: "y" });
  program.run({ fn: addOne, args: [x, y], id: "launch" });
  program.return_({ key: "check", value: program.run({ fn: fn("check"), args: [x, y] }) });
  program.return_({
    key: "latency",
    value: program.run({ fn: fn("time_it"), args: [addOne, x, y, warmup, repeat] }),
  });
  return program;
}

function _field(value: ResultValue, key: string): ResultValue {
  if (!(value instanceof Map) || !value.has(key)) {
    throw new TypeError(`result has no field ${JSON.stringify(key)}`);
  }
  return value.get(key)!;
}

function _number(value: ResultValue, key: string): number {
  const field = _field(value, key);
  if (typeof field !== "number") throw new TypeError(`${key} is not a number`);
  return field;
}

/**
 * The whole flow: target from the GPU server, compile on the CPU server, run, check and time
 * on the GPU server.
 *
 * @throws {RemoteExecutionError} when either program FAILED.
 */
export async function runRemoteCompilation(
  options: RemoteCompilationOptions,
): Promise<RemoteCompilationReport> {
  const log = options.log ?? (() => {});
  const n = options.n ?? 1 << 20;
  const warmup = options.warmup ?? 25;
  const repeat = options.repeat ?? 100;
  await using cpu = new Client(options.cpuUrl);
  await using gpu = new Client(options.gpuUrl);

  const { arch } = await gpu.target();
  log(`GPU server ${options.gpuUrl}: target.arch ${arch}`);

  const compiled = await compileOnCpuServer(cpu, options.source ?? ADD_ONE_CU, arch);
  log(
    `CPU server ${options.cpuUrl}: compiled add_one for ${arch}, ${compiled.library.length} bytes` +
      ` in ${compiled.elapsedMs.toFixed(0)} ms`,
  );

  const result = await gpu.execute(gpuProgram(compiled.library, n, warmup, repeat), {
    timeoutSeconds: 300,
  });
  if (!result.completed) throw new RemoteExecutionError(result);
  const check = result.get("check");
  const latency = result.get("latency");
  const head = _field(check, "head");
  const medianMs = _number(latency, "latency_ms_median");
  const report: RemoteCompilationReport = {
    arch,
    libraryBytes: compiled.library.length,
    compileElapsedMs: compiled.elapsedMs,
    compileLeaseHeldMs: compiled.leaseHeldMs,
    n: _number(check, "n"),
    correct: _field(check, "equal") === true,
    maxAbsError: _number(check, "max_abs_error"),
    head: Array.isArray(head) ? head.map(Number) : [],
    device: String(_field(check, "device")),
    gpuElapsedMs: result.elapsedMs,
    gpuLeaseHeldMs: result.leaseHeldMs,
    latency: {
      medianMs,
      meanMs: _number(latency, "latency_ms_mean"),
      minMs: _number(latency, "latency_ms_min"),
      maxMs: _number(latency, "latency_ms_max"),
    },
    warmup: _number(latency, "warmup"),
    repeat: _number(latency, "repeat"),
    bandwidthGBs: (8 * n) / (medianMs * 1e6),
  };
  log(
    `GPU server: add_one on ${report.n} floats (${report.device}): ` +
      `${report.correct ? "y == x + 1" : `WRONG (max error ${report.maxAbsError})`}; ` +
      `median ${medianMs.toFixed(4)} ms (${report.bandwidthGBs.toFixed(0)} GB/s)`,
  );
  return report;
}

/** Two servers started in this process: one CPU server, one GPU server on GPU 0. */
export interface LocalServers {
  /** The CPU server (`--device cpu`). */
  cpu: RunningServer;
  /** The GPU server (`--device gpu --gpus 0`). */
  gpu: RunningServer;
  /** The isolation each runs with (`"none"` after a failed bubblewrap probe). */
  sandbox: { cpu: string; gpu: string };
  /** Stops both. */
  stop(): Promise<void>;
}

/**
 * Starts a CPU server and a GPU server on this machine (loopback, free ports). The machine
 * needs nvcc (for the CPU server's compile) and a CUDA GPU.
 */
export async function startLocalServers(
  options: { sandbox?: "bubblewrap" | "none"; gpu?: number } = {},
): Promise<LocalServers> {
  const common = {
    sandbox: options.sandbox ?? "bubblewrap",
    logDir: null,
    logConsole: false,
    diskCacheDir: null,
  } as const;
  const cpuApp = createApp({ ...common, device: "cpu", numWorkers: 1 });
  const gpuApp = createApp({
    ...common,
    device: "gpu",
    gpus: [options.gpu ?? 0],
    workersPerGpu: 2,
  });
  const quiet = { port: 0, handleSignals: false, log: () => {} };
  const cpu = await serve(cpuApp, quiet);
  let gpu: RunningServer;
  try {
    gpu = await serve(gpuApp, quiet);
  } catch (error) {
    await cpu.shutdown();
    throw error;
  }
  return {
    cpu,
    gpu,
    sandbox: { cpu: cpuApp.sandbox, gpu: gpuApp.sandbox },
    async stop() {
      await Promise.all([cpu.shutdown(), gpu.shutdown()]);
    },
  };
}

/** Command line: `--cpu URL --gpu URL` (or `$KCORAL_CPU_URL`/`$KCORAL_GPU_URL`), or `--local`. */
export async function main(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      cpu: { type: "string" },
      gpu: { type: "string" },
      local: { type: "boolean", default: false },
      sandbox: { type: "string", default: "bubblewrap" },
      n: { type: "string", default: String(1 << 20) },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) {
    console.log(
      "usage: remote_compilation.ts [--cpu URL --gpu URL | --local [--sandbox none]] [--n N]",
    );
    return 0;
  }
  const n = Number(values.n);
  if (!Number.isInteger(n) || n < 1) throw new Error(`--n must be a positive integer`);
  if (values.sandbox !== "bubblewrap" && values.sandbox !== "none") {
    throw new Error("--sandbox must be bubblewrap or none");
  }
  let local: LocalServers | null = null;
  let cpuUrl = values.cpu ?? Deno.env.get("KCORAL_CPU_URL");
  let gpuUrl = values.gpu ?? Deno.env.get("KCORAL_GPU_URL");
  if (values.local) {
    console.log("Starting a CPU server and a GPU server on this machine ...");
    local = await startLocalServers({ sandbox: values.sandbox });
    cpuUrl = local.cpu.url;
    gpuUrl = local.gpu.url;
    console.log(`CPU server ${cpuUrl}, GPU server ${gpuUrl} (sandbox ${local.sandbox.gpu})`);
  }
  if (!cpuUrl || !gpuUrl) {
    console.error("give --cpu URL and --gpu URL (or KCORAL_CPU_URL/KCORAL_GPU_URL), or --local");
    return 2;
  }
  try {
    const report = await runRemoteCompilation({ cpuUrl, gpuUrl, n, log: console.log });
    console.log(JSON.stringify(report, null, 2));
    return report.correct ? 0 : 1;
  } catch (error) {
    if (error instanceof RemoteExecutionError) {
      const info = error.result.error;
      console.error(`${error.message}\n${info?.traceback ?? ""}`);
      return 1;
    }
    throw error;
  } finally {
    await local?.stop();
  }
}

if (import.meta.main) Deno.exit(await main(Deno.args));

/**
 * Issue 23 on a real GPU (the H200): `kcoral mcp` driven by the MCP SDK's own client against a
 * GPU server it starts (`--device gpu --gpus 0 --sandbox none`) and a CPU server (compiles for
 * `benchmark_kernel`'s `compile_url`):
 *
 * - `health`: the GPU server's target arch;
 * - `benchmark_kernel`: `add_one` on 1M floats compiled on the GPU server itself, then on the CPU
 *   server, timed with CUDA events and an L2 flush (median/min/max and the settings printed);
 * - `profile` ncu: a torch script, report saved, per-kernel summary with a duration;
 * - `profile` compute-sanitizer: an out-of-bounds program built here with nvcc, exit 1 and an
 *   error count;
 * - `run_python`: torch sees the GPU.
 *
 * ```sh
 * deno run -A tests/gpu/mcp_gpu.ts [--gpu 0] [--expect-arch sm_90a]
 * ```
 *
 * Needs nvcc, ncu and compute-sanitizer on this machine's PATH (the worker's too). Prints one
 * PASS/FAIL line per check with its result as JSON, and `RESULT: PASS|FAIL`; exits 1 when a
 * check failed.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { freePort, KcoralProcess } from "../_router.ts";

const CLI = new URL("../../cli.ts", import.meta.url).pathname;

const ADD_ONE = `#include <cstdint>
#include <cuda_runtime.h>
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct { void* data; DLDevice device; int32_t ndim; DLDataType dtype; int64_t* shape;
  int64_t* strides; uint64_t byte_offset; } DLTensor;
__global__ void add_one_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
extern "C" int add_one(DLTensor* x, DLTensor* y, int64_t n) {
  add_one_kernel<<<(unsigned)((n + 255) / 256), 256>>>((const float*)x->data, (float*)y->data, n);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
`;

const OOB = `#include <cstdio>
#include <cuda_runtime.h>
__global__ void scale(const int* in, int* out, int limit) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < limit) out[i] = 2 * in[i];
}
int main() {
  int *in = nullptr, *out = nullptr;
  cudaMalloc(&in, 1000 * sizeof(int));
  cudaMalloc(&out, 1000 * sizeof(int));
  scale<<<4, 256>>>(in, out, 1024);  // 24 reads and writes past both allocations
  cudaDeviceSynchronize();
  std::printf("oob done\\n");
  return 0;
}
`;

const CAPTURE = `import torch
x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
y = x * 2.0 + 1.0
torch.cuda.synchronize()
print("launched kernels, checksum", float(y[:4].sum()))
`;

let failures = 0;

async function check(name: string, fn: () => Promise<unknown>): Promise<void> {
  const start = performance.now();
  try {
    const shown = await fn();
    console.log(`PASS  ${name}  (${((performance.now() - start) / 1000).toFixed(1)}s)`);
    console.log(JSON.stringify(shown, null, 2));
  } catch (error) {
    failures++;
    console.log(`FAIL  ${name}  (${((performance.now() - start) / 1000).toFixed(1)}s)`);
    console.log(error instanceof Error ? `${error.message}\n${error.stack ?? ""}` : String(error));
  }
}

function expect(condition: unknown, message: string): asserts condition {
  if (!condition) throw new Error(message);
}

async function startServer(args: string[]): Promise<{ url: string; process: KcoralProcess }> {
  const port = freePort();
  const process = new KcoralProcess([
    "server",
    ...args,
    "--port",
    String(port),
    "--log-dir",
    "",
    "--no-log-console",
  ]);
  const exited = process.status.then((status) => {
    throw new Error(
      `kcoral server ${args.join(" ")} exited (${status.code}):\n${process.lines.join("\n")}`,
    );
  });
  await Promise.race([process.waitForLine(/Application startup complete\./, 180_000), exited]);
  exited.catch(() => {});
  return { url: `http://127.0.0.1:${port}`, process };
}

async function tool(
  client: McpClient,
  name: string,
  args: Record<string, unknown>,
): Promise<Record<string, unknown>> {
  const messages: string[] = [];
  const result = await client.callTool({ name, arguments: args }, undefined, {
    timeout: 600_000,
    resetTimeoutOnProgress: true,
    onprogress: (p: { message?: string }) => messages.push(String(p.message)),
  }) as CallToolResult;
  if (result.isError) {
    throw new Error(`${name}: ${(result.content[0] as { text: string }).text}`);
  }
  const structured = result.structuredContent as Record<string, unknown>;
  // Every call but health starts a phase at once, and so reports progress.
  expect(name === "health" || messages.length > 0, `${name}: no progress notification`);
  return { ...structured, progress_messages: messages.length };
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    args: Deno.args,
    options: { gpu: { type: "string", default: "0" }, "expect-arch": { type: "string" } },
  });
  const work = await Deno.makeTempDir({ prefix: "kcoral-mcp-gpu-" });
  await Deno.mkdir(`${work}/exp`);
  await Deno.writeTextFile(`${work}/exp/capture.py`, CAPTURE);
  await Deno.writeTextFile(`${work}/oob.cu`, OOB);

  const gpu = await startServer(["--device", "gpu", "--gpus", values.gpu!, "--sandbox", "none"]);
  const cpu = await startServer(["--device", "cpu", "--num-workers", "1", "--sandbox", "none"]);
  console.log(`GPU server ${gpu.url}, CPU server ${cpu.url}`);
  const transport = new StdioClientTransport({
    command: Deno.execPath(),
    args: ["run", "-A", CLI, "mcp", "--url", gpu.url, "--files-dir", `${work}/saved`],
    env: Deno.env.toObject(),
    cwd: work,
    stderr: "inherit",
  });
  const client = new McpClient({ name: "kcoral-mcp-gpu", version: "1.0.0" });
  try {
    await client.connect(transport);
    let arch = "";
    await check("health: the GPU server's target", async () => {
      const health = await tool(client, "health", {});
      arch = String((health.target as Record<string, string>).arch ?? "");
      expect(/^sm_\d+[af]?$/.test(arch), `no target arch: ${JSON.stringify(health.target)}`);
      if (values["expect-arch"]) expect(arch === values["expect-arch"], `arch ${arch}`);
      return { target: health.target, versions: health.versions, gpu_count: health.gpu_count };
    });

    const n = 1 << 20;
    const kernel = {
      source: ADD_ONE,
      entry: "add_one",
      args: [
        { tensor: { dtype: "float32", shape: [n], init: "rand" } },
        { tensor: { dtype: "float32", shape: [n], init: "zeros" } },
        { int: n },
      ],
      warmup: 25,
      repeat: 100,
    };
    for (
      const [label, extra] of [["on the GPU server", {}], ["on the CPU server", {
        compile_url: cpu.url,
      }]] as const
    ) {
      await check(`benchmark_kernel: add_one on 1M floats, compiled ${label}`, async () => {
        const result = await tool(client, "benchmark_kernel", { ...kernel, ...extra });
        const latency = result.latency_ms as Record<string, number>;
        const settings = result.settings as Record<string, unknown>;
        expect(
          latency.min > 0 && latency.min <= latency.median && latency.median <= latency.max,
          "latency order",
        );
        expect(latency.median < 5, `median ${latency.median} ms for 8 MiB moved`);
        expect(settings.arch === arch, `compiled for ${settings.arch}`);
        expect(settings.flush_l2 === true && settings.repeat === 100, "settings");
        const trust = result.trust as Record<string, unknown>;
        const receipt = result.receipt as Record<string, Record<string, unknown> | null>;
        expect(trust.timing === "cupti_activity", `timing ${trust.timing}`);
        expect(trust.activities_stable === true && trust.escaped_work === false, "trust flags");
        expect(Array.isArray(latency.ci95), "a 95 % interval");
        expect(typeof receipt.gpu?.uuid === "string", "a receipt with the GPU's uuid");
        expect(receipt.clocks !== null, `clocks: ${receipt.nvml_error}`);
        const compiledOn = "compile_url" in extra ? cpu.url : gpu.url;
        expect(settings.compiled_on === compiledOn, `compiled on ${settings.compiled_on}`);
        const gbPerS = (8 * n) / (latency.median / 1000) / 1e9;
        return { ...result, effective_gb_per_s: Number(gbPerS.toFixed(1)) };
      });
    }

    await check("profile ncu: a torch script, report saved, kernels summarized", async () => {
      const result = await tool(client, "profile", {
        tool: "ncu",
        options: ["--set", "basic", "--launch-count", "1"],
        command: ["python", "exp/capture.py"],
        send: ["exp"],
        timeout_seconds: 600,
      });
      const report = result.report as Record<string, unknown> | null;
      expect(result.exit_code === 0, `exit ${result.exit_code}: ${result.stderr}`);
      expect(report?.saved_path && (report.size as number) > 0, "no report saved");
      const kernels = result.kernels as { metrics: Record<string, string> }[];
      expect(kernels.length === 1, `${kernels.length} kernels profiled`);
      expect("Duration" in kernels[0].metrics, `no Duration: ${JSON.stringify(kernels[0])}`);
      return { summary: result.summary, report, kernels, timings: result.timings };
    });

    await check(
      "profile compute-sanitizer: the out-of-bounds program exits 1 with errors",
      async () => {
        const build = await new Deno.Command("nvcc", {
          args: [`-arch=${arch}`, "-lineinfo", "-o", `${work}/oob`, `${work}/oob.cu`],
        }).output();
        expect(build.success, `nvcc: ${new TextDecoder().decode(build.stderr)}`);
        const result = await tool(client, "profile", {
          tool: "compute-sanitizer",
          options: ["--tool", "memcheck", "--error-exitcode", "1"],
          command: ["./oob"],
          send: ["oob"],
          timeout_seconds: 600,
        });
        expect(result.exit_code === 1, `exit ${result.exit_code}`);
        expect((result.errors as number) > 0, `errors ${result.errors}`);
        expect(/Invalid __global__ (read|write)/.test(String(result.summary)), "no finding");
        return { summary: result.summary, errors: result.errors, report: result.report };
      },
    );

    await check("run_python: torch on the GPU", async () => {
      const result = await tool(client, "run_python", {
        source: "import torch\nprint(torch.cuda.get_device_name(0))\n",
      });
      expect(result.exit_code === 0 && String(result.stdout).trim() !== "", String(result.stderr));
      return { stdout: result.stdout, timings: result.timings };
    });
  } finally {
    await client.close().catch(() => {});
    await Promise.all([gpu.process.stop(), cpu.process.stop()]);
    await Deno.remove(work, { recursive: true }).catch(() => {});
  }
  console.log(`RESULT: ${failures === 0 ? "PASS" : "FAIL"}`);
  return failures === 0 ? 0 : 1;
}

if (import.meta.main) Deno.exit(await main());

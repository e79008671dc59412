/**
 * `kcoral mcp` as an agent host runs it: a subprocess on stdio, driven by the MCP SDK's own
 * client, against a real CPU server (and one test through a Router and a node): every tool
 * listed with its schemas, each tool with good and bad input, a cancelled call, progress
 * notifications. The profilers are fake executables on the worker's PATH (as in
 * cli_run_test.ts); benchmark_kernel compiles with the real nvcc and must then fail with the
 * server's `unavailable` (a CPU server has no GPU to time on).
 */
import assert from "node:assert/strict";
import { Client as McpClient } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { startServer, type TestServer } from "./_server.ts";
import { freePort, startNode, startRouter, waitForCapacity, waitUntil } from "./_router.ts";

const CLI = new URL("../cli.ts", import.meta.url).pathname;
const TOOLS = [
  "health",
  "run_python",
  "run_program",
  "profile",
  "benchmark_kernel",
  "evaluate_kernel",
];

/** A `kcoral mcp` subprocess and an SDK client connected to it. */
interface Mcp {
  client: McpClient;
  stderr: string[];
  pid: number | null;
  filesDir: string;
  cwd: string;
  close(): Promise<void>;
}

async function startMcp(url: string, extra: string[] = []): Promise<Mcp> {
  const cwd = await Deno.makeTempDir({ prefix: "kcoral-mcp-test-" });
  const filesDir = `${cwd}/saved`;
  const transport = new StdioClientTransport({
    command: Deno.execPath(),
    args: ["run", "-A", CLI, "mcp", "--url", url, "--files-dir", filesDir, ...extra],
    env: { ...Deno.env.toObject(), NO_COLOR: "1" },
    cwd,
    stderr: "pipe",
  });
  const stderr: string[] = [];
  transport.stderr?.on("data", (chunk: Uint8Array) => {
    stderr.push(...new TextDecoder().decode(chunk).split("\n").filter((line) => line !== ""));
  });
  const client = new McpClient({ name: "kcoral-mcp-test", version: "1.0.0" });
  await client.connect(transport);
  return {
    client,
    stderr,
    pid: transport.pid,
    filesDir,
    cwd,
    async close() {
      await client.close();
      await Deno.remove(cwd, { recursive: true }).catch(() => {});
    },
  };
}

/** The request options this file passes (the SDK's `RequestOptions`, spelled out). */
interface CallOptions {
  signal?: AbortSignal;
  onprogress?: (progress: { progress: number; message?: string }) => void;
  timeout?: number;
}

/** A listed tool (the SDK's `Tool`, spelled out). */
interface ListedTool {
  name: string;
  description?: string;
  inputSchema: { type: string; properties?: Record<string, unknown>; required?: string[] };
  outputSchema?: { type: string; properties?: Record<string, unknown>; required?: string[] };
}

async function call(
  mcp: Mcp,
  name: string,
  args: Record<string, unknown>,
  options: CallOptions = {},
): Promise<CallToolResult> {
  return await mcp.client.callTool({ name, arguments: args }, undefined, {
    timeout: 120_000,
    ...options,
  }) as CallToolResult;
}

function errorText(result: CallToolResult): string {
  assert.equal(result.isError, true, `expected a tool error, got ${JSON.stringify(result)}`);
  const first = result.content[0];
  assert.equal(first.type, "text");
  return (first as { text: string }).text;
}

function structured(result: CallToolResult): Record<string, unknown> {
  assert.notEqual(result.isError, true, `unexpected tool error: ${JSON.stringify(result.content)}`);
  assert.ok(result.structuredContent, "no structured content");
  const text = (result.content[0] as { text: string }).text;
  assert.deepEqual(JSON.parse(text), result.structuredContent, "the text is not the JSON");
  return result.structuredContent as Record<string, unknown>;
}

function assertTimings(timings: unknown): void {
  const t = timings as Record<string, unknown>;
  for (const field of ["queue_ms", "elapsed_ms", "lease_wait_ms", "lease_held_ms"]) {
    assert.equal(typeof t[field], "number", `timings.${field}`);
  }
  assert.match(String(t.request_id), /\S/);
}

async function withServer(
  fn: (server: TestServer, mcp: Mcp) => Promise<void>,
  config: Parameters<typeof startServer>[0] = {},
): Promise<void> {
  const server = await startServer(config);
  const mcp = await startMcp(server.url);
  try {
    await fn(server, mcp);
  } finally {
    await mcp.close();
    await server.stop();
  }
}

Deno.test("kcoral mcp: tools/list gives every tool with input and output schemas", async () => {
  await withServer(async (_server, mcp) => {
    const tools = (await mcp.client.listTools()).tools as ListedTool[];
    assert.deepEqual(tools.map((tool) => tool.name), TOOLS);
    for (const tool of tools) {
      assert.equal(tool.inputSchema.type, "object", tool.name);
      assert.equal(tool.outputSchema?.type, "object", tool.name);
      assert.ok((tool.description ?? "").length > 40, tool.name);
    }
    const byName = new Map(tools.map((tool) => [tool.name, tool]));
    const properties = (name: string, which: "inputSchema" | "outputSchema") =>
      Object.keys(byName.get(name)![which]!.properties ?? {}).sort();
    assert.deepEqual(properties("run_python", "inputSchema"), [
      "args",
      "env",
      "fetch",
      "output_limit_bytes",
      "script",
      "send",
      "source",
      "timeout_seconds",
    ]);
    assert.deepEqual(byName.get("benchmark_kernel")!.inputSchema.required, ["entry"]);
    assert.deepEqual(byName.get("profile")!.inputSchema.required, ["tool", "command"]);
    assert.deepEqual(byName.get("run_program")!.inputSchema.required, ["instructions"]);
    for (const name of ["run_python", "run_program", "profile"]) {
      for (const field of ["stdout", "stderr", "stdout_truncated", "stderr_truncated", "timings"]) {
        assert.ok(properties(name, "outputSchema").includes(field), `${name}: ${field}`);
      }
    }
    for (const field of ["latency_ms", "trust", "receipt"]) {
      assert.ok(properties("benchmark_kernel", "outputSchema").includes(field), field);
    }
    for (const field of ["adaptive", "target_rel_ci", "budget_s", "discard_throttled"]) {
      assert.ok(properties("benchmark_kernel", "inputSchema").includes(field), field);
    }
    assert.ok(properties("health", "outputSchema").includes("target"));
  });
});

Deno.test("kcoral mcp: health of a server; an unreachable URL and an unknown tool are tool errors", async () => {
  await withServer(async (server, mcp) => {
    const health = structured(await call(mcp, "health", {}));
    assert.equal(health.url, server.url);
    assert.equal(health.kind, "server");
    assert.equal(health.status, "ok");
    assert.deepEqual(health.target, {});
    assert.equal(health.gpu_count, 0);
    assert.equal((health.load as Record<string, number>).request_capacity, 1);
    assert.equal(health.instance_id, server.app.health().instance_id);

    const unknown = errorText(await call(mcp, "no_such_tool", {}));
    assert.match(unknown, /Tool no_such_tool not found/);
  });
  const port = freePort();
  const down = await startMcp(`http://127.0.0.1:${port}`);
  try {
    const text = errorText(await call(down, "health", {}));
    assert.match(
      text,
      new RegExp(`^unreachable: cannot reach http://127.0.0.1:${port}/health: .*refused`),
    );
    // The process is still serving.
    assert.equal((await down.client.listTools()).tools.length, TOOLS.length);
  } finally {
    await down.close();
  }
});

Deno.test("kcoral mcp: run_python runs source and sent files, returns output, timings and files", async () => {
  await withServer(async (_server, mcp) => {
    await Deno.mkdir(`${mcp.cwd}/exp`);
    await Deno.writeTextFile(`${mcp.cwd}/exp/data.txt`, "sent data\n");
    const source = [
      "import os, sys",
      "print('args', sys.argv[1:], os.environ['MODE'])",
      "print(open('exp/data.txt').read().strip())",
      "print('to stderr', file=sys.stderr)",
      "os.makedirs('out', exist_ok=True)",
      "open('out/small.txt', 'w').write('small text\\n')",
      "open('out/big.bin', 'wb').write(bytes(range(256)) * 1024)",
      "sys.exit(3)",
    ].join("\n");
    const result = structured(
      await call(mcp, "run_python", {
        source,
        send: ["exp"],
        args: ["--n", "3"],
        env: { MODE: "debug" },
        fetch: ["out", "never.txt"],
        timeout_seconds: 60,
      }),
    );
    assert.equal(result.exit_code, 3);
    assert.equal(result.stdout, "args ['--n', '3'] debug\nsent data\n");
    assert.equal(result.stderr, "to stderr\n");
    assert.equal(result.stdout_truncated, false);
    assert.deepEqual(result.missing, ["never.txt"]);
    assertTimings(result.timings);
    const files = result.files as Record<string, unknown>[];
    assert.deepEqual(files.map((file) => file.path), ["out/big.bin", "out/small.txt"]);
    assert.deepEqual(files[1], { path: "out/small.txt", size: 11, text: "small text\n" });
    assert.equal(files[0].size, 262144);
    const saved = String(files[0].saved_path);
    assert.ok(saved.startsWith(`${await Deno.realPath(mcp.filesDir)}/run_python-`), saved);
    assert.ok(saved.endsWith("/out/big.bin"), saved);
    assert.equal((await Deno.readFile(saved)).length, 262144);
    assert.equal(result.files_directory, saved.slice(0, -"/out/big.bin".length));

    // A sent script with no source; output past the limit is truncated and flagged.
    await Deno.writeTextFile(`${mcp.cwd}/exp/loud.py`, "print('x' * 5000)\n");
    const loud = structured(
      await call(mcp, "run_python", {
        send: ["exp"],
        script: "exp/loud.py",
        output_limit_bytes: 100,
      }),
    );
    assert.equal(loud.exit_code, 0);
    assert.equal(loud.stdout_truncated, true);
    assert.equal(String(loud.stdout).length, 100);
    assert.equal(loud.files_directory, null);
  });
});

Deno.test("kcoral mcp: run_python bad input and remote failures are tool errors with a kind", async () => {
  await withServer(async (_server, mcp) => {
    const cases: [Record<string, unknown>, RegExp][] = [
      [{}, /^invalid_input: give source \(Python text\) or script \(a sent file\)$/],
      [
        { source: "pass", timeout_seconds: -1 },
        /^MCP error -32602: Input validation error: .*timeout_seconds/s,
      ],
      [{ source: 7 }, /^MCP error -32602: Input validation error: .*source/s],
      [
        { source: "pass", env: { KCORAL_DIR: "/x" } },
        /^invalid_input: env: KCORAL_DIR is managed by the remote worker$/,
      ],
      [
        { source: "pass", env: { "1X": "y" } },
        /^invalid_input: env: environment variable names must be identifiers$/,
      ],
      [
        { source: "pass", send: ["missing.txt"] },
        /^invalid_input: input must exist and not be a symlink: missing.txt$/,
      ],
      [{ script: "../x.py" }, /^invalid_input: script: /],
      [{ source: "pass", fetch: ["/etc/passwd"] }, /^invalid_input: fetch: /],
      [
        { source: "pass", args: [], script: "-i" },
        /^invalid_input: script must be a file path, not an option: -i$/,
      ],
    ];
    for (const [args, expected] of cases) {
      assert.match(errorText(await call(mcp, "run_python", args)), expected, JSON.stringify(args));
    }
    // The server's own error: the deadline passes.
    const timeout = errorText(
      await call(mcp, "run_python", { source: "import time\ntime.sleep(30)", timeout_seconds: 2 }),
    );
    assert.match(timeout, /^timeout: /);
    // Still serving after all of that.
    assert.equal(structured(await call(mcp, "run_python", { source: "print(1)" })).stdout, "1\n");
  });
});

Deno.test("kcoral mcp: run_program runs JSON instructions; bad programs and failures are errors", async () => {
  await withServer(async (_server, mcp) => {
    await Deno.writeTextFile(`${mcp.cwd}/payload.txt`, "from a local file");
    const result = structured(
      await call(mcp, "run_program", {
        instructions: [
          {
            op: "upload",
            kind: "module",
            id: "m",
            source: [
              "import numpy as np",
              "def scale(x, f):",
              "    return {'value': x * f, 'type': type(f).__name__}",
              "def read(path):",
              "    print('reading', path)",
              "    return open(path).read()",
              "def write():",
              "    open('report.txt', 'w').write('report\\n')",
              "    return bytes(range(4))",
            ].join("\n"),
          },
          { op: "get_function", id: "scale", module: { $ref: "m" }, name: "scale" },
          { op: "get_function", id: "read", module: { $ref: "m" }, name: "read" },
          { op: "get_function", id: "write", module: { $ref: "m" }, name: "write" },
          {
            op: "upload",
            kind: "file",
            id: "f",
            path: "in/payload.txt",
            local_path: "payload.txt",
          },
          { op: "run", id: "y", fn: { $ref: "scale" }, args: [3, { $float: 2 }] },
          { op: "run", id: "text", fn: { $ref: "read" }, args: [{ $ref: "f" }] },
          { op: "run", id: "raw", fn: { $ref: "write" } },
          { op: "return", key: "y", value: { $ref: "y" } },
          { op: "return", key: "text", value: { $ref: "text" } },
          { op: "return", key: "raw", value: { $ref: "raw" } },
          { op: "return", key: "report", kind: "file", path: "report.txt" },
        ],
        timeout_seconds: 60,
      }),
    );
    const results = result.results as Record<string, unknown>;
    assert.deepEqual(results.y, { value: 6, type: "float" });
    assert.equal(results.text, "from a local file");
    assert.deepEqual(results.raw, { $bytes: { size: 4, base64: "AAECAw==" } });
    assert.deepEqual(results.report, { $file: { path: "report", size: 7, text: "report\n" } });
    assert.equal(result.stdout, "reading in/payload.txt\n");
    assertTimings(result.timings);

    const bad = errorText(
      await call(mcp, "run_program", {
        instructions: [{ op: "get_function", module: { $ref: "nope" }, name: "f" }],
      }),
    );
    assert.match(bad, /^invalid_input: instruction 0 \(get_function\): .*unknown handle 'nope'$/);
    const mixed = errorText(
      await call(mcp, "run_program", {
        instructions: [{ op: "upload", kind: "module", source: "x = 1", base64: "AA==" }],
      }),
    );
    assert.equal(mixed, "invalid_input: instruction 0 (upload): kind module does not take base64");
    const schema = errorText(
      await call(mcp, "run_program", { instructions: [{ op: "launch" }] }),
    );
    assert.match(schema, /^MCP error -32602: Input validation error: .*instructions/s);

    const failed = errorText(
      await call(mcp, "run_program", {
        instructions: [
          {
            op: "upload",
            kind: "module",
            id: "m",
            source: "def f():\n    raise ValueError('boom')\n",
          },
          { op: "get_function", id: "f", module: { $ref: "m" }, name: "f" },
          { op: "run", id: "call", fn: { $ref: "f" } },
        ],
      }),
    );
    assert.match(failed, /^engine: ValueError: boom\n\nfailed at instruction 2 \(run call\)/);
    assert.match(failed, /Traceback/);
  });
});

const FAKE_PROFILER = `#!/usr/bin/env python3
import os, sys
tool = os.path.basename(sys.argv[0])
args = sys.argv[1:]
if tool == "ncu" and "--import" in args:
    print('"ID","Process ID","Kernel Name","Block Size","Grid Size","Section Name","Metric Name","Metric Unit","Metric Value"')
    print('"0","1","add_one","(256, 1, 1)","(4096, 1, 1)","GPU Speed Of Light Throughput","Duration","us","5.12"')
    print('"0","1","add_one","(256, 1, 1)","(4096, 1, 1)","GPU Speed Of Light Throughput","Memory Throughput","%","81.30"')
    print('"0","1","add_one","(256, 1, 1)","(4096, 1, 1)","Launch Statistics","Waves Per SM","","3.10"')
    sys.exit(0)
print("==PROF== argv " + " ".join(args))
if tool == "ncu":
    with open(args[args.index("--export") + 1], "xb") as report:
        report.write(b"NCU\\x00\\xff fake report")
else:
    with open(args[args.index("--log-file") + 1], "w") as log:
        log.write("========= COMPUTE-SANITIZER\\n========= Invalid __global__ write of size 4 bytes\\n"
                  "=========     at oob(int *)+0x70\\n=========\\n========= ERROR SUMMARY: 1 error\\n")
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
`;

Deno.test("kcoral mcp: profile with ncu and compute-sanitizer (fake tools), and refused options", async () => {
  await withServer(async (_server, mcp) => {
    await Deno.mkdir(`${mcp.cwd}/fakes`);
    for (const tool of ["ncu", "compute-sanitizer"]) {
      await Deno.writeTextFile(`${mcp.cwd}/fakes/${tool}`, FAKE_PROFILER, { mode: 0o755 });
    }
    const env = { PATH: `${mcp.cwd}/fakes:/usr/bin:/bin` };
    const ncu = structured(
      await call(mcp, "profile", {
        tool: "ncu",
        options: ["--set", "basic"],
        command: ["python3", "main.py"],
        source: "print('app')",
        env,
      }),
    );
    assert.equal(ncu.exit_code, 0);
    assert.match(
      String(ncu.stdout),
      /^==PROF== argv --config-file 0 --export .*capture\.ncu-rep --set basic python3 main.py\n$/,
    );
    const report = ncu.report as Record<string, unknown>;
    assert.equal(report.path, "capture.ncu-rep");
    assert.equal(report.text, undefined);
    assert.deepEqual(
      await Deno.readFile(String(report.saved_path)),
      new Uint8Array([
        ...new TextEncoder().encode("NCU"),
        0,
        255,
        ...new TextEncoder().encode(" fake report"),
      ]),
    );
    assert.equal(
      ncu.summary,
      "#0 add_one grid (4096, 1, 1) block (256, 1, 1): Duration 5.12 us, Memory Throughput 81.30 %",
    );
    assert.deepEqual(ncu.kernels, [{
      id: "0",
      name: "add_one",
      grid: "(4096, 1, 1)",
      block: "(256, 1, 1)",
      metrics: { Duration: "5.12 us", "Memory Throughput": "81.30 %" },
    }]);
    assertTimings(ncu.timings);

    const sanitizer = structured(
      await call(mcp, "profile", {
        tool: "compute-sanitizer",
        options: ["--tool", "memcheck"],
        command: ["./app"],
        env: { ...env, FAKE_EXIT: "1" },
      }),
    );
    assert.equal(sanitizer.exit_code, 1);
    assert.equal(sanitizer.errors, 1);
    assert.equal(
      sanitizer.summary,
      "ERROR SUMMARY: 1 error\nInvalid __global__ write of size 4 bytes\n    at oob(int *)+0x70",
    );
    assert.equal((sanitizer.report as Record<string, unknown>).path, "compute-sanitizer.log");
    assert.match(
      String((sanitizer.report as Record<string, unknown>).text),
      /ERROR SUMMARY: 1 error/,
    );
    assert.match(
      String(sanitizer.stdout),
      /--tool memcheck --log-file compute-sanitizer.log \.\/app/,
    );

    const refused: [Record<string, unknown>, RegExp][] = [
      [
        { tool: "ncu", options: ["--export", "x"], command: ["./app"] },
        /^invalid_input: .*--export/,
      ],
      [
        { tool: "compute-sanitizer", options: ["--log-file=x"], command: ["./app"] },
        /^invalid_input: --log-file is managed by profile/,
      ],
      [
        { tool: "ncu", options: ["--", "x"], command: ["./app"] },
        /^invalid_input: options must not contain '--'/,
      ],
      [{ tool: "ncu", command: [] }, /^MCP error -32602: Input validation error: .*command/s],
      [{ tool: "nsys", command: ["./app"] }, /^MCP error -32602: Input validation error: .*tool/s],
    ];
    for (const [args, expected] of refused) {
      assert.match(errorText(await call(mcp, "profile", args)), expected, JSON.stringify(args));
    }
    // No profiler installed on the worker: the runner's error, as a tool error.
    const missing = errorText(
      await call(mcp, "profile", {
        tool: "ncu",
        command: ["./app"],
        env: { PATH: "/nonexistent" },
      }),
    );
    assert.match(
      missing,
      /^engine: ncu: RuntimeError: ncu is not installed in the remote server environment\n/,
    );
  });
});

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
  add_one_kernel<<<(n + 255) / 256, 256>>>((const float*)x->data, (float*)y->data, n);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
`;

Deno.test("kcoral mcp: benchmark_kernel on a CPU server compiles, then fails with the server's unavailable", async () => {
  await withServer(async (_server, mcp) => {
    const args = [
      { tensor: { dtype: "float32", shape: [1024] } },
      { tensor: { dtype: "float32", shape: [1024], init: "zeros" } },
      { int: 1024 },
    ];
    const noTarget = errorText(
      await call(mcp, "benchmark_kernel", { source: ADD_ONE, entry: "add_one", args }),
    );
    assert.match(
      noTarget,
      /^unavailable: http:\/\/127\.0\.0\.1:\d+ reports no compilation target: it has no GPU/,
    );

    const compiledThenRefused = errorText(
      await call(mcp, "benchmark_kernel", {
        source: ADD_ONE,
        entry: "add_one",
        args,
        arch: "sm_90a",
      }),
    );
    assert.match(
      compiledThenRefused,
      /^unavailable: compiled for sm_90a \(\d+ bytes\), then timing add_one: benchmark requires a CUDA device\n\nfailed at instruction 5 \(run args\)/,
    );

    const broken = errorText(
      await call(mcp, "benchmark_kernel", {
        source: "this is not CUDA",
        entry: "f",
        arch: "sm_90a",
      }),
    );
    assert.match(broken, /^compile: compiling for sm_90a: .*error/);

    const bad: [Record<string, unknown>, RegExp][] = [
      [
        { entry: "f", arch: "sm_90a" },
        /^invalid_input: give exactly one of source \(one .cu text\) or sources$/,
      ],
      [
        { source: "x", sources: { "a.cu": "x" }, entry: "f" },
        /^invalid_input: give exactly one of/,
      ],
      [{ sources: { "a.h": "x" }, entry: "f" }, /^invalid_input: sources has no file to compile/],
      [
        { source: "x", entry: "f", args: [{ tensor: { dtype: "float33", shape: [1] } }] },
        /^MCP error -32602: Input validation error: /,
      ],
      [
        { source: "x", entry: "f", repeat: 0 },
        /^MCP error -32602: Input validation error: .*repeat/s,
      ],
      [
        { source: "x", entry: "f", arch: "sm_90a", compile_url: "ftp://x" },
        /^invalid_input: compile_url: unsupported URL scheme: ftp:$/,
      ],
    ];
    for (const [input, expected] of bad) {
      assert.match(
        errorText(await call(mcp, "benchmark_kernel", input)),
        expected,
        JSON.stringify(input),
      );
    }
  });
});

Deno.test("kcoral mcp: a cancelled call abandons its request; progress is reported while it runs", async () => {
  await withServer(async (server, mcp) => {
    const controller = new AbortController();
    const progress: string[] = [];
    const pending = call(mcp, "run_python", {
      source: "import time\ntime.sleep(30)",
      timeout_seconds: 8,
    }, {
      signal: controller.signal,
      onprogress: (p) => progress.push(String(p.message)),
    });
    const rejected = pending.then(() => "resolved", (error) => String(error));
    await waitUntil(
      "the request to run",
      () => server.app.health().load.requests_in_progress === 1,
      30_000,
    );
    await waitUntil("a progress notification", () => progress.length >= 2, 10_000);
    assert.match(progress[0], /^running python on http:\/\/127\.0\.0\.1:\d+, \d+ s$/);
    controller.abort("the agent gave up");
    assert.match(await rejected, /the agent gave up/);
    await waitUntil(
      "the abandon line",
      () =>
        mcp.stderr.some((line) =>
          /run_python: cancelled by the client; its KCoral request was abandoned/.test(line)
        ),
      5_000,
    );
    // The MCP process goes on at once; the other worker takes a new call while the abandoned
    // one still runs (it ends only at its deadline).
    const health = structured(await call(mcp, "health", {}));
    assert.equal(health.status, "ok");
    const quick = structured(await call(mcp, "run_python", { source: "print('next')" }));
    assert.equal(quick.stdout, "next\n");
    assert.equal(
      server.app.health().load.requests_in_progress,
      1,
      "the next calls waited for the abandoned one",
    );
    // The server ends the abandoned program at its deadline and frees the worker.
    await waitUntil(
      "the abandoned request to end",
      () => server.app.health().load.requests_in_progress === 0,
      20_000,
    );
  }, { numWorkers: 2 });
});

Deno.test("kcoral mcp: through a Router and a node", async () => {
  const router = await startRouter();
  const node = await startNode(router.url, "n1");
  let mcp: Mcp | null = null;
  try {
    await waitForCapacity(router.url, 1);
    mcp = await startMcp(router.url);
    const health = structured(await call(mcp, "health", {}));
    assert.equal(health.kind, "router");
    assert.equal(health.status, "ok");
    assert.equal(health.gpu_count, null);
    const result = structured(
      await call(mcp, "run_python", { source: "print('routed')", fetch: ["main.py"] }),
    );
    assert.equal(result.stdout, "routed\n");
    assert.deepEqual(result.files, [{ path: "main.py", size: 15, text: "print('routed')" }]);
    assertTimings(result.timings);
    const failed = errorText(
      await call(mcp, "run_program", {
        instructions: [
          { op: "upload", kind: "module", id: "m", source: "def f():\n    return 1 / 0\n" },
          { op: "get_function", id: "f", module: { $ref: "m" }, name: "f" },
          { op: "run", fn: { $ref: "f" } },
        ],
      }),
    );
    assert.match(failed, /^engine: ZeroDivisionError: division by zero/);
  } finally {
    await mcp?.close();
    await node.stop();
    await router.stop();
  }
});

Deno.test("kcoral mcp --help, --version and malformed command lines serve nothing", async () => {
  const run = async (args: string[]) => {
    const output = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", CLI, "mcp", ...args],
      env: { NO_COLOR: "1" },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).output();
    const decode = (bytes: Uint8Array) => new TextDecoder().decode(bytes);
    return { code: output.code, stdout: decode(output.stdout), stderr: decode(output.stderr) };
  };
  const help = await run(["--help"]);
  assert.equal(help.code, 0);
  assert.match(help.stdout, /^usage: kcoral mcp \[-h\] \[--version\] \[--url URL\]/);
  assert.match(help.stdout, /--files-dir DIR +directory for returned files too large to inline/);
  const version = await run(["--version"]);
  assert.equal(version.code, 0);
  assert.match(version.stdout, /^kcoral \d+\.\d+\.\d+\n$/);
  const both = await run(["--url", "http://x:1", "--port", "2"]);
  assert.equal(both.code, 2);
  assert.match(both.stderr, /kcoral mcp: error: --url cannot be combined with --host or --port\n$/);
  const scheme = await run(["--url", "ftp://x"]);
  assert.equal(scheme.code, 2);
  assert.match(
    scheme.stderr,
    /kcoral mcp: error: argument --url: not an http:\/\/ or https:\/\/ URL: 'ftp:\/\/x'\n$/,
  );
  const unknown = await run(["--bogus"]);
  assert.equal(unknown.code, 2);
  assert.match(unknown.stderr, /^usage: kcoral mcp/);
});

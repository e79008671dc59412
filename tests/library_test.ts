/**
 * Issue 7 on real servers without a GPU: remote compilation on a CPU server with the real
 * nvcc (`kcoral_runtime.builtins.compile_cuda` inside a `cpu_only` run), the plain C ABI with a
 * host-only C library built here with cc (numpy arrays and torch CPU tensors as `DLTensor*`),
 * `compile` errors for a missing symbol and a non-ELF blob, and the `gpu_access` error on the
 * wire (its exact keys and `interfered_request_id`) in the simulated-GPU mode.
 *
 * nvcc: the compile cases need it (PATH, `$CUDA_HOME/bin`, `$CUDA_PATH/bin`,
 * `/usr/local/cuda/bin`, as the worker searches). Without it this test FAILS, unless
 * `KCORAL_TEST_NO_NVCC=1`, which replaces those cases by the check that the worker answers
 * `unavailable` ("nvcc not found"). The CUPTI detection itself needs a GPU:
 * `tests/gpu/compile_gpu.ts`.
 */
import assert from "node:assert/strict";
import { Client, JsonFloat, Program, type Register, type ResultValue } from "../mod.ts";
import {
  ADD_ONE_CU,
  compileOnCpuServer,
  compileProgram,
  runRemoteCompilation,
} from "../examples/remote_compilation.ts";
import { postProgram, startServer } from "./_server.ts";

const ARCH = "sm_90a";
const NO_NVCC_OK = Deno.env.get("KCORAL_TEST_NO_NVCC") === "1";
const WIRE_ERROR_KEYS = [
  "kind",
  "message",
  "instruction_index",
  "instruction_op",
  "instruction_id",
  "traceback",
];
const GPU_ACCESS_KEYS = [...WIRE_ERROR_KEYS, "cuda_call", "location", "interfered_request_id"];

/** A host-only library with the plain C ABI (docs/c-abi.md): DLTensors, int64, double, str. */
const HOST_LIBRARY_C = `
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
  void* data; DLDevice device; int32_t ndim; DLDataType dtype;
  int64_t* shape; int64_t* strides; uint64_t byte_offset;
} DLTensor;

static char g_error[256];
const char* kcoral_last_error(void) { return g_error; }

/* x *= factor for a float32 CPU tensor of rank 1 or 2 with any strides (in elements). */
int scale(DLTensor* x, double factor) {
  if (x->device.device_type != 1 || x->dtype.code != 2 || x->dtype.bits != 32 || x->ndim < 1 ||
      x->ndim > 2) {
    snprintf(g_error, sizeof g_error, "scale: x must be a float32 CPU tensor of rank 1 or 2"
             " (device %d, code %d, bits %d, ndim %d)", x->device.device_type, x->dtype.code,
             x->dtype.bits, x->ndim);
    return 3;
  }
  int64_t rows = x->ndim == 2 ? x->shape[0] : 1, cols = x->shape[x->ndim - 1];
  int64_t rs = x->ndim == 2 ? x->strides[0] : 0, cs = x->strides[x->ndim - 1];
  float* base = (float*)((char*)x->data + x->byte_offset);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) base[i * rs + j * cs] *= (float)factor;
  return 0;
}

/* out[0] = a + b, out[1] = strlen(tag) (bytes of UTF-8) for an int64 CPU vector out. */
int add_and_measure(int64_t a, int64_t b, const char* tag, DLTensor* out) {
  if (out->dtype.code != 0 || out->dtype.bits != 64 || out->shape[0] < 2) {
    snprintf(g_error, sizeof g_error, "add_and_measure: out must be int64[2]");
    return 1;
  }
  int64_t* o = (int64_t*)((char*)out->data + out->byte_offset);
  o[0] = a + b;
  o[1] = (int64_t)strlen(tag);
  return 0;
}
`;

/** Uploaded Python that makes the CPU data (numpy and torch) and reads it back. */
const HOST_MODULE = `
import numpy
import torch

def make_array():
    return numpy.arange(1, 7, dtype=numpy.float32).reshape(2, 3)

def make_view():
    base = torch.arange(1, 7, dtype=torch.float32).reshape(3, 2)
    return base, base[::2].t()  # rows 0 and 2, transposed: a strided view, strides (1, 4)

def first(pair):
    return pair[0]

def second(pair):
    return pair[1]

def make_out():
    return torch.zeros(2, dtype=torch.int64)

def make_ints():
    return torch.ones(3, dtype=torch.int32)

def values(array, base, view, out):
    return {"array": array.tolist(), "base": base.tolist(), "view": view.tolist(),
            "view_strides": list(view.stride()), "out": out.tolist()}
`;

/** nvcc where the worker's `find_nvcc` looks, or null. */
function findNvcc(): string | null {
  const dirs = (Deno.env.get("PATH") ?? "").split(":").filter((d) => d);
  for (const root of [Deno.env.get("CUDA_HOME"), Deno.env.get("CUDA_PATH"), "/usr/local/cuda"]) {
    if (root) dirs.push(`${root}/bin`);
  }
  for (const dir of dirs) {
    try {
      const info = Deno.statSync(`${dir}/nvcc`);
      if (info.isFile && ((info.mode ?? 0) & 0o111) !== 0) return `${dir}/nvcc`;
    } catch {
      // not here
    }
  }
  return null;
}

function findCc(): string {
  for (const name of [Deno.env.get("CC"), "cc", "gcc", "clang"]) {
    if (!name) continue;
    for (const dir of (Deno.env.get("PATH") ?? "").split(":")) {
      try {
        if (Deno.statSync(`${dir}/${name}`).isFile) return `${dir}/${name}`;
      } catch {
        // not here
      }
    }
  }
  throw new Error("no C compiler (cc, gcc, clang or $CC) to build the host-only test library");
}

async function run(
  command: string,
  args: string[],
  cwd: string,
): Promise<{ code: number; output: string }> {
  const out = await new Deno.Command(command, { args, cwd, stdout: "piped", stderr: "piped" })
    .output();
  const decoder = new TextDecoder();
  return { code: out.code, output: decoder.decode(out.stdout) + decoder.decode(out.stderr) };
}

async function buildHostLibrary(): Promise<Uint8Array> {
  const dir = await Deno.makeTempDir({ prefix: "kcoral-libtest-" });
  try {
    await Deno.writeTextFile(`${dir}/host.c`, HOST_LIBRARY_C);
    const args = ["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "host.c", "-o", "libhost.so"];
    const built = await run(findCc(), args, dir);
    assert.equal(built.code, 0, built.output);
    return await Deno.readFile(`${dir}/libhost.so`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** The first `error`/`fatal` diagnostic line on, as `compile_cuda` trims it. */
function fromFirstError(text: string): string {
  const lines = text.split(/(?<=\n)/);
  const first = lines.findIndex((line) =>
    /\b(?:error|fatal)\b\s*(?:#\s*\d+(?:-D)?\s*)?:/i.test(line)
  );
  return (first < 0 ? text : lines.slice(first).join("")).replace(/\n+$/, "");
}

function isElfSharedObject(bytes: Uint8Array): boolean {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return bytes.length > 64 && bytes[0] === 0x7f && bytes[1] === 0x45 && bytes[2] === 0x4c &&
    bytes[3] === 0x46 && bytes[4] === 2 && view.getUint16(16, true) === 3; // ELF64, ET_DYN
}

function contains(bytes: Uint8Array, text: string): boolean {
  const needle = new TextEncoder().encode(text);
  outer: for (let i = 0; i + needle.length <= bytes.length; i++) {
    for (let j = 0; j < needle.length; j++) if (bytes[i + j] !== needle[j]) continue outer;
    return true;
  }
  return false;
}

function plain(value: ResultValue): unknown {
  if (value instanceof Map) return Object.fromEntries([...value].map(([k, v]) => [k, plain(v)]));
  if (Array.isArray(value)) return value.map(plain);
  return value;
}

/** A library upload (`lib`) and `name` bound from it (`fn`). */
function libraryProgram(library: Uint8Array, name: string): { program: Program; fn: Register } {
  const program = new Program();
  const lib = program.upload({ kind: "library", value: library, id: "lib" });
  return { program, fn: program.getFunction({ module: lib, name, id: "fn" }) };
}

/** A program whose cpu_only function raises what the CUPTI guard raises, with `now`. */
function forgedViolation(python: string): Program {
  const program = new Program();
  const module = program.upload({ kind: "module", source: python, id: "m" });
  const fn = program.getFunction({ module, name: "compile_it", cpuOnly: true, id: "compile" });
  program.run({ fn, id: "compiled" });
  return program;
}

const FORGED = `
import time
from kcoral_runtime.errors import GPUAccessViolation

def compile_it():
    raise GPUAccessViolation("cudaMalloc", "build.py:7 in compile_it",
                             "Traceback (most recent call last):\\n  at the CUDA call\\n",
                             time.monotonic_ns())
`;

async function postRaw(url: string, program: Program) {
  return await postProgram(url, program.toJson(), { blobs: Object.fromEntries(program.blobs) });
}

Deno.test("library (cpu server): remote compilation with nvcc, plain C ABI host library", async (t) => {
  const server = await startServer({ device: "cpu", numWorkers: 1 });
  const client = new Client(server.url);
  const nvcc = findNvcc();
  try {
    const health = await client.health() as unknown as {
      target: unknown;
      versions: Record<string, string>;
    };
    assert.deepEqual(health.target, {});
    assert.equal(
      health.versions.tvm_ffi,
      undefined,
      "these cases test the plain C ABI: run them where tvm_ffi is not installed",
    );

    if (nvcc !== null) {
      let library: Uint8Array = new Uint8Array();

      await t.step(`cpu_only compile_cuda returns a real ${ARCH} shared library`, async () => {
        const compiled = await compileOnCpuServer(client, ADD_ONE_CU, ARCH);
        library = compiled.library;
        assert.ok(isElfSharedObject(library), "not an ELF64 shared object");
        assert.ok(contains(library, "add_one") && contains(library, "kcoral_last_error"));
        assert.ok(contains(library, `-arch ${ARCH}`), `no ${ARCH} device code in the library`);
        assert.equal(compiled.leaseHeldMs, 0);
      });

      await t.step("the nvcc-built library loads and binds through the plain C ABI", async () => {
        // A CPU worker has no CUDA tensors: add_one's own check rejects numpy arrays, which
        // exercises dlopen, symbol binding, DLTensor marshalling and kcoral_last_error().
        const { program, fn } = libraryProgram(library, "add_one");
        const module = program.upload({ kind: "module", source: HOST_MODULE, id: "m" });
        const array = program.run({
          fn: program.getFunction({ module, name: "make_array" }),
          id: "a",
        });
        program.run({ fn, args: [array, array], id: "launch" });
        const result = await client.execute(program);
        assert.equal(result.status, "FAILED");
        assert.equal(result.error?.kind, "runtime");
        assert.equal(result.error?.message, "add_one: x must be a CUDA tensor (device_type 1)");
        assert.equal(result.error?.instructionId, "launch");
      });

      await t.step("a broken kernel: FAILED compile with nvcc's first error verbatim", async () => {
        const broken = ADD_ONE_CU.replace("y[i] = x[i] + 1.0f;", "y[i] = x[i] + one_point_oh;");
        assert.notEqual(broken, ADD_ONE_CU);
        const result = await client.execute(compileProgram(broken, ARCH));
        assert.equal(result.status, "FAILED");
        assert.equal(result.error?.kind, "compile");
        assert.equal(result.error?.instructionOp, "run");
        assert.equal(result.error?.instructionId, "library");
        // The same nvcc command here, on the same file name, must print the same diagnostics.
        const dir = await Deno.makeTempDir({ prefix: "kcoral-nvcc-test-" });
        try {
          await Deno.writeTextFile(`${dir}/add_one.cu`, broken);
          const local = await run(nvcc, [
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-O3",
            `-arch=${ARCH}`,
            "add_one.cu",
            "-o",
            "lib.so",
          ], dir);
          assert.notEqual(local.code, 0);
          const expected = fromFirstError(local.output);
          assert.equal(result.error?.message, expected);
          assert.match(
            expected.split("\n")[0],
            /^add_one\.cu\(\d+\): error: identifier "one_point_oh" is undefined$/,
          );
        } finally {
          await Deno.remove(dir, { recursive: true });
        }
      });
    } else if (NO_NVCC_OK) {
      await t.step("without nvcc, compile_cuda answers unavailable", async () => {
        const result = await client.execute(compileProgram(ADD_ONE_CU, ARCH));
        assert.equal(result.error?.kind, "unavailable");
        assert.match(String(result.error?.message), /^compile_cuda: nvcc not found/);
      });
    } else {
      await t.step("nvcc is installed", () => {
        throw new Error(
          "nvcc not found (PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin): the remote " +
            "compilation cases need it; set KCORAL_TEST_NO_NVCC=1 to check the no-nvcc answer instead",
        );
      });
    }

    const host = await buildHostLibrary();

    await t.step("host-only C library: numpy and torch CPU tensors as DLTensor*", async () => {
      const program = new Program();
      const lib = program.upload({ kind: "library", value: host, id: "lib" });
      const scale = program.getFunction({ module: lib, name: "scale", id: "scale" });
      const add = program.getFunction({ module: lib, name: "add_and_measure", id: "add" });
      const module = program.upload({ kind: "module", source: HOST_MODULE, id: "m" });
      const fn = (name: string) => program.getFunction({ module, name, id: `py_${name}` });
      const array = program.run({ fn: fn("make_array"), id: "array" });
      const pair = program.run({ fn: fn("make_view"), id: "pair" });
      const base = program.run({ fn: fn("first"), args: [pair], id: "base" });
      const view = program.run({ fn: fn("second"), args: [pair], id: "view" });
      const out = program.run({ fn: fn("make_out"), id: "out" });
      // `double factor`: a JS 2 would be the JSON integer 2, passed as int64_t (the C ABI
      // maps Python int -> int64_t, float -> double), so send a float explicitly.
      const two = new JsonFloat(2);
      program.return_({ key: "scaled", value: program.run({ fn: scale, args: [array, two] }) });
      program.run({ fn: scale, args: [view, -1.5] });
      program.run({ fn: add, args: [40, 2, "héllo", out] });
      program.return_({
        key: "values",
        value: program.run({ fn: fn("values"), args: [array, base, view, out] }),
      });
      const result = await client.execute(program);
      assert.equal(result.status, "COMPLETED", JSON.stringify(result.error));
      assert.equal(result.get("scaled"), null); // a successful call binds None
      assert.deepEqual(plain(result.get("values")), {
        array: [[2, 4, 6], [8, 10, 12]],
        base: [[-1.5, -3], [3, 4], [-7.5, -9]], // only rows 0 and 2 are in the view
        view: [[-1.5, -7.5], [-3, -9]],
        view_strides: [1, 4],
        out: [42, 6],
      });
    });

    await t.step("a non-zero return is a runtime error with kcoral_last_error()", async () => {
      const { program, fn } = libraryProgram(host, "scale");
      const module = program.upload({ kind: "module", source: HOST_MODULE, id: "m" });
      const ints = program.run({ fn: program.getFunction({ module, name: "make_ints" }) });
      program.run({ fn, args: [ints, 2], id: "call" });
      const result = await client.execute(program);
      assert.equal(result.error?.kind, "runtime");
      assert.equal(
        result.error?.message,
        "scale: x must be a float32 CPU tensor of rank 1 or 2 (device 1, code 0, bits 32, ndim 1)",
      );
    });

    await t.step("a missing symbol is a compile error naming it", async () => {
      const { json } = await postRaw(server.url, libraryProgram(host, "no_such_function").program);
      assert.equal(json.status, "FAILED");
      const error = json.error as Record<string, unknown>;
      assert.deepEqual(Object.keys(error), WIRE_ERROR_KEYS);
      assert.equal(error.kind, "compile");
      assert.equal(error.message, "library exports no function 'no_such_function'");
      assert.deepEqual(
        [error.instruction_index, error.instruction_op, error.instruction_id],
        [1, "get_function", "fn"],
      );
    });

    await t.step("a non-ELF blob is a compile error at the upload", async () => {
      for (
        const blob of [
          new TextEncoder().encode("#!/bin/sh\necho not a library\n"),
          new Uint8Array([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0]), // ELF magic, then nothing
        ]
      ) {
        const result = await client.execute(libraryProgram(blob, "anything").program);
        assert.equal(result.error?.kind, "compile");
        assert.match(String(result.error?.message), /^cannot load library: /);
        assert.equal(result.error?.instructionOp, "upload");
        assert.equal(result.error?.instructionId, "lib");
      }
    });

    await t.step("tensor uploads stay unavailable on a CPU worker", async () => {
      const program = new Program();
      program.upload({ kind: "tensor", value: new Float32Array([1, 2]), id: "t" });
      const result = await client.execute(program);
      assert.equal(result.error?.kind, "unavailable");
      assert.equal(result.error?.message, "tensor uploads require a GPU worker");
    });

    await t.step("gpu_access on the wire: exact keys, interfered_request_id null", async () => {
      const { json } = await postRaw(server.url, forgedViolation(FORGED));
      const error = json.error as Record<string, unknown>;
      assert.deepEqual(Object.keys(error), GPU_ACCESS_KEYS);
      assert.equal(error.kind, "gpu_access");
      assert.equal(error.cuda_call, "cudaMalloc");
      assert.equal(error.location, "build.py:7 in compile_it");
      assert.equal(error.interfered_request_id, null);
      assert.equal(error.traceback, "Traceback (most recent call last):\n  at the CUDA call\n");
    });

    await t.step("the example's flow needs a GPU server: a CPU server has no target", async () => {
      await assert.rejects(
        runRemoteCompilation({ cpuUrl: server.url, gpuUrl: server.url }),
        /the server reported no compilation target/,
      );
    });
  } finally {
    await client.close();
    await server.stop();
  }
});

Deno.test("library (simulated-GPU server): C ABI on uploaded tensors, gpu_access attribution", async (t) => {
  // Reused workers: no replacement is initialized (under the lease) between requests, so the
  // only lease holders after startup are this test's requests.
  const server = await startServer({
    device: "gpu",
    simulateGpus: true,
    gpus: [0],
    workersPerGpu: 2,
    maxRequestsPerWorker: 0,
  });
  const client = new Client(server.url);
  const dir = await Deno.makeTempDir({ prefix: "kcoral-interference-" });
  try {
    const host = await buildHostLibrary();

    await t.step("an uploaded (simulated-device) tensor is passed as a CPU DLTensor", async () => {
      const { program, fn } = libraryProgram(host, "scale");
      const x = program.upload({ kind: "tensor", value: new Float32Array([1, 2, 3]), id: "x" });
      program.run({ fn, args: [x, 0.5] });
      program.return_({ key: "x", value: x });
      const result = await client.execute(program);
      assert.equal(result.status, "COMPLETED", JSON.stringify(result.error));
      assert.deepEqual([...(result.get("x") as { data: Float32Array }).data], [0.5, 1, 1.5]);
    });

    await t.step("gpu_access alone: interfered_request_id null", async () => {
      const { json } = await postRaw(server.url, forgedViolation(FORGED));
      const error = json.error as Record<string, unknown>;
      assert.deepEqual(Object.keys(error), GPU_ACCESS_KEYS);
      assert.equal(error.interfered_request_id, null);
    });

    await t.step("gpu_access while another request holds the GPU names that request", async () => {
      // B's cpu_only function (lease released) waits until A holds the lease, then reports a
      // CUDA call "now"; the server maps that instant to A through the lease history.
      const sync = [
        "import os, time",
        "from kcoral_runtime.errors import GPUAccessViolation",
        `D = ${JSON.stringify(dir)}`,
        "def wait_for(name):",
        "    deadline = time.monotonic() + 60",
        "    while not os.path.exists(os.path.join(D, name)):",
        "        if time.monotonic() > deadline:",
        "            raise TimeoutError(name)",
        "        time.sleep(0.005)",
        "def touch(name):",
        "    open(os.path.join(D, name), 'w').close()",
        "def compile_it():",
        "    touch('b-ready')",
        "    wait_for('a-holds')",
        "    try:",
        "        raise GPUAccessViolation('cuLaunchKernel', 'build.py:3 in compile_it', '',",
        "                                 time.monotonic_ns())",
        "    finally:",
        "        touch('b-done')",
        "def hold():",
        "    touch('a-holds')",
        "    wait_for('b-done')",
        "    return 'held'",
        "",
      ].join("\n");
      const b = postRaw(server.url, forgedViolation(sync));
      const deadline = Date.now() + 60_000;
      while (!(await Deno.stat(`${dir}/b-ready`).then(() => true, () => false))) {
        assert.ok(Date.now() < deadline, "B never reached its cpu_only run");
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      const holder = new Program();
      const module = holder.upload({ kind: "module", source: sync, id: "m" });
      const hold = holder.getFunction({ module, name: "hold", id: "hold" });
      holder.return_({ key: "held", value: holder.run({ fn: hold, id: "held" }) });
      const a = postRaw(server.url, holder);
      const [bResponse, aResponse] = await Promise.all([b, a]);
      assert.equal(aResponse.json.status, "COMPLETED");
      const error = bResponse.json.error as Record<string, unknown>;
      assert.deepEqual(Object.keys(error), GPU_ACCESS_KEYS);
      assert.equal(error.cuda_call, "cuLaunchKernel");
      assert.equal(error.interfered_request_id, aResponse.json.request_id);
      assert.notEqual(error.interfered_request_id, bResponse.json.request_id);
    });
  } finally {
    await client.close();
    await server.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

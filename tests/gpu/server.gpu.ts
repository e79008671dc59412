/**
 * End-to-end tests on a real GPU (run on the GPU machine: `deno task test:gpu`): CUDA tensor
 * round trip, an illegal memory access failing one request without harming the next, device
 * `printf` captured in stdout, `/health` target, GPU-mode lease accounting, the GPU-state receipt
 * header with real NVML clocks.
 */
import assert from "node:assert/strict";
import { Client, KeptReturn, Program, type Tensor } from "../../mod.ts";
import { callProgram, postProgram, startServer } from "../_server.ts";
import { decodeGpuReceiptHeader, GPU_RECEIPT_HEADER } from "../../protocol/gpu_receipt.ts";

/** A program that runs `f` of `source` and returns its value under `out`. */
function callProgramAsProgram(source: string): Program {
  const program = new Program();
  const mod = program.upload({ kind: "module", source });
  const fn = program.getFunction({ module: mod, name: "f" });
  program.return_({ key: "out", value: program.run({ fn }) });
  return program;
}

const SANDBOX = (Deno.env.get("KCORAL_TEST_SANDBOX") ?? "none") as "none" | "bubblewrap";

for (const max of [1, 0]) {
  Deno.test(`gpu server (max_requests_per_worker ${max}, sandbox ${SANDBOX})`, async (t) => {
    const server = await startServer({
      device: "gpu",
      gpus: [0],
      workersPerGpu: 2,
      maxRequestsPerWorker: max,
      sandbox: SANDBOX,
    });
    const client = new Client(server.url);
    try {
      await t.step("/health reports the GPU target and versions", async () => {
        const health = await client.health() as unknown as {
          gpu_count: number;
          target: Record<string, string>;
          versions: Record<string, string>;
        };
        assert.equal(health.gpu_count, 1);
        assert.match(String(health.target.arch), /^sm_\d+a?$/);
        assert.ok(health.versions.torch);
        assert.ok(health.versions.cuda);
        console.log(
          `target ${JSON.stringify(health.target)} versions ${JSON.stringify(health.versions)}`,
        );
      });

      await t.step("CUDA tensor round trip", async () => {
        const program = new Program();
        const mod = program.upload({
          kind: "module",
          source: "def add_one(x):\n    assert x.is_cuda, x.device\n    return x + 1\n",
        });
        const fn = program.getFunction({ module: mod, name: "add_one" });
        const values = new Float32Array(1 << 20).map((_, i) => i % 1000);
        const x = program.upload({ kind: "tensor", value: values, shape: [values.length] });
        program.return_({ key: "y", value: program.run({ fn, args: [x] }) });
        const result = await client.execute(program);
        assert.equal(result.status, "COMPLETED", JSON.stringify(result.error));
        const y = result.get<Tensor>("y").data as Float32Array;
        assert.equal(y.length, values.length);
        for (let i = 0; i < y.length; i += 4099) assert.equal(y[i], values[i] + 1);
        assert.ok(result.leaseHeldMs > 0);
      });

      await t.step(
        "a kept CUDA tensor stays on the server and feeds the next program",
        async () => {
          const program = new Program();
          const mod = program.upload({
            kind: "module",
            source: "import torch\ndef make():\n    return torch.arange(1 << 20, " +
              "dtype=torch.float32, device='cuda').reshape(1024, 1024)\n",
          });
          const fn = program.getFunction({ module: mod, name: "make" });
          program.return_({ key: "t", value: program.run({ fn }) });
          const first = await client.execute(program, { keepReturns: 1 << 20 });
          assert.equal(first.status, "COMPLETED", JSON.stringify(first.error));
          const kept = first.get("t");
          assert.ok(kept instanceof KeptReturn, String(kept));
          assert.deepEqual([kept.kind, kept.dtype, kept.shape, kept.size], [
            "tensor",
            "float32",
            [1024, 1024],
            4 << 20,
          ]);
          const next = new Program();
          const t2 = next.upload({ kind: "tensor", value: kept });
          const sum = next.upload({
            kind: "module",
            source:
              "def total(t):\n    assert t.is_cuda, t.device\n    return t.double().sum().item()\n",
          });
          const total = next.getFunction({ module: sum, name: "total" });
          next.return_({ key: "s", value: next.run({ fn: total, args: [t2] }) });
          assert.equal(next.blobs.size, 0);
          const second = await client.execute(next);
          assert.equal(second.status, "COMPLETED", JSON.stringify(second.error));
          assert.equal(second.get("s"), (2 ** 20 - 1) * 2 ** 20 / 2);
        },
      );

      await t.step("the answer carries a GPU-state receipt with real clocks", async () => {
        const raw = await postProgram(
          server.url,
          callProgram(
            "import torch\ndef f():\n    return float(torch.ones(1 << 20, device='cuda').sum())\n",
            "f",
          ),
        );
        assert.equal(raw.json.status, "COMPLETED", JSON.stringify(raw.json.error));
        const header = raw.headers.get(GPU_RECEIPT_HEADER);
        assert.ok(header !== null, "a request that held the lease has X-KCoral-GPU-Receipt");
        console.log(`receipt (${header.length} bytes): ${header}`);
        const receipt = decodeGpuReceiptHeader(header)!;
        assert.equal(receipt.nvml_error, null, "NVML works in the worker");
        assert.equal(receipt.gpus.length, 1);
        const gpu = receipt.gpus[0];
        assert.equal(gpu.index, 0);
        assert.match(gpu.uuid ?? "", /^(GPU|MIG)-[0-9a-f-]+$/);
        assert.ok(gpu.name && gpu.driver_version && gpu.cuda_driver_version, JSON.stringify(gpu));
        for (const reading of [gpu.acquired, gpu.released]) {
          assert.ok(reading !== null, "both readings taken");
          assert.ok((reading.sm_clock_mhz ?? 0) > 100, `SM clock ${reading.sm_clock_mhz}`);
          assert.ok((reading.mem_clock_mhz ?? 0) > 100, `memory clock ${reading.mem_clock_mhz}`);
          assert.ok((reading.temperature_c ?? 0) > 0, `temperature ${reading.temperature_c}`);
          assert.ok((reading.power_w ?? 0) > 0, `power ${reading.power_w}`);
          assert.ok(Array.isArray(reading.reasons));
        }
        assert.equal(
          gpu.throttled,
          gpu.acquired!.throttled || gpu.released!.throttled,
        );
        // The typed form the client gives.
        const result = await client.execute(
          callProgramAsProgram("import torch\ndef f():\n    return torch.cuda.device_count()\n"),
        );
        assert.equal(result.gpuReceipt?.gpus[0].uuid, gpu.uuid);
      });

      await t.step(
        "tensor dtypes and shapes round trip unchanged (staged uploads too)",
        async () => {
          const program = new Program();
          const mod = program.upload({
            kind: "module",
            source: "def same(*xs):\n    assert all(x.is_cuda for x in xs)\n    return list(xs)\n",
          });
          const fn = program.getFunction({ module: mod, name: "same" });
          const big = new Int32Array(3 << 20).map((_, i) => i * 7 - 5);
          const uploads = [
            program.upload({ kind: "tensor", value: big, shape: [3, 1 << 20] }),
            program.upload({ kind: "tensor", value: new Float64Array([2.5]), shape: [] }),
            program.upload({
              kind: "tensor",
              value: new Uint8Array([1, 0, 1]),
              shape: [3],
              dtype: "bool",
            }),
            program.upload({
              kind: "tensor",
              value: new Uint8Array([0x80, 0x3f, 0x00, 0xc0]),
              shape: [2, 1],
              dtype: "bfloat16",
            }),
          ];
          program.return_({ key: "xs", value: program.run({ fn, args: uploads }) });
          for (let round = 0; round < 2; round++) { // the second round reuses cached pinned blocks
            const result = await client.execute(program);
            assert.equal(result.status, "COMPLETED", JSON.stringify(result.error));
            const [a, s, b, h] = result.get<Tensor[]>("xs");
            assert.deepEqual([a.dtype, a.shape], ["int32", [3, 1 << 20]]);
            const data = a.data as Int32Array;
            for (let i = 0; i < data.length; i += 7919) assert.equal(data[i], big[i]);
            assert.deepEqual([s.dtype, s.shape, [...(s.data as Float64Array)]], ["float64", [], [
              2.5,
            ]]);
            assert.deepEqual([b.dtype, [...(b.data as Uint8Array)]], ["bool", [1, 0, 1]]);
            assert.deepEqual([h.dtype, h.shape, [...(h.data as Uint8Array)]], [
              "bfloat16",
              [2, 1],
              [0x80, 0x3f, 0x00, 0xc0],
            ]);
          }
        },
      );

      await t.step(
        "an uploaded tensor changed in place does not change the next upload of its blob",
        async () => {
          // Reused workers keep staged blob bytes (runtime staging.py); the device tensor is a
          // copy, so a program writing into it must not leak into the next request.
          const program = new Program();
          const mod = program.upload({
            kind: "module",
            source: "def bump(x):\n    x.add_(1)\n    return x\n",
          });
          const fn = program.getFunction({ module: mod, name: "bump" });
          const values = new Float32Array(4 << 20).map((_, i) => i % 977);
          const x = program.upload({ kind: "tensor", value: values, shape: [values.length] });
          program.return_({ key: "y", value: program.run({ fn, args: [x] }) });
          for (let round = 0; round < 3; round++) {
            const result = await client.execute(program);
            assert.equal(result.status, "COMPLETED", JSON.stringify(result.error));
            const y = result.get<Tensor>("y").data as Float32Array;
            for (let i = 0; i < y.length; i += 6007) assert.equal(y[i], values[i] + 1);
          }
        },
      );

      await t.step(
        "an illegal memory access fails that request; the next one is clean",
        async () => {
          const bad = callProgram(
            [
              "import cupy",
              "def f():",
              "    k = cupy.RawKernel(r'''",
              'extern "C" __global__ void bad(int* p) { p[threadIdx.x] = 1; }',
              "''', 'bad')",
              "    k((1,), (32,), (cupy.uint64(16),))  # writes through a bogus device pointer",
              "    cupy.cuda.runtime.deviceSynchronize()",
              "    return 1",
            ].join("\n"),
            "f",
          );
          const r = await postProgram(server.url, bad);
          assert.equal(r.status, 200);
          assert.equal(r.json.status, "FAILED");
          const error = r.json.error as { kind: string; message: string };
          console.log(`illegal access -> ${error.kind}: ${error.message.slice(0, 160)}`);
          await server.pool.settled();
          const ok = await postProgram(
            server.url,
            callProgram(
              "import torch\ndef f():\n    return float(torch.ones(4, device='cuda').sum())\n",
              "f",
            ),
          );
          assert.equal(ok.json.status, "COMPLETED", JSON.stringify(ok.json.error));
          assert.deepEqual(ok.json.results, { out: { type: "number", value: 4 } });
        },
      );

      await t.step("device-side printf is captured in stdout", async () => {
        const source = [
          "import torch",
          "def f():",
          "    import cupy",
          "    k = cupy.RawKernel(r'''",
          'extern "C" __global__ void hello(int n) { printf("hello from thread %d of %d\\n", threadIdx.x, n); }',
          "''', 'hello')",
          "    k((1,), (2,), (2,))",
          "    cupy.cuda.runtime.deviceSynchronize()",
          "    return 0",
        ].join("\n");
        const r = await postProgram(server.url, callProgram(source, "f"));
        assert.equal(r.json.status, "COMPLETED", JSON.stringify(r.json.error));
        assert.match(String(r.json.stdout), /hello from thread 0 of 2/);
        assert.match(String(r.json.stdout), /hello from thread 1 of 2/);
      });
    } finally {
      client.close();
      await server.stop();
    }
  });
}

Deno.test("gpu server: trivial-program latency (median of 200), fresh and reused", async () => {
  for (const max of [1, 0]) {
    const server = await startServer({
      device: "gpu",
      gpus: [0],
      workersPerGpu: 8,
      maxRequestsPerWorker: max,
      sandbox: SANDBOX,
    });
    try {
      await using client = new Client(server.url);
      const program = new Program();
      const mod = program.upload({ kind: "module", source: "def f(x):\n    return x + 1\n" });
      program.return_({
        key: "y",
        value: program.run({ fn: program.getFunction({ module: mod, name: "f" }), args: [41] }),
      });
      const samples: number[] = [];
      for (let i = 0; i < 220; i++) {
        const start = performance.now();
        const result = await client.execute(program);
        if (i >= 20) samples.push(performance.now() - start);
        assert.equal(result.get("y"), 42);
        if (max === 1) await server.pool.settled(); // sequential fresh: each on a ready worker
      }
      samples.sort((a, b) => a - b);
      console.log(
        `trivial program e2e, ${max === 1 ? "fresh" : "reused"} workers, sandbox ${SANDBOX}: ` +
          `median ${samples[100].toFixed(2)} ms, min ${samples[0].toFixed(2)}, max ${
            samples[199].toFixed(2)
          }`,
      );
    } finally {
      await server.stop();
    }
  }
});

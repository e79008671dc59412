/**
 * The GPU-state receipt of `/execute` answers (`X-KCoral-GPU-Receipt`, protocol/gpu_receipt.ts):
 * a simulated-GPU server whose workers load the stand-in NVML
 * (runtime_py/tests/fixtures/nvml/fake_nvml.c, compiled here; `sim-<k>` stands for its NVML
 * index `k`) sends it with every answer whose request held the lease, a CPU server never does,
 * the body keeps upstream's keys, a Router passes the header on, and the client decodes it (a
 * malformed one leaves the result standing, without a receipt). A request whose worker died or
 * was killed gets the server's own reading (`taken_by` `"server"`), error answers included.
 */
import assert from "node:assert/strict";
import { Client, KCoralError, Program } from "../mod.ts";
import { GPU_RECEIPT_HEADER } from "../protocol/gpu_receipt.ts";
import { callProgram, postProgram, startServer } from "./_server.ts";
import { startNode, startRouter, waitForCapacity } from "./_router.ts";
import { completed, fakeServer, json } from "./fixtures/protocol/fake_server.ts";

const FAKE_NVML = new URL("../runtime_py/tests/fixtures/nvml/fake_nvml.c", import.meta.url)
  .pathname;
const UUID0 = "GPU-11111111-2222-3333-4444-555555555555";
const SIM = ["--device", "gpu", "--simulate-gpus", "--gpus", "0", "--workers-per-gpu", "1"];

/** The stand-in NVML, compiled once into a temporary directory. */
let built: Promise<string> | null = null;
function fakeNvml(): Promise<string> {
  built ??= (async () => {
    const dir = await Deno.makeTempDir({ prefix: "kcoral-fake-nvml-" });
    const out = `${dir}/libfake_nvml.so`;
    const cc = await new Deno.Command(Deno.env.get("CC") ?? "cc", {
      args: ["-shared", "-fPIC", "-O2", FAKE_NVML, "-o", out, "-lpthread"],
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(cc.code, 0, new TextDecoder().decode(cc.stderr));
    return out;
  })();
  return built;
}

/** A program that runs one function (the engine takes the lease for it). */
function runProgram(source = "def f():\n    return 1\n"): Program {
  const program = new Program();
  const mod = program.upload({ kind: "module", source });
  const fn = program.getFunction({ module: mod, name: "f" });
  program.return_({ key: "r", value: program.run({ fn }) });
  return program;
}

/** Moves the stand-in's readings of NVML index 0 to a power-capped state while it runs. */
const THROTTLE = "import ctypes, os\n" +
  "def f():\n" +
  "    lib = ctypes.CDLL(os.environ['KCORAL_NVML_LIBRARY'])\n" +
  "    lib.fake_nvml_set.argtypes = [ctypes.c_int] + [ctypes.c_uint] * 4 + [ctypes.c_ulonglong]\n" +
  "    lib.fake_nvml_set(0, 1410, 2619, 80, 690000, 0x4)\n" +
  "    return 2\n";

const RAW_PROGRAM = {
  instructions: [
    { op: "upload", id: "m", kind: "module", source: "def f():\n    return 1\n" },
    { op: "get_function", id: "g", module: { $ref: "m" }, name: "f" },
    { op: "run", id: "r", fn: { $ref: "g" } },
    { op: "return", key: "r", value: { $ref: "r" } },
  ],
};

/** Upstream's body keys of a COMPLETED answer, in order (spec protocol §3.1). */
const BODY_KEYS = [
  "status",
  "request_id",
  "queue_ms",
  "elapsed_ms",
  "lease_wait_ms",
  "lease_held_ms",
  "stdout",
  "stderr",
  "stdout_truncated",
  "stderr_truncated",
  "results",
];

Deno.test("gpu receipt: a simulated-GPU request that held the lease gets the header", async () => {
  const env = { ...Deno.env.toObject(), KCORAL_NVML_LIBRARY: await fakeNvml() };
  const server = await startServer({
    device: "gpu",
    simulateGpus: true,
    gpus: [0],
    workersPerGpu: 1,
    maxRequestsPerWorker: 0,
  }, { env });
  try {
    const raw = await postProgram(server.url, RAW_PROGRAM);
    assert.equal(raw.status, 200);
    assert.deepEqual(Object.keys(raw.json), BODY_KEYS, "the body stays upstream's");
    assert.ok((raw.json.lease_held_ms as number) > 0);
    const header = raw.headers.get(GPU_RECEIPT_HEADER);
    assert.ok(header !== null, "a leased request has a receipt");
    assert.match(header, /^[\x20-\x7e]+$/, "compact ASCII JSON");
    const receipt = JSON.parse(header);
    assert.deepEqual(Object.keys(receipt), [
      "gpus",
      "throttled",
      "nvml_error",
      "taken_by",
      "server_reason",
    ]);
    assert.deepEqual([receipt.taken_by, receipt.server_reason], ["worker", null]);
    assert.equal(receipt.nvml_error, null);
    assert.equal(receipt.throttled, false);
    const [gpu] = receipt.gpus;
    assert.deepEqual(
      [gpu.index, gpu.name, gpu.uuid, gpu.driver_version, gpu.cuda_driver_version],
      [0, "NVIDIA Stand-in 80GB HBM3", UUID0, "580.95.05", "13.0"],
    );
    for (const reading of [gpu.acquired, gpu.released]) {
      assert.deepEqual(reading, {
        sm_clock_mhz: 1980,
        mem_clock_mhz: 2619,
        temperature_c: 35,
        power_w: 72.5,
        reasons: ["gpu_idle"],
        throttled: false,
      });
    }

    await using client = new Client(server.url);
    const result = await client.execute(runProgram(THROTTLE));
    assert.ok(result.completed, JSON.stringify(result.error));
    const typed = result.gpuReceipt;
    assert.ok(typed !== null);
    assert.equal(typed.throttled, true);
    assert.equal(typed.gpus[0].acquired?.sm_clock_mhz, 1980);
    assert.deepEqual(typed.gpus[0].released?.reasons, ["sw_power_cap"]);
    assert.equal(typed.gpus[0].released?.sm_clock_mhz, 1410);
  } finally {
    await server.stop();
  }
});

/** The receipt header of a raw answer, parsed; fails when there is none. */
function receiptOf(headers: Headers, label: string): Record<string, unknown> & {
  gpus: Record<string, unknown>[];
} {
  const header = headers.get(GPU_RECEIPT_HEADER);
  assert.ok(header !== null, `${label}: a request that held the lease has a receipt`);
  return JSON.parse(header);
}

/** The stand-in NVML's default reading of NVML index 0. */
const IDLE = {
  sm_clock_mhz: 1980,
  mem_clock_mhz: 2619,
  temperature_c: 35,
  power_w: 72.5,
  reasons: ["gpu_idle"],
  throttled: false,
};

Deno.test("gpu receipt: a crash, a timeout and error answers after the lease have one", async () => {
  const env = { ...Deno.env.toObject(), KCORAL_NVML_LIBRARY: await fakeNvml() };
  const server = await startServer({
    device: "gpu",
    simulateGpus: true,
    gpus: [0],
    workersPerGpu: 1,
    maxResponseBytes: 1024 * 1024,
  }, { env });
  try {
    // The worker dies inside an instruction while it holds the lease: 200 FAILED, and the
    // server reads the GPU itself (the worker's reading died with it).
    const crashed = await postProgram(
      server.url,
      callProgram("import os\ndef f():\n    os._exit(3)\n", "f"),
    );
    assert.equal(crashed.status, 200);
    assert.equal(crashed.json.status, "FAILED");
    assert.ok((crashed.json.lease_held_ms as number) > 0);
    const crash = receiptOf(crashed.headers, "crash");
    assert.deepEqual([crash.taken_by, crash.server_reason], ["server", "crashed"]);
    assert.equal(crash.nvml_error, null);
    assert.deepEqual(crash.gpus.map((g) => [g.index, g.uuid, g.name]), [
      [0, UUID0, "NVIDIA Stand-in 80GB HBM3"],
    ]);
    assert.equal(crash.gpus[0].acquired, null);
    assert.deepEqual(crash.gpus[0].released, IDLE);

    // A program that raises after taking the lease: 200 FAILED, the worker's own receipt.
    const raised = await postProgram(
      server.url,
      callProgram("def f():\n    raise ValueError('no')\n", "f"),
    );
    assert.equal(raised.json.status, "FAILED");
    const failed = receiptOf(raised.headers, "raised");
    assert.deepEqual([failed.taken_by, failed.server_reason], ["worker", null]);
    assert.deepEqual(failed.gpus[0].acquired, IDLE);

    // An answer over the response limit (500): the worker's receipt rides on the error answer.
    const large = await postProgram(
      server.url,
      callProgram("def f():\n    return b'x' * 2_000_000\n", "f"),
    );
    assert.equal(large.status, 500);
    assert.equal((large.json.error as Record<string, unknown>).kind, "response_too_large");
    assert.equal(receiptOf(large.headers, "too large").taken_by, "worker");

    // Past the deadline (504): killed under the lease, read by the server before it is let go;
    // the client hands the receipt over with the error.
    await using client = new Client(server.url);
    const program = new Program();
    const mod = program.upload({
      kind: "module",
      source: "def f():\n    while True:\n        pass\n",
    });
    program.return_({
      key: "r",
      value: program.run({ fn: program.getFunction({ module: mod, name: "f" }) }),
    });
    const error = await client.execute(program, { timeoutSeconds: 2 }).then(
      () => assert.fail("the program should have timed out"),
      (e) => e,
    );
    assert.ok(error instanceof KCoralError, String(error));
    assert.equal(error.statusCode, 504);
    const timeout = error.gpuReceipt;
    assert.ok(timeout !== null, "a 504 after the lease has a receipt");
    assert.deepEqual([timeout.taken_by, timeout.server_reason], ["server", "timeout"]);
    assert.deepEqual(timeout.gpus[0].released, IDLE);
    assert.equal(timeout.gpus[0].uuid, UUID0);
  } finally {
    await server.stop();
  }
});

/** A simulated-GPU server whose NVML cannot be loaded. */
function _serverWithoutNvml() {
  const env = { ...Deno.env.toObject(), KCORAL_NVML_LIBRARY: "/nonexistent/libnvidia-ml.so.1" };
  return startServer({ device: "gpu", simulateGpus: true, gpus: [0], workersPerGpu: 1 }, { env });
}

Deno.test("gpu receipt: a dead worker's receipt says why when the server cannot read NVML", async () => {
  const server = await _serverWithoutNvml();
  try {
    const crashed = await postProgram(
      server.url,
      callProgram("import os\ndef f():\n    os._exit(3)\n", "f"),
    );
    assert.equal(crashed.json.status, "FAILED");
    const receipt = receiptOf(crashed.headers, "crash without NVML");
    assert.deepEqual([receipt.taken_by, receipt.server_reason], ["server", "crashed"]);
    assert.match(String(receipt.nvml_error), /^cannot load NVML \(\/nonexistent\/libnvidia-ml/);
    assert.deepEqual(receipt.gpus.map((g) => [g.index, g.acquired, g.released]), [[0, null, null]]);
  } finally {
    await server.stop();
  }
});

Deno.test("gpu receipt: without NVML the receipt names the GPU and says why", async () => {
  const server = await _serverWithoutNvml();
  try {
    await using client = new Client(server.url);
    const result = await client.execute(runProgram());
    assert.ok(result.completed, JSON.stringify(result.error));
    const receipt = result.gpuReceipt;
    assert.ok(receipt !== null);
    assert.match(receipt.nvml_error ?? "", /^cannot load NVML \(\/nonexistent\/libnvidia-ml/);
    assert.deepEqual(receipt.gpus.map((g) => [g.index, g.acquired, g.released]), [[0, null, null]]);
  } finally {
    await server.stop();
  }
});

Deno.test("gpu receipt: a CPU server's answers have none", async () => {
  const server = await startServer({ device: "cpu", numWorkers: 1 });
  try {
    const raw = await postProgram(server.url, RAW_PROGRAM);
    assert.equal(raw.status, 200);
    assert.equal(raw.headers.get(GPU_RECEIPT_HEADER), null);
    await using client = new Client(server.url);
    const result = await client.execute(runProgram());
    assert.ok(result.completed);
    assert.equal(result.gpuReceipt, null);
  } finally {
    await server.stop();
  }
});

Deno.test({
  name: "gpu receipt: a routed answer keeps the header",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const router = await startRouter();
    const node = await startNode(router.url, "sim-receipt", {
      extra: SIM,
      env: { KCORAL_NVML_LIBRARY: await fakeNvml() },
    });
    try {
      await waitForCapacity(router.url, 1);
      const raw = await postProgram(router.url, RAW_PROGRAM);
      assert.equal(raw.status, 200);
      assert.equal(raw.headers.get("x-kcoral-node"), "sim-receipt");
      const receipt = JSON.parse(raw.headers.get(GPU_RECEIPT_HEADER) ?? "null");
      assert.equal(receipt?.gpus?.[0]?.uuid, UUID0);
      assert.equal(receipt.gpus[0].acquired.sm_clock_mhz, 1980);
      await using client = new Client(router.url);
      const result = await client.execute(runProgram());
      assert.ok(result.completed, JSON.stringify(result.error));
      assert.equal(result.gpuReceipt?.gpus[0].uuid, UUID0);
      const live = await client.execute(runProgram(), { onOutput: () => {} });
      assert.equal(live.gpuReceipt?.gpus[0].uuid, UUID0, "live output's final answer has it too");
    } finally {
      await node.stop();
      await router.stop();
    }
  },
});

Deno.test("gpu receipt: the client decodes the header, and a malformed one leaves the result", async () => {
  const good = '{"gpus":[{"index":2,"name":"NVIDIA H100 80GB HBM3","uuid":"GPU-5f2e",' +
    '"driver_version":"580.95.05","cuda_driver_version":"13.0","acquired":{"sm_clock_mhz":1980,' +
    '"mem_clock_mhz":2619,"temperature_c":35,"power_w":72.5,"reasons":["gpu_idle"],' +
    '"throttled":false},"released":null,"throttled":false,"future_field":1}],' +
    '"throttled":false,"nvml_error":null}';
  const headers = [
    good,
    "not json",
    '{"gpus":"x","throttled":false,"nvml_error":null}',
    '{"gpus":[{"index":-1}],"throttled":false,"nvml_error":null}',
  ];
  const server = fakeServer((_request, index) =>
    json(completed(`r${index}`, '{"r":{"type":"integer","value":1}}'), {
      headers: { [GPU_RECEIPT_HEADER]: headers[index] },
    })
  );
  try {
    await using client = new Client(server.url);
    const first = await client.execute(runProgram());
    assert.equal(first.get("r"), 1);
    assert.equal(first.gpuReceipt?.gpus[0].index, 2);
    assert.equal(first.gpuReceipt?.gpus[0].acquired?.power_w, 72.5);
    assert.equal("future_field" in first.gpuReceipt!.gpus[0], false, "unknown keys left out");
    for (let k = 1; k < headers.length; k++) {
      const result = await client.execute(runProgram());
      assert.ok(result.completed, "a malformed receipt does not fail the result");
      assert.equal(result.get("r"), 1);
      assert.equal(result.gpuReceipt, null);
    }
  } finally {
    await server.close();
  }
});

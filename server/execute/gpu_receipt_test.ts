import assert from "node:assert/strict";
import { gpuReceiptFromServer, gpuReceiptFromWorker, receiptHeaders } from "./gpu_receipt.ts";

const UUID = "GPU-11111111-2222-3333-4444-555555555555";

function report(uuids: (string | null)[]): Record<string, unknown> {
  return {
    gpus: uuids.map((uuid) => ({
      name: "NVIDIA Stand-in 80GB HBM3",
      uuid,
      driver_version: "580.95.05",
      cuda_driver_version: "13.0",
      acquired: null,
      released: null,
      throttled: false,
    })),
    throttled: false,
    nvml_error: null,
  };
}

Deno.test("gpu receipt from a worker: indices by lease order, UUIDs checked against the inventory", () => {
  const gpus = [{ index: 5, uuid: UUID, minor: 5 }, { index: 2, uuid: "GPU-bbbb", minor: 2 }];
  const receipt = gpuReceiptFromWorker(report([UUID, null]), gpus)!;
  assert.deepEqual(receipt.gpus.map((g) => [g.index, g.uuid]), [[5, UUID], [2, "GPU-bbbb"]]);
  assert.equal(receipt.nvml_error, null);
  assert.equal(receipt.gpus[0].name, "NVIDIA Stand-in 80GB HBM3");
});

Deno.test("gpu receipt from a worker: another GPU's UUID or a wrong shape is refused, the GPUs named", () => {
  const gpus = [{ index: 0, uuid: UUID, minor: 0 }];
  for (
    const [bad, why] of [
      [report(["GPU-ffff"]), /names GPU-ffff for GPU 0, which is GPU-1111/],
      [report([UUID, UUID]), /does not list the request's 1 GPU/],
      [{ ...report([UUID]), throttled: 1 }, /receipt\.throttled is not a boolean/],
      ["text", /receipt is not an object/],
    ] as const
  ) {
    const receipt = gpuReceiptFromWorker(bad, gpus)!;
    assert.match(receipt.nvml_error ?? "", /^the worker's receipt was refused: /);
    assert.match(receipt.nvml_error ?? "", why);
    assert.deepEqual(receipt.gpus, [{
      index: 0,
      name: null,
      uuid: UUID,
      driver_version: null,
      cuda_driver_version: null,
      acquired: null,
      released: null,
      throttled: false,
    }]);
  }
});

Deno.test("gpu receipt from a worker: none reported is none; simulated GPUs keep the worker's UUID", () => {
  const sim = [{ index: 0, uuid: "sim-0", minor: null }];
  assert.equal(gpuReceiptFromWorker(undefined, sim), null);
  assert.equal(gpuReceiptFromWorker(null, sim), null);
  assert.equal(gpuReceiptFromWorker(report([UUID]), sim)!.gpus[0].uuid, UUID);
  assert.equal(gpuReceiptFromWorker(report([null]), sim)!.gpus[0].uuid, null);
});

Deno.test("gpu receipt: a worker cannot say the server took it; the server's own says why", () => {
  const gpus = [{ index: 4, uuid: UUID, minor: 4 }];
  const claimed = { ...report([UUID]), taken_by: "server", server_reason: "crashed" };
  const worker = gpuReceiptFromWorker(claimed, gpus)!;
  assert.deepEqual([worker.taken_by, worker.server_reason], ["worker", null]);

  // The server's reading: identity and the release reading; no acquisition reading (the
  // worker's died with it), whatever the report says.
  const server = gpuReceiptFromServer({ report: report([UUID]) }, gpus, "timeout");
  assert.deepEqual([server.taken_by, server.server_reason], ["server", "timeout"]);
  assert.equal(server.gpus[0].index, 4);
  assert.equal(server.gpus[0].acquired, null);
  // A reading that failed or does not fit the GPUs still names them, and says why.
  for (
    const [reading, why] of [
      [{ error: "the server's NVML reading took over 5000 ms" }, /took over 5000 ms/],
      [{ report: report([UUID, UUID]) }, /^the server's NVML reading: receipt\.gpus does not/],
      [{ report: null }, /receipt is not an object/],
    ] as const
  ) {
    const receipt = gpuReceiptFromServer(reading, gpus, "crashed");
    assert.match(receipt.nvml_error ?? "", why);
    assert.deepEqual(receipt.gpus.map((g) => [g.index, g.uuid, g.released]), [[4, UUID, null]]);
    assert.equal(receipt.taken_by, "server");
  }
});

Deno.test("gpu receipt: the header carries a receipt, and nothing for none", () => {
  const headers = receiptHeaders({
    gpus: [],
    throttled: false,
    nvml_error: null,
    taken_by: "worker",
    server_reason: null,
  });
  assert.ok(headers["x-kcoral-gpu-receipt"]?.startsWith('{"gpus":[]'));
  assert.deepEqual(receiptHeaders(null), {});
});

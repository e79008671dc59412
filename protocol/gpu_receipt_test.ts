import assert from "node:assert/strict";
import {
  decodeGpuReceiptHeader,
  encodeGpuReceiptHeader,
  GPU_RECEIPT_HEADER,
  type GpuReceipt,
  readGpuReceipt,
} from "./gpu_receipt.ts";

const RECEIPT: GpuReceipt = {
  gpus: [{
    index: 1,
    name: "NVIDIA Stand-in ™",
    uuid: "GPU-11111111-2222-3333-4444-555555555555",
    driver_version: "580.95.05",
    cuda_driver_version: "13.0",
    acquired: {
      sm_clock_mhz: 1980,
      mem_clock_mhz: 2619,
      temperature_c: 35,
      power_w: 72.5,
      reasons: ["gpu_idle"],
      throttled: false,
    },
    released: {
      sm_clock_mhz: 1410,
      mem_clock_mhz: null,
      temperature_c: 80,
      power_w: 690,
      reasons: ["sw_power_cap", "unknown_0x1000"],
      throttled: true,
    },
    throttled: true,
  }],
  throttled: true,
  nvml_error: null,
  taken_by: "worker",
  server_reason: null,
};

Deno.test("gpu receipt header: round trip, ASCII only, key order fixed", () => {
  const value = encodeGpuReceiptHeader(RECEIPT);
  assert.match(value, /^[\x20-\x7e]+$/);
  assert.ok(value.includes("NVIDIA Stand-in \\u2122"));
  assert.deepEqual(decodeGpuReceiptHeader(value), RECEIPT);
  assert.ok(new Headers({ "x-kcoral-gpu-receipt": value }).has("x-kcoral-gpu-receipt"));
  assert.ok(value.startsWith('{"gpus":[{"index":1,"name":'));
  assert.ok(
    value.endsWith(
      '"throttled":true}],"throttled":true,"nvml_error":null,"taken_by":"worker","server_reason":null}',
    ),
  );
});

Deno.test("gpu receipt header: no header is null, a malformed one names what is wrong", () => {
  assert.equal(decodeGpuReceiptHeader(null), null);
  const cases: [string, RegExp][] = [
    ["{", /not JSON/],
    ["[]", /receipt is not an object/],
    ['{"gpus":[],"throttled":"no","nvml_error":null}', /receipt\.throttled is not a boolean/],
    ['{"gpus":[],"throttled":false}', /receipt\.nvml_error/],
    ['{"gpus":[{"index":0.5}],"throttled":false,"nvml_error":null}', /gpus\[0\]\.index/],
  ];
  for (const [value, message] of cases) {
    assert.throws(() => decodeGpuReceiptHeader(value), message, value);
  }
  const reading = { ...RECEIPT.gpus[0].acquired!, power_w: "72" };
  assert.throws(
    () => readGpuReceipt({ ...RECEIPT, gpus: [{ ...RECEIPT.gpus[0], acquired: reading }] }),
    /receipt\.gpus\[0\]\.acquired\.power_w is not a number/,
  );
  assert.throws(
    () => readGpuReceipt({ ...RECEIPT, gpus: [{ ...RECEIPT.gpus[0], name: "x".repeat(257) }] }),
    /gpus\[0\]\.name is not a string of at most 256/,
  );
  assert.throws(
    () => readGpuReceipt({ ...RECEIPT, gpus: Array(65).fill(RECEIPT.gpus[0]) }),
    /at most 64/,
  );
});

Deno.test("gpu_receipt: readGpuReceipt", () => {
  const receipt = readGpuReceipt({
    gpus: [{
      index: 0,
      name: null,
      uuid: "GPU-1",
      driver_version: null,
      cuda_driver_version: null,
      acquired: null,
      released: null,
      throttled: false,
      extra: 1,
    }],
    throttled: false,
    nvml_error: "cannot load NVML",
  });
  if (receipt.gpus[0].uuid !== "GPU-1" || "extra" in receipt.gpus[0]) throw new Error();
  if (receipt.taken_by !== "worker" || receipt.server_reason !== null) throw new Error();
});

Deno.test("gpu_receipt: encodeGpuReceiptHeader", () => {
  const value = encodeGpuReceiptHeader({
    gpus: [],
    throttled: false,
    nvml_error: "é",
    taken_by: "server",
    server_reason: "crashed",
  });
  const json = '{"gpus":[],"throttled":false,"nvml_error":"\\u00e9","taken_by":"server",' +
    '"server_reason":"crashed"}';
  if (value !== json) throw new Error(value);
});

Deno.test("gpu_receipt: decodeGpuReceiptHeader", () => {
  const headers = new Headers({
    [GPU_RECEIPT_HEADER]: '{"gpus":[],"throttled":false,"nvml_error":null}',
  });
  const receipt = decodeGpuReceiptHeader(headers.get(GPU_RECEIPT_HEADER));
  if (receipt?.throttled !== false || decodeGpuReceiptHeader(null) !== null) throw new Error();
  if (receipt.taken_by !== "worker") throw new Error(); // absent: the worker's
});

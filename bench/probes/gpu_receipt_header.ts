/**
 * What the GPU-state receipt header costs the server and the client per answer: the server
 * reading the worker's report into the receipt (`gpuReceiptFromWorker`) and writing the header
 * value (`encodeGpuReceiptHeader`), and the client decoding it (`decodeGpuReceiptHeader`), for a
 * receipt of 1 and of 8 GPUs. Prints median, min and max over `--runs` runs (default 7) of 20,000
 * answers each, in µs per answer.
 *
 *   deno run bench/probes/gpu_receipt_header.ts [--runs N]
 *
 * @module
 */
import { decodeGpuReceiptHeader, encodeGpuReceiptHeader } from "../../protocol/gpu_receipt.ts";
import { gpuReceiptFromWorker } from "../../server/execute/gpu_receipt.ts";
import { median } from "./_probe.ts";

const REPS = 20_000;
const at = Deno.args.indexOf("--runs");
const runs = at >= 0 ? Number(Deno.args[at + 1]) : 7;

const reading = {
  sm_clock_mhz: 1980,
  mem_clock_mhz: 2619,
  temperature_c: 35,
  power_w: 72.5,
  reasons: ["gpu_idle"],
  throttled: false,
};
function report(count: number) {
  return {
    gpus: Array.from({ length: count }, (_, k) => ({
      name: "NVIDIA H100 80GB HBM3",
      uuid: `GPU-${String(k).padStart(8, "0")}-2222-3333-4444-555555555555`,
      driver_version: "580.95.05",
      cuda_driver_version: "13.0",
      acquired: reading,
      released: reading,
      throttled: false,
    })),
    throttled: false,
    nvml_error: null,
  };
}

for (const count of [1, 8]) {
  const worker = report(count);
  const devices = worker.gpus.map((g, index) => ({ index, uuid: g.uuid, minor: index }));
  const header = encodeGpuReceiptHeader(gpuReceiptFromWorker(worker, devices)!);
  const ways: [string, () => unknown][] = [
    [
      "server: report -> header",
      () => encodeGpuReceiptHeader(gpuReceiptFromWorker(worker, devices)!),
    ],
    ["client: header -> receipt", () => decodeGpuReceiptHeader(header)],
  ];
  for (const [name, fn] of ways) {
    for (let i = 0; i < 2000; i++) fn();
    const per: number[] = [];
    for (let run = 0; run < runs; run++) {
      const t0 = performance.now();
      for (let i = 0; i < REPS; i++) fn();
      per.push((performance.now() - t0) / REPS * 1000);
    }
    console.log(
      `${count} GPU(s), ${header.length} bytes, ${name}: ${median(per).toFixed(2)} µs ` +
        `[${Math.min(...per).toFixed(2)}-${Math.max(...per).toFixed(2)}]`,
    );
  }
}

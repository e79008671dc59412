/**
 * Loopback TCP throughput in Deno: 128 MiB per transfer over a bare socket, both ends in this
 * process (`loopback.py` is the same in Python; the server bench prints the median as a floor
 * row).
 *
 *   deno run -A bench/probes/loopback.ts
 *
 * @module
 */
import { FLOOR_BYTES, loopbackTransfers } from "../_floors.ts";
import { randomBytes } from "../_programs.ts";

for (const ms of await loopbackTransfers(randomBytes(FLOOR_BYTES), 5)) {
  console.log(
    `deno loopback 128 MiB (same process): ${ms.toFixed(1)} ms (${
      (FLOOR_BYTES / ms / 1e6).toFixed(2)
    } GB/s)`,
  );
}

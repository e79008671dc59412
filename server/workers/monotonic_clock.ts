/**
 * The offset between `performance.now()` and `CLOCK_MONOTONIC` (what workers' `monotonic_ns()`
 * reads), read through `clock_gettime` so a worker's instant lands exactly on the lease history.
 * Needs Linux and `--allow-ffi`; else `null` and callers estimate it from message round trips.
 *
 * @module
 */

const CLOCK_MONOTONIC = 1;
let cached: number | null | undefined;

/** `performance.now()` minus the monotonic clock, in ms, or `null` without FFI (read once). */
export function monotonicOffsetMs(): number | null {
  if (cached !== undefined) return cached;
  cached = null;
  if (Deno.build.os !== "linux") return cached;
  let libc: Deno.DynamicLibrary<
    { clock_gettime: { parameters: ["i32", "buffer"]; result: "i32" } }
  >;
  try {
    libc = Deno.dlopen("libc.so.6", {
      clock_gettime: { parameters: ["i32", "buffer"], result: "i32" },
    });
  } catch {
    return cached;
  }
  try {
    const timespec = new BigInt64Array(2);
    const bytes = new Uint8Array(timespec.buffer);
    let best = Infinity;
    // The read with the shortest bracket of performance.now() calls bounds the error best.
    for (let i = 0; i < 16; i++) {
      const before = performance.now();
      if (libc.symbols.clock_gettime(CLOCK_MONOTONIC, bytes) !== 0) return cached;
      const after = performance.now();
      if (after - before < best) {
        best = after - before;
        const monotonicMs = Number(timespec[0]) * 1e3 + Number(timespec[1]) / 1e6;
        cached = (before + after) / 2 - monotonicMs;
      }
    }
    return cached;
  } finally {
    libc.close();
  }
}

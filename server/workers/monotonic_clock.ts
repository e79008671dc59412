/**
 * The offset between this process's `performance.now()` and the system's monotonic clock
 * (`CLOCK_MONOTONIC`, which Python's `time.monotonic_ns()` reads in the workers), read directly
 * through `clock_gettime` — so that an instant a worker reports (a `cpu_only` function's CUDA
 * call) lands on the server's lease history without the error of an estimate from message
 * round trips, which grows with load. Needs Linux and `--allow-ffi`; without them the offset is
 * `null` and callers estimate it from their messages.
 *
 * @module
 */

const CLOCK_MONOTONIC = 1;
let cached: number | null | undefined;

/**
 * `performance.now()` minus the monotonic clock, in ms (add it to a worker's
 * `monotonic_ns / 1e6` to get this process's `performance.now()` of that instant), or `null`
 * without FFI. Read once; both clocks run at the same rate.
 *
 * @example
 * ```ts
 * import { monotonicOffsetMs } from "./monotonic_clock.ts";
 *
 * const offset = monotonicOffsetMs();
 * if (offset !== null && !Number.isFinite(offset)) throw new Error();
 * ```
 */
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

/**
 * Pins glibc malloc's mmap and trim thresholds for a server or Router process, at the values its
 * own dynamic adjustment ends at: blocks under 32 MiB come from the heap, and up to 64 MiB of
 * freed heap stays mapped for the next ones.
 *
 * Why: these processes allocate and free a buffer for every 256 KiB node-link message and every
 * body chunk. Left to glibc's dynamic thresholds, the freed memory went back to the system
 * (the heap's top trimmed, or an mmap'd block unmapped) so often that the next buffer landed on
 * fresh pages: a page fault, and the page zeroed, for nearly every 4 KiB that Deno copied into
 * a message. A Router forwarding a 64 MiB answer took 14,500 minor faults, and its node 5,100;
 * with the thresholds pinned, 500 and 120 (docs/decisions/malloc-thresholds.md).
 *
 * It is done in-process through `mallopt(3)` (FFI, so it needs `--allow-ffi`, which `-A` gives;
 * without it nothing is asked for). Nothing is changed where glibc is not the C library
 * (`libc.so.6` does not load), where FFI is not allowed, or where the operator set malloc tunables
 * themselves (`GLIBC_TUNABLES` with a `glibc.malloc.` entry): theirs win.
 *
 * @module
 */

/** Blocks of this size or more are mapped on their own (glibc's dynamic ceiling, 64-bit). */
export const MMAP_THRESHOLD_BYTES = 32 << 20;
/** Freed heap at the top is given back beyond this much (twice the mmap threshold, as glibc). */
export const TRIM_THRESHOLD_BYTES = 64 << 20;

/** `mallopt(3)` parameter numbers (malloc.h). */
const _M_TRIM_THRESHOLD = -1;
const _M_MMAP_THRESHOLD = -3;

/**
 * Pins the thresholds, or says why not. Returns `"pinned"`, or `"skipped: REASON"`.
 *
 * @example
 * ```ts
 * import { pinMallocThresholds } from "./malloc_thresholds.ts";
 *
 * const outcome = pinMallocThresholds({ GLIBC_TUNABLES: "glibc.malloc.arena_max=2" });
 * if (outcome !== "skipped: GLIBC_TUNABLES sets malloc tunables") throw new Error(outcome);
 * ```
 */
export function pinMallocThresholds(
  env: Record<string, string | undefined> = Deno.env.toObject(),
): string {
  if (env.GLIBC_TUNABLES?.includes("glibc.malloc.")) {
    return "skipped: GLIBC_TUNABLES sets malloc tunables";
  }
  if (Deno.build.os !== "linux") return `skipped: ${Deno.build.os}`;
  // Asked, not requested: without the permission a terminal would otherwise prompt for it.
  if (Deno.permissions.querySync({ name: "ffi" }).state !== "granted") {
    return "skipped: no FFI permission";
  }
  let libc;
  try {
    libc = Deno.dlopen("libc.so.6", {
      mallopt: { parameters: ["i32", "i32"], result: "i32" },
    });
  } catch (error) {
    // Not glibc (musl names its C library otherwise).
    return `skipped: ${error instanceof Error ? error.message : error}`;
  }
  try {
    const done = libc.symbols.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) === 1 &&
      libc.symbols.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) === 1;
    return done ? "pinned" : "skipped: mallopt refused the values";
  } finally {
    libc.close();
  }
}

/**
 * A full V8 garbage collection on demand. An idle process allocates nothing, so V8 never
 * collects the large buffers it dropped: their memory stays resident until the next burst of
 * allocation. `--expose-gc` is set at run time (it applies to new contexts) and the `gc` of a
 * new context is kept; where that is unavailable nothing is collected.
 *
 * @module
 */
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

let collector: (() => void) | null | undefined;

/**
 * Runs a full garbage collection of this isolate (tens of ms: call it only when idle); `false`
 * when the runtime offers none.
 *
 * @example
 * ```ts
 * import { collectGarbage } from "./collect_garbage.ts";
 *
 * let buffer: ArrayBuffer | null = new ArrayBuffer(64 << 20);
 * buffer = null;
 * if (!collectGarbage()) console.log("no collection here");
 * ```
 */
export function collectGarbage(): boolean {
  if (collector === undefined) {
    try {
      setFlagsFromString("--expose-gc");
      const gc = runInNewContext("gc");
      collector = typeof gc === "function" ? gc : null;
    } catch {
      collector = null;
    }
  }
  collector?.();
  return collector !== null;
}

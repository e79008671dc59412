/**
 * A full V8 garbage collection on demand: an idle process allocates nothing, so V8 never collects
 * the large buffers it dropped. Uses the `gc` of a new context under `--expose-gc`, if available.
 *
 * @module
 */
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

let collector: (() => void) | null | undefined;

/** Runs a full garbage collection (tens of ms: only when idle); `false` when none is offered. */
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

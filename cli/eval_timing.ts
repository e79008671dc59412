/**
 * The timing settings `kcoral eval` and the MCP tool `evaluate_kernel` send: only those the caller
 * named, so that the runtime fills in the rest (adaptive rounds on a GPU unless `repeat` alone or
 * `adaptive: false` asks for a fixed count).
 *
 * @module
 */
import type { EvaluateTiming } from "../client/mod.ts";

/**
 * `settings` without the ones left `undefined`.
 *
 * @example
 * ```ts
 * import { evaluateTiming } from "./eval_timing.ts";
 *
 * const timing = evaluateTiming({ repeat: 50, adaptive: undefined });
 * if (JSON.stringify(timing) !== '{"repeat":50}') throw new Error("unnamed settings sent");
 * ```
 */
export function evaluateTiming(
  settings: { warmup?: number; repeat?: number; adaptive?: boolean },
): EvaluateTiming {
  return {
    ...(settings.warmup === undefined ? {} : { warmup: settings.warmup }),
    ...(settings.repeat === undefined ? {} : { repeat: settings.repeat }),
    ...(settings.adaptive === undefined ? {} : { adaptive: settings.adaptive }),
  };
}

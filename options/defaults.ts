/**
 * Defaults of options-table entries: fixed values, or values computed from the environment.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { resolveOptionDefault } from "./defaults.ts";
 *
 * assert.equal(resolveOptionDefault(8, {}), 8);
 * assert.equal(resolveOptionDefault((env) => env.HOME ?? "/tmp", { HOME: "/h" }), "/h");
 * ```
 *
 * @module
 */
import type { Env, EnvDefault } from "./spec.ts";

/**
 * The value of a default in `env`. Arrays are copied, so that a configuration never shares
 * (and never mutates) the table's default.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { resolveOptionDefault } from "./defaults.ts";
 *
 * const table = [0] as const;
 * const gpus = resolveOptionDefault(table, {});
 * assert.ok(gpus !== table && gpus[0] === 0);
 * ```
 */
export function resolveOptionDefault<T>(value: T | EnvDefault<T>, env: Env): T {
  const resolved = typeof value === "function" ? (value as EnvDefault<T>)(env) : value;
  return (Array.isArray(resolved) ? [...resolved] : resolved) as T;
}

/**
 * The process's environment variables, or none where reading them is not allowed.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { processEnv } from "./defaults.ts";
 *
 * assert.equal(typeof processEnv(), "object");
 * ```
 */
export function processEnv(): Env {
  try {
    return Deno.env.toObject();
  } catch {
    return {};
  }
}

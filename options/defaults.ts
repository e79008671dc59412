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

/**
 * The process's environment as far as this process may read it without asking: each variable
 * is read when it is used, and only where `--allow-env` (whole or naming it) granted it already,
 * so a client command run with narrow permissions never prompts and never fails for a variable
 * it was not given (`kcoral health --allow-net=HOST:PORT` reads no variable at all).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { grantedEnv } from "./defaults.ts";
 *
 * const env = grantedEnv();
 * assert.equal(env.KCORAL_SURELY_UNSET_VARIABLE, undefined);
 * assert.equal(env.PATH, Deno.env.get("PATH")); // this test runs with -A
 * ```
 */
export function grantedEnv(): Env {
  const read = (name: string | symbol): string | undefined => {
    if (typeof name !== "string") return undefined;
    try {
      if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") {
        return undefined;
      }
      return Deno.env.get(name);
    } catch {
      return undefined;
    }
  };
  return new Proxy({} as Env, {
    get: (_target, name) => read(name),
    has: (_target, name) => read(name) !== undefined,
    ownKeys: () => {
      try {
        if (Deno.permissions.querySync({ name: "env" }).state === "granted") {
          return Object.keys(Deno.env.toObject());
        }
      } catch {
        // not allowed: no names
      }
      return [];
    },
    getOwnPropertyDescriptor: (_target, name) => {
      const value = read(name);
      return value === undefined
        ? undefined
        : { value, enumerable: true, configurable: true, writable: false };
    },
  });
}

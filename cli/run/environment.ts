/**
 * `-e NAME[=VALUE]` / `--env NAME[=VALUE]` entries of `kcoral run`.
 *
 * @module
 */

/** Variables only the worker may set; `-e` refuses them (the runner does too). */
export const MANAGED_VARIABLES: readonly string[] = ["CUDA_VISIBLE_DEVICES", "KCORAL_DIR"];

const _IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Turn `-e` entries into the remote environment overrides.
 *
 * Each entry is split at its first `=`. The name must be an identifier and not a managed
 * variable; `NAME` alone copies the value from `local` (unset is an error); values must not
 * contain NUL; `NAME=` sets an empty string; the last entry for a name wins (it keeps the
 * position of its first entry).
 *
 * @example
 * ```ts
 * import { parseEnvEntries } from "./environment.ts";
 * parseEnvEntries(["MODE=debug", "HOME"], { HOME: "/home/me" });
 * // { env: { MODE: "debug", HOME: "/home/me" } }
 * ```
 */
export function parseEnvEntries(
  entries: readonly string[],
  local: Record<string, string | undefined>,
): { env: Record<string, string> } | { error: string } {
  const values = new Map<string, string>();
  for (const entry of entries) {
    const equals = entry.indexOf("=");
    const name = equals === -1 ? entry : entry.slice(0, equals);
    if (!_IDENTIFIER.test(name)) return { error: "environment variable names must be identifiers" };
    if (MANAGED_VARIABLES.includes(name)) {
      return { error: `${name} is managed by the remote worker` };
    }
    let value = entry.slice(equals + 1);
    if (equals === -1) {
      const copied = Object.hasOwn(local, name) ? local[name] : undefined;
      if (typeof copied !== "string") {
        return { error: `local environment variable ${name} is not set` };
      }
      value = copied;
    }
    if (value.includes("\0")) return { error: `environment variable ${name} contains NUL` };
    values.set(name, value);
  }
  return { env: Object.fromEntries(values) };
}

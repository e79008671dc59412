/**
 * The version of this package, as `kcoral --version` (and each sub-command's `--version`)
 * prints it: read from the package's own `deno.json`, so it cannot drift from the published one.
 *
 * @example
 * ```ts
 * import { KCORAL_VERSION, versionLine } from "./version.ts";
 *
 * if (!/^\d+\.\d+\.\d+/.test(KCORAL_VERSION)) throw new Error(KCORAL_VERSION);
 * if (versionLine() !== `kcoral ${KCORAL_VERSION}`) throw new Error();
 * ```
 *
 * @module
 */
import manifest from "../deno.json" with { type: "json" };

/** The package version (`deno.json`'s `version`). */
export const KCORAL_VERSION: string = manifest.version;

/**
 * The line `--version` prints: `kcoral 0.1.0`.
 *
 * @example
 * ```ts
 * import { versionLine } from "./version.ts";
 *
 * if (!versionLine().startsWith("kcoral ")) throw new Error();
 * ```
 */
export function versionLine(): string {
  return `kcoral ${KCORAL_VERSION}`;
}

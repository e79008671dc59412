/**
 * The inputs `run_python` and `profile` send, built as `kcoral run --send` builds them: local
 * files and directories (relative to the directory `kcoral mcp` was started in) and,
 * optionally, Python source text given inline, stored as `main.py` in the remote working
 * directory. Environment overrides follow `kcoral run -e`'s rules.
 *
 * @module
 */
import { parseEnvEntries } from "../run/environment.ts";
import { packInputs } from "../run/pack.ts";
import { ToolFailure } from "./call.ts";

/** The remote name of inline `source`. */
export const SOURCE_NAME = "main.py";

/** What to send. */
export interface SendSpec {
  /** Python source text, stored as {@linkcode SOURCE_NAME}. */
  source?: string;
  /** Local files and directories, as `kcoral run --send`. */
  send: readonly string[];
}

/**
 * The tar archive of `spec`: the `send` selections and `main.py` (the inline source), with
 * `kcoral run`'s layout and refusals (a `main.py` also sent is a conflict).
 *
 * @throws {PackError} for a refused selection (missing, a symlink, a conflict).
 *
 * @example
 * ```ts
 * import { packSendSpec } from "./inputs.ts";
 *
 * const tar = await packSendSpec({ source: "print(1)\n", send: [] }, Deno.cwd());
 * if (!new TextDecoder().decode(tar.subarray(0, 7)).startsWith("main.py")) throw new Error();
 * ```
 */
export async function packSendSpec(spec: SendSpec, cwd: string): Promise<Uint8Array> {
  // The source never touches the disk: `kcoral mcp` needs no write access for it.
  const inline = spec.source === undefined
    ? undefined
    : new Map([[SOURCE_NAME, new TextEncoder().encode(spec.source)]]);
  return (await packInputs(spec.send, cwd, { inline })).tar;
}

/**
 * Check environment overrides as `kcoral run -e NAME=VALUE` does: identifier names, no
 * managed variable (`CUDA_VISIBLE_DEVICES`, `KCORAL_DIR`), no NUL.
 *
 * @throws {ToolFailure} kind `invalid_input` naming the rule broken.
 *
 * @example
 * ```ts
 * import { checkEnvironment } from "./inputs.ts";
 *
 * checkEnvironment({ MODE: "debug" }); // { MODE: "debug" }
 * const message = (() => {
 *   try {
 *     checkEnvironment({ KCORAL_DIR: "/x" });
 *   } catch (error) {
 *     return (error as Error).message;
 *   }
 * })();
 * if (message !== "env: KCORAL_DIR is managed by the remote worker") throw new Error(message);
 * ```
 */
export function checkEnvironment(env: Record<string, string>): Record<string, string> {
  if (Object.keys(env).some((name) => name.includes("=") || name === "")) {
    throw new ToolFailure("invalid_input", "env: environment variable names must be identifiers");
  }
  const checked = parseEnvEntries(
    Object.entries(env).map(([name, value]) => `${name}=${value}`),
    {},
  );
  if ("error" in checked) throw new ToolFailure("invalid_input", `env: ${checked.error}`);
  return checked.env;
}

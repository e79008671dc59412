/**
 * The `--help` line of an options-table entry: the flag with its placeholder, and the help text
 * followed by `(repeatable)`, the default the command line uses and the environment variable.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { describeOption, optionFlags } from "./help.ts";
 *
 * const port = {
 *   flag: "--port", env: "EXAMPLE_PORT", type: "int", default: 9000, placeholder: "port",
 *   help: "listen port",
 * } as const;
 * assert.equal(optionFlags(port), "--port <port>");
 * assert.equal(describeOption(port, {}), "listen port (default 9000) [env: EXAMPLE_PORT]");
 * ```
 *
 * @module
 */
import { resolveOptionDefault } from "./defaults.ts";
import type { Env, OptionSpec } from "./spec.ts";

const MIB = 1024 * 1024;
const GIB = 1024 * MIB;

/**
 * The flag as `--help` shows it: `--port <port>`, or the bare flag of a boolean option.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { optionFlags } from "./help.ts";
 *
 * assert.ok(
 *   optionFlags({ flag: "--no-log-console", type: "boolean", default: true, help: "" }) ===
 *     "--no-log-console",
 * );
 * ```
 */
export function optionFlags(spec: OptionSpec): string {
  return spec.type === "boolean" ? spec.flag : `${spec.flag} <${spec.placeholder ?? "value"}>`;
}

/**
 * The default the command line uses, as `--help` shows it; `undefined` where there is none to
 * show (booleans, `null`, empty strings and lists). Lists are joined with their separator;
 * byte sizes get their size in MiB or GiB.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { optionDefaultText } from "./help.ts";
 *
 * const size = {
 *   flag: "--max-bytes", type: "int", unit: "bytes", default: 268435456, help: "",
 * } as const;
 * assert.equal(optionDefaultText(size, {}), "268435456 = 256 MiB");
 * const log = {
 *   flag: "--log-dir", type: "string", nullable: true, default: null, commandDefault: "logs",
 *   help: "",
 * } as const;
 * assert.equal(optionDefaultText(log, {}), "logs");
 * ```
 */
export function optionDefaultText(spec: OptionSpec, env: Env): string | undefined {
  if (spec.type === "boolean") return undefined;
  const value: unknown = resolveOptionDefault(spec.commandDefault ?? spec.default, env);
  if (value === null || value === "") return undefined;
  if (Array.isArray(value)) {
    return value.length === 0 ? undefined : value.join(spec.type === "list" ? spec.separator : ",");
  }
  if (spec.type === "int" && spec.unit === "bytes" && typeof value === "number") {
    const size = value >= GIB && value % GIB === 0
      ? `${value / GIB} GiB`
      : value >= MIB && value % MIB === 0
      ? `${value / MIB} MiB`
      : undefined;
    if (size !== undefined) return `${value} = ${size}`;
  }
  return String(value);
}

/**
 * The description `--help` shows for an option: its help text, `(repeatable)` for a repeated
 * flag, `(default ...)` from {@linkcode optionDefaultText} and `[env: NAME]`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { describeOption } from "./help.ts";
 *
 * const paths = {
 *   flag: "--path", type: "list", items: { type: "string" }, default: [], help: "extra path",
 * } as const;
 * assert.equal(describeOption(paths, {}), "extra path (repeatable)");
 * ```
 */
export function describeOption(spec: OptionSpec, env: Env): string {
  const parts = [spec.help];
  if (spec.type === "list" && spec.separator === undefined) parts.push("(repeatable)");
  const shown = optionDefaultText(spec, env);
  if (shown !== undefined) parts.push(`(default ${shown})`);
  if (spec.env !== undefined) parts.push(`[env: ${spec.env}]`);
  return parts.join(" ");
}

/**
 * Command-line options declared once, as a table: each entry gives the configuration field, the
 * flag, the environment variable, the kind of value with its limits, the default and the help
 * text; the configuration type, its validation, the command line (flag > environment variable >
 * default) and `--help` are all produced from the table. `kcoral server` is built on it, and
 * `kcoral router` uses the same mechanism.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { type OptionTable, optionTableSchema } from "./mod.ts";
 *
 * const table = {
 *   port: { flag: "--port", type: "int", min: 1, max: 65535, default: 9000, help: "port" },
 * } as const satisfies OptionTable;
 * assert.equal(optionTableSchema(table).defaults().port, 9000);
 * ```
 *
 * @module
 */

export * from "./command.ts";
export * from "./defaults.ts";
export * from "./help.ts";
export * from "./schema.ts";
export * from "./spec.ts";
export * from "./text.ts";

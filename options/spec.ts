/**
 * The shape of an options table: one plain-data entry per option, keyed by the configuration
 * field it sets, giving the command-line flag, the environment variable, the kind of value and
 * its limits, the default and the help text. Everything else (the configuration type, the
 * validating schema, the command-line options, their help and the environment handling) is
 * derived from such a table by the other modules of this folder.
 *
 * A table is written `as const satisfies OptionTable` so that {@linkcode OptionTableValues} can
 * read the value types from it (and so that JSR's fast type check accepts it without a
 * hand-written type).
 *
 * @example A table and the configuration type it defines
 * ```ts
 * import assert from "node:assert/strict";
 * import type { OptionTable, OptionTableValues } from "./spec.ts";
 *
 * const exampleOptions = {
 *   port: { flag: "--port", env: "EXAMPLE_PORT", type: "int", min: 1, max: 65535, default: 9000,
 *     placeholder: "port", help: "listen port" },
 *   mode: { flag: "--mode", type: "choice", choices: ["fast", "safe"], default: "safe",
 *     help: "how to run" },
 * } as const satisfies OptionTable;
 *
 * const config: OptionTableValues<typeof exampleOptions> = { port: 9000, mode: "fast" };
 * assert.equal(config.port, 9000);
 * ```
 *
 * @module
 */

/** Environment variables, as `Deno.env.toObject()` gives them. */
export type Env = Readonly<Record<string, string | undefined>>;

/** A default computed from the environment (e.g. a directory under `$HOME`). */
export type EnvDefault<T> = (env: Env) => T;

/** What every option gives, whatever the kind of its value. */
export interface OptionBase {
  /**
   * The command-line flag, e.g. `"--max-timeout-seconds"`. A boolean option whose flag starts
   * with `--no-` is a negation: giving the flag sets the field to `false` (`--no-log-console`).
   */
  readonly flag: `--${string}`;
  /** The environment variable read when the flag is not given (an explicit flag wins). */
  readonly env?: string;
  /** One line for `--help`; the default, `(repeatable)` and the variable are added to it. */
  readonly help: string;
  /** The name of the value in `--help` (`"n"` shows `--num-workers <n>`); `"value"` if absent. */
  readonly placeholder?: string;
  /** Left out of `--help` (test-only or advanced options); still accepted. */
  readonly hidden?: boolean;
  /**
   * The field of another option of the same command line that must be set (by flag or
   * variable) for this one to be accepted; otherwise the command line is malformed (`--NAME
   * requires --OTHER`, exit 2).
   */
  readonly requires?: string;
  /** `null` is a valid value (it means "disabled" or "not set"). */
  readonly nullable?: boolean;
}

/** Limits of a numeric value; each names its own message (`must be at least 1`, ...). */
export interface NumberLimits {
  /** Smallest accepted value. */
  readonly min?: number;
  /** Largest accepted value. */
  readonly max?: number;
  /** Values must be greater than this (`0` reads "must be positive"). */
  readonly above?: number;
}

/** A whole number (`--port 8000`); the command line accepts an optional sign and digits. */
export interface IntValue extends NumberLimits {
  /** The kind of value. */
  readonly type: "int";
  /** `"bytes"` adds the size in MiB or GiB to the default shown in `--help`. */
  readonly unit?: "bytes";
}

/** A finite number (`--default-timeout-seconds 2.5`). */
export interface NumberValue extends NumberLimits {
  /** The kind of value. */
  readonly type: "number";
}

/** A string (`--python /usr/bin/python3`). */
export interface StringValue {
  /** The kind of value. */
  readonly type: "string";
  /** The empty string is refused (`must not be empty`). */
  readonly nonEmpty?: boolean;
  /** The empty string means `null` (`--log-dir ''` disables logging); needs `nullable`. */
  readonly emptyIsNull?: boolean;
}

/** One of a fixed set of strings (`--device gpu`). */
export interface ChoiceValue {
  /** The kind of value. */
  readonly type: "choice";
  /** The accepted strings. */
  readonly choices: readonly [string, ...string[]];
}

/** A switch: `--simulate-gpus` sets `true`; a `--no-...` flag sets `false`. */
export interface BooleanValue {
  /** The kind of value. */
  readonly type: "boolean";
}

/** The value of one element of a list. */
export type ListItem = IntValue | NumberValue | StringValue;

/**
 * A list. With a `separator` the flag takes one argument split on it (`--gpus 0,1`; blank
 * elements are skipped); without, the flag is repeated (`--sandbox-readonly-path` twice).
 */
export interface ListValue {
  /** The kind of value. */
  readonly type: "list";
  /** The kind of each element. */
  readonly items: ListItem;
  /** Splits one argument into elements; absent: one element per repetition of the flag. */
  readonly separator?: string;
  /** How an unreadable argument is named in the error (`"GPU id list"`). */
  readonly listName?: string;
}

/** One option: a flag and what it sets, with the default of the configuration field. */
export type OptionSpec =
  | (OptionBase & IntValue & DefaultOf<number>)
  | (OptionBase & NumberValue & DefaultOf<number>)
  | (OptionBase & StringValue & DefaultOf<string | null>)
  | (OptionBase & ChoiceValue & DefaultOf<string>)
  | (OptionBase & BooleanValue & DefaultOf<boolean>)
  | (OptionBase & ListValue & DefaultOf<readonly (number | string)[]>);

/** The default of an option: the configuration's, and the command line's where it differs. */
export interface DefaultOf<T> {
  /** The field's value when it is given nowhere (fixed, or computed from the environment). */
  readonly default: T | EnvDefault<T>;
  /**
   * The command line's own default where it differs from the configuration's (`--log-dir`
   * defaults to `logs` on the command line, to `null` in a configuration object). A command
   * line always sets fields that have one, as it does boolean fields.
   */
  readonly commandDefault?: T | EnvDefault<T>;
}

/** An options table: configuration field name → option. Entry order is `--help` order. */
export type OptionTable = { readonly [field: string]: OptionSpec };

/** The TypeScript type of a single (non-list) value of kind `S`. */
export type ScalarOf<S> = S extends { readonly type: "int" | "number" } ? number
  : S extends { readonly type: "string" } ? string
  : S extends { readonly type: "boolean" } ? boolean
  : S extends { readonly type: "choice"; readonly choices: readonly (infer C)[] } ? C
  : never;

/** The TypeScript type of the value an option sets. */
export type OptionValue<S> =
  | (S extends { readonly type: "list"; readonly items: infer I } ? ScalarOf<I>[] : ScalarOf<S>)
  | (S extends { readonly nullable: true } ? null : never);

/** The configuration a table describes: one field per entry, of the entry's value type. */
export type OptionTableValues<T extends OptionTable> = {
  -readonly [K in keyof T]: OptionValue<T[K]>;
};

/** The fields of a table (its keys), as strings. */
export type OptionField<T extends OptionTable> = keyof T & string;

/**
 * A small option scanner with the semantics of Python's argparse as upstream KCoral
 * configures it for `kcoral run TOOL` (`allow_abbrev=False`, no positionals), so that the
 * same command lines succeed or fail with the same messages:
 *
 * - `--name value`, `--name=value`, `-e value`, `-evalue`, `-e=value`;
 * - no abbreviations of long options (`--time 5` is unrecognized, not `--timeout`);
 * - a value may not look like an option (`--send -x` is "expected one argument"), except
 *   negative numbers and words containing a space;
 * - actions run in order: `--port abc --help` fails, `--help --port abc` shows help;
 * - then missing required options, then unrecognized arguments.
 *
 * @module
 */

import { parsePythonInt } from "./pyint.ts";
import { pyStrRepr } from "../../protocol/python_repr.ts";

/** One option of a scanned command line. */
export interface OptionSpec {
  /** Option strings, short first, e.g. `["-e", "--env"]`. */
  strings: readonly string[];
  /** Key of the value in the scan result. */
  dest: string;
  /**
   * `help` takes no value; `store` keeps the last value; `append` collects every value;
   * `store_true` takes no value and stores `"true"` (argparse's `store_true`).
   */
  action: "help" | "store" | "append" | "store_true";
  /** Convert the value as Python's `int()` does. */
  int?: boolean;
  /** Report "the following arguments are required" when absent. */
  required?: boolean;
}

/** Values found by {@linkcode scanOptions}. */
export interface ScannedOptions {
  /** Discriminant. */
  kind: "ok";
  /** Last value of each `store` option that was given (a bigint for `int` options). */
  stores: Map<string, string | bigint>;
  /** Every value of each `append` option, in order (absent when never given). */
  appends: Map<string, string[]>;
}

/** Result of {@linkcode scanOptions}: values, a help request, or an argparse-style error. */
export type ScanResult = ScannedOptions | { kind: "help" } | { kind: "error"; message: string };

interface _Found {
  spec?: OptionSpec;
  optionString: string;
  explicit?: string;
}

const _NEGATIVE_NUMBER = /^-\p{Nd}+\n?$|^-\p{Nd}*\.\p{Nd}+\n?$/u;

/**
 * Scan `tokens` (the KCoral options before the first `--`) against `specs`.
 *
 * @example
 * ```ts
 * import { scanOptions } from "./argscan.ts";
 * const result = scanOptions(
 *   [{ strings: ["--port"], dest: "port", action: "store", int: true }],
 *   ["--port=9000"],
 * );
 * if (result.kind === "ok") result.stores.get("port"); // 9000n
 * ```
 */
export function scanOptions(specs: readonly OptionSpec[], tokens: readonly string[]): ScanResult {
  const byString = new Map<string, OptionSpec>();
  for (const spec of specs) for (const string of spec.strings) byString.set(string, spec);
  const found = tokens.map((token) => _classify(token, byString));
  const stores = new Map<string, string | bigint>();
  const appends = new Map<string, string[]>();
  const seen = new Set<OptionSpec>();
  const extras: string[] = [];
  let index = 0;
  while (index < tokens.length) {
    const current = found[index];
    if (current === undefined || current.spec === undefined) {
      extras.push(tokens[index]);
      index += 1;
      continue;
    }
    const next = found[index + 1] === undefined ? tokens[index + 1] : null;
    const consumed = _consume(current, next, byString);
    if ("message" in consumed) return { kind: "error", message: consumed.message };
    for (const [spec, value] of consumed.actions) {
      seen.add(spec);
      if (spec.action === "help") return { kind: "help" };
      if (spec.action === "store_true") {
        stores.set(spec.dest, "true");
        continue;
      }
      if (spec.int) {
        const number = parsePythonInt(value!);
        if (number === undefined) {
          return {
            kind: "error",
            message: `argument ${_name(spec)}: invalid int value: ${pyStrRepr(value!)}`,
          };
        }
        stores.set(spec.dest, number);
      } else if (spec.action === "append") {
        appends.set(spec.dest, [...(appends.get(spec.dest) ?? []), value!]);
      } else {
        stores.set(spec.dest, value!);
      }
    }
    index += consumed.width;
  }
  const missing = specs.filter((spec) => spec.required && !seen.has(spec)).map(_name);
  if (missing.length > 0) {
    return {
      kind: "error",
      message: `the following arguments are required: ${missing.join(", ")}`,
    };
  }
  if (extras.length > 0) {
    return { kind: "error", message: `unrecognized arguments: ${extras.join(" ")}` };
  }
  return { kind: "ok", stores, appends };
}

// Consume one option token (a short-option cluster such as `-he` included). `next` is the
// following token when it can serve as a value (argparse pattern "A"), else null.
function _consume(
  found: _Found,
  next: string | null | undefined,
  byString: Map<string, OptionSpec>,
): { actions: [OptionSpec, string | undefined][]; width: number } | { message: string } {
  const actions: [OptionSpec, string | undefined][] = [];
  let spec = found.spec!;
  let optionString = found.optionString;
  let explicit = found.explicit;
  while (explicit !== undefined) {
    if (spec.action !== "help" && spec.action !== "store_true") {
      actions.push([spec, explicit]);
      return { actions, width: 1 };
    }
    const ignored = {
      message: `argument ${_name(spec)}: ignored explicit argument ${pyStrRepr(explicit)}`,
    };
    if (optionString[1] === "-" || explicit === "") return ignored;
    actions.push([spec, undefined]);
    const [first, ...rest] = Array.from(explicit);
    optionString = "-" + first;
    const following = byString.get(optionString);
    if (following === undefined) return ignored;
    spec = following;
    explicit = rest.length > 0 ? rest.join("") : undefined;
  }
  if (spec.action === "help" || spec.action === "store_true") {
    actions.push([spec, undefined]);
    return { actions, width: 1 };
  }
  if (typeof next !== "string") {
    return { message: `argument ${_name(spec)}: expected one argument` };
  }
  actions.push([spec, next]);
  return { actions, width: 2 };
}

/**
 * Whether argparse would take `token` as a positional argument rather than an option,
 * given the parser's option strings: not starting with `-`, exactly `-`, a negative
 * number, or an unknown option containing a space.
 *
 * @example
 * ```ts
 * import { isPositional } from "./argscan.ts";
 * isPositional("python", ["-h", "--help"]); // true
 * isPositional("-1", ["-h", "--help"]); // true
 * isPositional("--bogus", ["-h", "--help"]); // false
 * ```
 */
export function isPositional(token: string, optionStrings: readonly string[]): boolean {
  const byString = new Map<string, OptionSpec>();
  for (const string of optionStrings) {
    byString.set(string, { strings: [string], dest: string, action: "store" });
  }
  return _classify(token, byString) === undefined;
}

// argparse's _parse_optional: undefined for a positional-looking token ("A"), else the
// option it names (spec undefined for an unknown option).
function _classify(token: string, byString: Map<string, OptionSpec>): _Found | undefined {
  if (token === "" || token[0] !== "-") return undefined;
  const exact = byString.get(token);
  if (exact !== undefined) return { spec: exact, optionString: token };
  if (token.length === 1) return undefined;
  const equals = token.indexOf("=");
  if (equals !== -1) {
    const spec = byString.get(token.slice(0, equals));
    if (spec !== undefined) {
      return { spec, optionString: token.slice(0, equals), explicit: token.slice(equals + 1) };
    }
  }
  if (token[1] !== "-") {
    const spec = byString.get(token.slice(0, 2));
    if (spec !== undefined) {
      return { spec, optionString: token.slice(0, 2), explicit: token.slice(2) };
    }
  }
  if (_NEGATIVE_NUMBER.test(token) || token.includes(" ")) return undefined;
  return { optionString: token };
}

function _name(spec: OptionSpec): string {
  return spec.strings.join("/");
}

/**
 * Tool-specific checks of the native arguments forwarded after the first `--`.
 *
 * @module
 */

import type { ToolName } from "./tools.ts";

const _PYTHON_REQUIRED =
  "a script, -c command, or -m module is required; stdin execution is unsupported";
const _SEPARATE = "separate profiler options from the application with another '--'";
const _EXPECTED = "expected profiler options followed by '-- application [args]'";

/**
 * Check the forwarded arguments of `tool`; returns the error message, or undefined.
 *
 * @example
 * ```ts
 * import { validateToolArguments } from "./validators.ts";
 * validateToolArguments("python", ["-i", "check.py"]);
 * // "interactive Python execution is unsupported"
 * ```
 */
export function validateToolArguments(
  tool: ToolName,
  forwarded: readonly string[],
): string | undefined {
  switch (tool) {
    case "python":
      return validatePythonArguments(forwarded);
    case "ncu":
      return validateProfilerArguments(forwarded, {
        managed: ["--export", "--import", "--mode", "--config-file", "--config-file-path"],
        short: ["-o", "-i"],
      });
    case "run-iket":
      return validateProfilerArguments(forwarded, {
        managed: ["--output-dir", "--working-dir"],
        short: ["-o"],
        subcommand: "profile",
      });
    default:
      return undefined;
  }
}

/**
 * Walk Python's own option syntax until the entry point: a script, `-c CODE` or
 * `-m MODULE` is required; `-i` (interactive) and `-` (stdin) are refused; `-c`, `-m`, `-W`
 * and `-X` need a value (attached or the next token); `--check-hash-based-pycs` takes the
 * next token; other long options are skipped. Everything after the entry point belongs to
 * the program. Returns the error message, or undefined.
 *
 * @example
 * ```ts
 * import { validatePythonArguments } from "./validators.ts";
 * validatePythonArguments(["-Wignore", "-X", "dev", "-m", "module", "-i"]); // undefined
 * validatePythonArguments(["-c"]); // "Python -c requires an argument"
 * ```
 */
export function validatePythonArguments(forwarded: readonly string[]): string | undefined {
  let index = 0;
  const next = (): string | undefined => forwarded[index++];
  for (let token = next(); token !== undefined; token = next()) {
    if (token === "--") return (next() ?? "-") !== "-" ? undefined : _PYTHON_REQUIRED;
    if (token === "-") return _PYTHON_REQUIRED;
    if (!token.startsWith("-")) return undefined;
    if (token === "--check-hash-based-pycs") {
      next();
      continue;
    }
    if (token.startsWith("--")) continue;
    const letters = Array.from(token.slice(1));
    for (const [position, letter] of letters.entries()) {
      if (letter === "i") return "interactive Python execution is unsupported";
      if ("cmWX".includes(letter)) {
        const attached = letters.slice(position + 1).join("");
        const value = attached !== "" ? attached : next();
        if (value === undefined) return `Python -${letter} requires an argument`;
        if (letter === "c" || letter === "m") return undefined;
        break;
      }
    }
  }
  return _PYTHON_REQUIRED;
}

/** Which native options a profiler manages itself. */
export interface ProfilerRules {
  /** Long options refused, with every abbreviation (a token that is a prefix of one). */
  managed: readonly string[];
  /** Short options refused as a token prefix (`-o`, `-ofile`). */
  short: readonly string[];
  /** A word that must appear among the profiler options (`profile` for run-iket). */
  subcommand?: string;
}

/**
 * Check `PROFILER OPTIONS -- APPLICATION...`: the second `--` and a nonempty application
 * are required (and `rules.subcommand` among the options); options that are a prefix of a
 * managed long option (up to any `=`), or start with a managed short option, are refused.
 * Returns the error message, or undefined.
 *
 * @example
 * ```ts
 * import { validateProfilerArguments } from "./validators.ts";
 * validateProfilerArguments(["--exp=x", "--", "app"], { managed: ["--export"], short: [] });
 * // "--exp conflicts with managed remote capture paths or mode"
 * ```
 */
export function validateProfilerArguments(
  forwarded: readonly string[],
  rules: ProfilerRules,
): string | undefined {
  const boundary = forwarded.indexOf("--");
  if (boundary === -1) return _SEPARATE;
  const options = forwarded.slice(0, boundary);
  if (boundary === forwarded.length - 1) return _EXPECTED;
  if (rules.subcommand !== undefined && !options.includes(rules.subcommand)) return _EXPECTED;
  for (const token of options) {
    const option = token.split("=", 1)[0];
    const conflicts = option.startsWith("--")
      ? rules.managed.some((flag) => flag.startsWith(option))
      : rules.short.some((flag) => option.startsWith(flag));
    if (conflicts) return `${option} conflicts with managed remote capture paths or mode`;
  }
  return undefined;
}

/**
 * Path rules shared by `--fetch` validation and `--send` packing.
 *
 * @module
 */

import { pyStrRepr } from "../../protocol/python_repr.ts";

/**
 * Check that `name` is a relative POSIX path and return its components.
 *
 * Rejects the empty string, absolute paths, backslashes, NUL, any `..` component and names
 * without a component (`.`), like the uploaded runner does. Returns the message
 * `expected a relative file path: 'NAME'` (Python repr) for a rejected name.
 *
 * @example
 * ```ts
 * import { relativeParts } from "./paths.ts";
 * relativeParts("./a//b"); // { parts: ["a", "b"] }
 * relativeParts("../x"); // { error: "expected a relative file path: '../x'" }
 * ```
 */
export function relativeParts(name: string): { parts: string[] } | { error: string } {
  const parts = name.split("/").filter((part) => part !== "" && part !== ".");
  const valid = name !== "" && !name.startsWith("/") && !name.includes("\\") &&
    !name.includes("\0") && parts.length > 0 && !parts.includes("..");
  return valid ? { parts } : { error: `expected a relative file path: ${pyStrRepr(name)}` };
}

/**
 * Normalize a local path the way Python's `str(pathlib.Path(path))` does: repeated and
 * trailing slashes and `.` components are dropped, exactly two leading slashes are kept,
 * and an empty result is `.`. Used so `--send dir/` behaves like `--send dir` and so
 * messages show the same path upstream shows.
 *
 * @example
 * ```ts
 * import { normalizePath } from "./paths.ts";
 * normalizePath("experiment/"); // "experiment"
 * normalizePath("./a//b/."); // "a/b"
 * normalizePath(""); // "."
 * ```
 */
export function normalizePath(path: string): string {
  const root = path.startsWith("//") && !path.startsWith("///")
    ? "//"
    : path.startsWith("/")
    ? "/"
    : "";
  const parts = path.split("/").filter((part) => part !== "" && part !== ".");
  const joined = root + parts.join("/");
  return joined === "" ? "." : joined;
}

/**
 * Compare two strings by Unicode code point, as Python compares `str` values.
 *
 * @example
 * ```ts
 * import { compareCodePoints } from "./paths.ts";
 * ["b", "a", "B"].sort(compareCodePoints); // ["B", "a", "b"]
 * ```
 */
export function compareCodePoints(a: string, b: string): number {
  const left = Array.from(a, (char) => char.codePointAt(0)!);
  const right = Array.from(b, (char) => char.codePointAt(0)!);
  for (let index = 0; index < Math.min(left.length, right.length); index++) {
    if (left[index] !== right[index]) return left[index] - right[index];
  }
  return left.length - right.length;
}

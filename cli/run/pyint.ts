/**
 * Integer option values parsed like Python's `int(text)` (argparse `type=int`).
 *
 * @module
 */

// Python's str.isspace() characters; int() strips them around the number.
const _SPACE = "[\\t\\n\\v\\f\\r \\x1c-\\x1f\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029" +
  "\\u202f\\u205f\\u3000]*";
const _INTEGER = new RegExp(`^${_SPACE}([+-]?)([0-9]+(?:_[0-9]+)*)${_SPACE}$`);

/**
 * Parse `text` as Python's `int(text)` does for ASCII digits: optional surrounding
 * whitespace, an optional sign, digits with single underscores between them. Returns
 * `undefined` when Python would raise `ValueError`. Non-ASCII decimal digits, which
 * Python also accepts, are refused.
 *
 * @example
 * ```ts
 * import { parsePythonInt } from "./pyint.ts";
 * parsePythonInt("+80"); // 80n
 * parsePythonInt("1_000"); // 1000n
 * parsePythonInt("1.5"); // undefined
 * ```
 */
export function parsePythonInt(text: string): bigint | undefined {
  const match = _INTEGER.exec(text);
  if (match === null) return undefined;
  const magnitude = BigInt(match[2].replaceAll("_", ""));
  return match[1] === "-" ? -magnitude : magnitude;
}

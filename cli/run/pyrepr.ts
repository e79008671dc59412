/**
 * Python's `repr()` of a string, used where upstream KCoral messages embed `{name!r}`
 * (for example `expected a relative file path: '../x'`), so our messages match.
 *
 * @module
 */

// Python's str.isprintable() is false for categories C* and Z* except the ASCII space.
const _NON_PRINTABLE = /[\p{C}\p{Z}]/u;

/**
 * Format `text` as Python's `repr(str)` does: single quotes unless the text contains a
 * single quote and no double quote; `\\`, the quote, `\t`, `\n`, `\r` escaped; other
 * non-printable characters as `\xNN`, `\uNNNN` or `\UNNNNNNNN`.
 *
 * @example
 * ```ts
 * import { pyRepr } from "./pyrepr.ts";
 * pyRepr("../x"); // "'../x'"
 * pyRepr("it's"); // "\"it's\""
 * ```
 */
export function pyRepr(text: string): string {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  let out = quote;
  for (const char of text) {
    out += _escape(char, quote);
  }
  return out + quote;
}

function _escape(char: string, quote: string): string {
  if (char === "\\" || char === quote) return "\\" + char;
  if (char === "\t") return "\\t";
  if (char === "\n") return "\\n";
  if (char === "\r") return "\\r";
  if (char === " " || !_NON_PRINTABLE.test(char)) return char;
  const code = char.codePointAt(0)!;
  if (code < 0x100) return "\\x" + code.toString(16).padStart(2, "0");
  if (code < 0x10000) return "\\u" + code.toString(16).padStart(4, "0");
  return "\\U" + code.toString(16).padStart(8, "0");
}

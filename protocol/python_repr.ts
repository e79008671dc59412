/**
 * Python's `repr()` of strings, JSON-derived values and floats: upstream builds its 400 messages
 * with f-strings such as `f"duplicate instruction id: {id!r}"`, so byte-identical messages need
 * Python's rules.
 *
 * @module
 */

import { JsonFloat } from "./json_float.ts";

/** A value shaped like a Python JSON value, as produced by the typed parser. */
export type PyValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | JsonFloat
  | readonly PyValue[]
  | ReadonlyMap<string, PyValue>;

// Python's str.isprintable() is false for these general categories (space
// excepted). Lone surrogates (Cs) need the surrogate-aware path below.
const _NON_PRINTABLE = /[\p{Cc}\p{Cf}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/u;

function _hex(code: number, width: number): string {
  return code.toString(16).padStart(width, "0");
}

/**
 * `repr(s)` for a Python `str`: single quotes unless the text contains a single quote and no double
 * quote; `\\`, the quote, `\t`, `\n`, `\r` escaped; other non-printable characters (lone surrogates
 * included) as `\xNN`, `\uNNNN` or `\UNNNNNNNN`, exactly as CPython does.
 */
export function pyStrRepr(s: string): string {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  // Fast path: plain printable ASCII without quotes or backslashes.
  if (/^[\x20-\x7e]*$/.test(s) && !s.includes(quote) && !s.includes("\\")) {
    return quote + s + quote;
  }
  for (let i = 0; i < s.length; i++) {
    let code = s.charCodeAt(i);
    if (code >= 0xd800 && code <= 0xdbff && i + 1 < s.length) {
      const low = s.charCodeAt(i + 1);
      if (low >= 0xdc00 && low <= 0xdfff) {
        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
        i++;
      }
    }
    const ch = String.fromCodePoint(code);
    if (ch === quote || ch === "\\") out += "\\" + ch;
    else if (code === 0x09) out += "\\t";
    else if (code === 0x0a) out += "\\n";
    else if (code === 0x0d) out += "\\r";
    else if (code < 0x20 || code === 0x7f) out += "\\x" + _hex(code, 2);
    else if (code < 0x7f) out += ch;
    else if ((code >= 0xd800 && code <= 0xdfff) || _NON_PRINTABLE.test(ch)) {
      if (code <= 0xff) out += "\\x" + _hex(code, 2);
      else if (code <= 0xffff) out += "\\u" + _hex(code, 4);
      else out += "\\U" + _hex(code, 8);
    } else out += ch;
  }
  return out + quote;
}

/**
 * `repr(x)` for a Python float: shortest round-trip digits, fixed notation for decimal exponents in
 * [-4, 16), otherwise `d.ddde+XX`.
 */
export function pyFloatRepr(x: number): string {
  if (Number.isNaN(x)) return "nan";
  if (x === Infinity) return "inf";
  if (x === -Infinity) return "-inf";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const sign = x < 0 ? "-" : "";
  const [mantissa, exponentText] = Math.abs(x).toExponential().split("e");
  const digits = mantissa.replace(".", "");
  const exponent = Number(exponentText); // value = d.ddd × 10^exponent
  const decpt = exponent + 1; // value = 0.ddd × 10^decpt
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) return sign + "0." + "0".repeat(-decpt) + digits;
    if (decpt >= digits.length) return sign + digits + "0".repeat(decpt - digits.length) + ".0";
    return sign + digits.slice(0, decpt) + "." + digits.slice(decpt);
  }
  const body = digits.length === 1 ? digits : digits[0] + "." + digits.slice(1);
  const e = Math.abs(exponent);
  return sign + body + "e" + (exponent < 0 ? "-" : "+") + (e < 10 ? "0" + e : String(e));
}

/** `repr()` of a JSON-derived Python value (`None`, `True`, `[1, 'a']`, `{'k': 1.0}`). */
export function pyRepr(value: PyValue | undefined): string {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") {
    return Number.isInteger(value) ? String(value === 0 ? 0 : value) : pyFloatRepr(value);
  }
  if (typeof value === "bigint") return value.toString();
  if (typeof value === "string") return pyStrRepr(value);
  if (value instanceof JsonFloat) return pyFloatRepr(value.value);
  if (Array.isArray(value)) return "[" + value.map((item) => pyRepr(item)).join(", ") + "]";
  const entries: string[] = [];
  for (const [key, item] of value as ReadonlyMap<string, PyValue>) {
    entries.push(pyStrRepr(key) + ": " + pyRepr(item));
  }
  return "{" + entries.join(", ") + "}";
}

/** `repr(list_of_str)`, e.g. `['a', 'b']`. */
export function pyListRepr(items: readonly string[]): string {
  return "[" + items.map(pyStrRepr).join(", ") + "]";
}

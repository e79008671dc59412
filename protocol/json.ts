/**
 * Strict JSON with Python `json` semantics (spec protocol §2.3, §9 pitfalls 2 and 4), exactly as
 * upstream `strict_json_loads`: CPython's grammar and messages (positions in code points),
 * duplicate keys reported when their object closes, `NaN`/`Infinity` refused. Objects become `Map`s
 * so key order is the text's. One scanner state machine, so one module.
 *
 * @module
 */
import { decodeUtf8 } from "./utf8.ts";

import { JsonFloat } from "./json_float.ts";
import { pyStrRepr } from "./python_repr.ts";
import { codePointIndex } from "./python_str.ts";

/** A parsed JSON value. Integers outside ±(2^53-1) are `bigint`, never rounded. */
export type JsonValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | JsonValue[]
  | JsonObject;

/** A parsed JSON object: keys in exactly the order of the text. */
export type JsonObject = Map<string, JsonValue>;

/**
 * A parsed JSON value that also keeps Python's int/float distinction: float-spelled numbers (`1.0`,
 * `1e3`) are {@linkcode JsonFloat}, integers are `number` (or `bigint` beyond ±(2^53-1)).
 */
export type TypedJsonValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | JsonFloat
  | TypedJsonValue[]
  | TypedJsonObject;

/** A {@linkcode TypedJsonValue} object, keys in text order. */
export type TypedJsonObject = Map<string, TypedJsonValue>;

/**
 * Invalid JSON. `message` is upstream's exact text: `malformed JSON: <Python json error>`,
 * `duplicate JSON key: '<key>'` or `non-finite number NaN is not allowed`.
 */
export class JsonParseError extends Error {
  /** Create the error with upstream's message text. */
  constructor(message: string) {
    super(message);
    this.name = "JsonParseError";
  }
}

/** Deepest nesting accepted (CPython's scanner stops near its recursion limit of 1000). */
const _MAX_DEPTH = 1000;
/** Options of {@linkcode parseJson} and {@linkcode parseJsonTyped}. */
export interface ParseJsonOptions {
  /**
   * Integer literals with more digits are refused with Python's message (Python's own limit,
   * `sys.get_int_max_str_digits()`, is 4300: a program is parsed with it, as upstream does).
   * Default: no limit.
   */
  maxIntDigits?: number;
}

/**
 * Parse strict JSON exactly as upstream KCoral does.
 *
 * Rejects duplicate keys in any object, the `NaN`/`Infinity`/`-Infinity` literals, invalid UTF-8
 * (for bytes), a leading BOM and trailing garbage. Lone surrogate escapes are accepted (as in
 * Python). Integers beyond ±(2^53-1) become `bigint`; other numbers are `number`.
 */
export function parseJson(text: string | Uint8Array, options: ParseJsonOptions = {}): JsonValue {
  return new _Parser(_text(text), false, options.maxIntDigits).parseDocument() as JsonValue;
}

/**
 * Like {@linkcode parseJson}, but float-spelled numbers become {@linkcode JsonFloat} so Python's
 * `int`/`float` checks can be reproduced.
 */
export function parseJsonTyped(
  text: string | Uint8Array,
  options: ParseJsonOptions = {},
): TypedJsonValue {
  return new _Parser(_text(text), true, options.maxIntDigits).parseDocument();
}

function _text(text: string | Uint8Array): string {
  if (typeof text === "string") return text;
  try {
    return decodeUtf8(text, { keepBom: true });
  } catch {
    throw new JsonParseError(`malformed JSON: ${_utf8ErrorMessage(text)}`);
  }
}

/** Python's UnicodeDecodeError text for the first invalid UTF-8 sequence. */
function _utf8ErrorMessage(bytes: Uint8Array): string {
  const n = bytes.length;
  let i = 0;
  while (i < n) {
    const b = bytes[i];
    if (b < 0x80) {
      i++;
      continue;
    }
    let need: number;
    let lo = 0x80;
    let hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) need = 1;
    else if (b >= 0xe0 && b <= 0xef) {
      need = 2;
      if (b === 0xe0) lo = 0xa0;
      if (b === 0xed) hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
      need = 3;
      if (b === 0xf0) lo = 0x90;
      if (b === 0xf4) hi = 0x8f;
    } else return _decodeError(b, i, i + 1, "invalid start byte");
    let j = 1;
    for (; j <= need; j++) {
      if (i + j >= n) return _decodeError(b, i, n, "unexpected end of data");
      const c = bytes[i + j];
      const min = j === 1 ? lo : 0x80;
      const max = j === 1 ? hi : 0xbf;
      if (c < min || c > max) return _decodeError(b, i, i + j, "invalid continuation byte");
    }
    i += need + 1;
  }
  return "'utf-8' codec can't decode bytes"; // unreachable: TextDecoder rejected it
}

function _decodeError(byte: number, start: number, end: number, reason: string): string {
  if (end - start === 1) {
    const hex = byte.toString(16).padStart(2, "0");
    return `'utf-8' codec can't decode byte 0x${hex} in position ${start}: ${reason}`;
  }
  return `'utf-8' codec can't decode bytes in position ${start}-${end - 1}: ${reason}`;
}

// deno-lint-ignore no-control-regex
const _STRING_SPECIAL = /["\\\u0000-\u001f]/g;
// deno-lint-ignore no-control-regex
const _CONTROL = /[\u0000-\u001f]/;

/**
 * A string whose escapes the engine's own JSON decoder can turn into text (the same text as
 * CPython's strict `scanstring`), from just after its opening quote: `[text, end]`, or `null` for
 * an unterminated string, a control character or an invalid escape (the caller's scan then finds
 * the exact error). Source text is mostly escapes (`\n` on every line), which the scan joins piece
 * by piece; this finds the end and decodes it at once.
 */
function _fastString(s: string, begin: number): [string, number] | null {
  let close = s.indexOf('"', begin);
  for (;;) {
    if (close < 0) return null;
    let slashes = 0;
    while (s.charCodeAt(close - 1 - slashes) === 0x5c) slashes++;
    if (slashes % 2 === 0) break; // not escaped: the end
    close = s.indexOf('"', close + 1);
  }
  const body = s.slice(begin, close);
  if (body.indexOf("\\") < 0) return _CONTROL.test(body) ? null : [body, close + 1];
  try { // refuses control characters and invalid escapes, as the scan does
    return [JSON.parse(`"${body}"`) as string, close + 1];
  } catch {
    return null;
  }
}

const _ESCAPES: Record<string, string> = {
  '"': '"',
  "\\": "\\",
  "/": "/",
  b: "\b",
  f: "\f",
  n: "\n",
  r: "\r",
  t: "\t",
};

/** Thrown internally where CPython raises StopIteration ("Expecting value"). */
class _StopIteration {
  constructor(readonly index: number) {}
}

class _Parser {
  readonly #s: string;
  readonly #typed: boolean;
  readonly #maxIntDigits: number;
  #depth = 0;

  constructor(s: string, typed: boolean, maxIntDigits = Infinity) {
    this.#s = s;
    this.#typed = typed;
    this.#maxIntDigits = maxIntDigits;
  }

  parseDocument(): TypedJsonValue {
    const s = this.#s;
    if (s.charCodeAt(0) === 0xfeff) {
      this.#fail("Unexpected UTF-8 BOM (decode using utf-8-sig)", 0);
    }
    const start = this.#skip(0);
    let value: TypedJsonValue;
    let end: number;
    try {
      [value, end] = this.#scan(start);
    } catch (error) {
      if (error instanceof _StopIteration) this.#fail("Expecting value", error.index);
      throw error;
    }
    end = this.#skip(end);
    if (end !== s.length) this.#fail("Extra data", end);
    return value;
  }

  #fail(message: string, index: number): never {
    const s = this.#s;
    const before = s.slice(0, index);
    const line = before.split("\n").length;
    const lastNewline = before.lastIndexOf("\n");
    const pos = codePointIndex(s, index);
    const column = lastNewline < 0 ? pos + 1 : pos - codePointIndex(s, lastNewline);
    throw new JsonParseError(
      `malformed JSON: ${message}: line ${line} column ${column} (char ${pos})`,
    );
  }

  #skip(i: number): number {
    const s = this.#s;
    for (;;) {
      const c = s.charCodeAt(i);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i++;
      else return i;
    }
  }

  /** CPython `scan_once`: the value at `i` (no whitespace skipping) and its end. */
  #scan(i: number): [TypedJsonValue, number] {
    const s = this.#s;
    const n = s.length;
    if (i >= n) throw new _StopIteration(i);
    const c = s.charCodeAt(i);
    switch (c) {
      case 0x22: // "
        return this.#string(i + 1);
      case 0x7b: // {
        return this.#object(i + 1);
      case 0x5b: // [
        return this.#array(i + 1);
      case 0x6e: // n
        if (i + 3 < n && s.startsWith("null", i)) return [null, i + 4];
        break;
      case 0x74: // t
        if (i + 3 < n && s.startsWith("true", i)) return [true, i + 4];
        break;
      case 0x66: // f
        if (i + 4 < n && s.startsWith("false", i)) return [false, i + 5];
        break;
      case 0x4e: // N
        if (i + 2 < n && s.startsWith("NaN", i)) _rejectConstant("NaN");
        break;
      case 0x49: // I
        if (i + 7 < n && s.startsWith("Infinity", i)) _rejectConstant("Infinity");
        break;
      case 0x2d: // -
        if (i + 8 < n && s.startsWith("-Infinity", i)) _rejectConstant("-Infinity");
        break;
    }
    return this.#number(i);
  }

  #number(start: number): [TypedJsonValue, number] {
    const s = this.#s;
    const last = s.length - 1;
    let i = start;
    if (s.charCodeAt(i) === 0x2d) {
      i++;
      if (i > last) throw new _StopIteration(start);
    }
    let c = s.charCodeAt(i);
    if (c >= 0x31 && c <= 0x39) {
      i++;
      while (i <= last && _isDigit(s.charCodeAt(i))) i++;
    } else if (c === 0x30) {
      i++;
    } else {
      throw new _StopIteration(start);
    }
    let isFloat = false;
    if (i < last && s.charCodeAt(i) === 0x2e && _isDigit(s.charCodeAt(i + 1))) {
      isFloat = true;
      i += 2;
      while (i <= last && _isDigit(s.charCodeAt(i))) i++;
    }
    c = s.charCodeAt(i);
    if (i < last && (c === 0x65 || c === 0x45)) {
      const eStart = i;
      i++;
      c = s.charCodeAt(i);
      if (i < last && (c === 0x2d || c === 0x2b)) i++;
      while (i <= last && _isDigit(s.charCodeAt(i))) i++;
      if (_isDigit(s.charCodeAt(i - 1))) isFloat = true;
      else i = eStart;
    }
    const text = s.slice(start, i);
    if (isFloat) {
      const value = Number(text);
      return [this.#typed ? new JsonFloat(value) : value, i];
    }
    if (text.length <= 15) {
      const value = Number(text);
      return [value === 0 ? 0 : value, i]; // Python ints have no -0
    }
    const digits = text.length - (text.charCodeAt(0) === 0x2d ? 1 : 0);
    if (digits > this.#maxIntDigits) {
      // Python refuses to convert longer integers (and a worker would fail on them).
      throw new JsonParseError(
        `malformed JSON: Exceeds the limit (${this.#maxIntDigits} digits) for integer string ` +
          `conversion: value has ${digits} digits; use sys.set_int_max_str_digits() to ` +
          "increase the limit",
      );
    }
    const value = Number(text);
    return [Number.isSafeInteger(value) ? value : BigInt(text), i];
  }

  /** CPython `scanstring` (strict): `end` is just after the opening quote. */
  #string(end: number): [string, number] {
    return _fastString(this.#s, end) ?? this.#scanString(end);
  }

  /** The string character by character, for escapes `_fastString` left, and exact errors. */
  #scanString(end: number): [string, number] {
    const s = this.#s;
    const n = s.length;
    const begin = end - 1;
    let out = "";
    for (;;) {
      _STRING_SPECIAL.lastIndex = end;
      const match = _STRING_SPECIAL.exec(s);
      if (match === null) this.#fail("Unterminated string starting at", begin);
      let next = match.index;
      const c = s.charCodeAt(next);
      if (c < 0x20) this.#fail("Invalid control character at", next);
      if (next > end) out += s.slice(end, next);
      next++;
      if (c === 0x22) return [out, next];
      if (next === n) this.#fail("Unterminated string starting at", begin);
      const escape = s[next];
      if (escape !== "u") {
        end = next + 1;
        const replacement = _ESCAPES[escape];
        if (replacement === undefined) this.#fail("Invalid \\escape", end - 2);
        out += replacement;
        continue;
      }
      next++;
      end = next + 4;
      if (end >= n) this.#fail("Invalid \\uXXXX escape", next - 1);
      let code = _hex4(s, next);
      if (code < 0) this.#fail("Invalid \\uXXXX escape", end - 5);
      if (
        code >= 0xd800 && code <= 0xdbff && end + 6 < n &&
        s.charCodeAt(end) === 0x5c && s.charCodeAt(end + 1) === 0x75
      ) {
        const low = _hex4(s, end + 2);
        if (low < 0) this.#fail("Invalid \\uXXXX escape", end + 1);
        if (low >= 0xdc00 && low <= 0xdfff) {
          code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
          end += 6;
        }
      }
      out += String.fromCodePoint(code);
    }
  }

  #enter(): void {
    if (++this.#depth > _MAX_DEPTH) {
      throw new JsonParseError(`malformed JSON: nesting deeper than ${_MAX_DEPTH} levels`);
    }
  }

  #object(i: number): [TypedJsonObject, number] {
    this.#enter();
    const s = this.#s;
    const n = s.length;
    const result: TypedJsonObject = new Map();
    let duplicate: string | undefined;
    i = this.#skip(i);
    if (i >= n || s.charCodeAt(i) !== 0x7d) {
      for (;;) {
        if (i >= n || s.charCodeAt(i) !== 0x22) {
          this.#fail("Expecting property name enclosed in double quotes", i);
        }
        const [key, afterKey] = this.#string(i + 1);
        i = this.#skip(afterKey);
        if (i >= n || s.charCodeAt(i) !== 0x3a) this.#fail("Expecting ':' delimiter", i);
        i = this.#skip(i + 1);
        const [value, afterValue] = this.#scan(i);
        if (duplicate === undefined && result.has(key)) duplicate = key;
        result.set(key, value);
        i = this.#skip(afterValue);
        if (i < n && s.charCodeAt(i) === 0x7d) break;
        if (i >= n || s.charCodeAt(i) !== 0x2c) this.#fail("Expecting ',' delimiter", i);
        i = this.#skip(i + 1);
      }
    }
    // Upstream's object_pairs_hook sees the pairs once the object is closed.
    if (duplicate !== undefined) {
      throw new JsonParseError(`duplicate JSON key: ${pyStrRepr(duplicate)}`);
    }
    this.#depth--;
    return [result, i + 1];
  }

  #array(i: number): [TypedJsonValue[], number] {
    this.#enter();
    const s = this.#s;
    const n = s.length;
    const result: TypedJsonValue[] = [];
    i = this.#skip(i);
    if (i >= n || s.charCodeAt(i) !== 0x5d) {
      for (;;) {
        const [value, afterValue] = this.#scan(i);
        result.push(value);
        i = this.#skip(afterValue);
        if (i < n && s.charCodeAt(i) === 0x5d) break;
        if (i >= n || s.charCodeAt(i) !== 0x2c) this.#fail("Expecting ',' delimiter", i);
        i = this.#skip(i + 1);
      }
    }
    this.#depth--;
    return [result, i + 1];
  }
}

function _isDigit(c: number): boolean {
  return c >= 0x30 && c <= 0x39;
}

function _hex4(s: string, at: number): number {
  let code = 0;
  for (let k = at; k < at + 4; k++) {
    const c = s.charCodeAt(k);
    let digit: number;
    if (c >= 0x30 && c <= 0x39) digit = c - 0x30;
    else if (c >= 0x61 && c <= 0x66) digit = c - 0x57;
    else if (c >= 0x41 && c <= 0x46) digit = c - 0x37;
    else return -1;
    code = (code << 4) | digit;
  }
  return code;
}

function _rejectConstant(name: string): never {
  throw new JsonParseError(`non-finite number ${name} is not allowed`);
}

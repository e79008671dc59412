/**
 * Compact JSON serialization with Python `json.dumps` semantics (spec protocol §2.3): the program
 * JSON a client sends, written as upstream writes it.
 *
 * @module
 */

import { JsonFloat } from "./json_float.ts";
import { pyFloatRepr } from "./python_repr.ts";

/**
 * Serialize compactly (`,` and `:` separators, non-ASCII written raw), as upstream's
 * `json.dumps(..., ensure_ascii=False, separators=(",", ":"), allow_nan=False)`.
 *
 * Accepts `JsonValue` trees (`json.ts`), `Map`s with string keys (insertion order), plain objects
 * (own enumerable keys, in JS order), arrays, `bigint` (written as integer digits) and
 * {@linkcode JsonFloat} (Python float spelling). Integral numbers are written as integer digits,
 * other numbers with Python's float spelling. Throws `TypeError` for NaN/±Infinity, `undefined`,
 * functions, symbols, class instances, non-string map keys and cycles.
 */
export function stringifyJson(value: unknown): string {
  const parts: string[] = [];
  _write(value, parts, new Set());
  return parts.join("");
}

function _write(value: unknown, out: string[], active: Set<object>): void {
  switch (typeof value) {
    case "string":
      out.push(JSON.stringify(value));
      return;
    case "number":
      out.push(_numberText(value));
      return;
    case "bigint":
      out.push(value.toString());
      return;
    case "boolean":
      out.push(value ? "true" : "false");
      return;
    case "object":
      break;
    default:
      throw new TypeError(`${typeof value} is not JSON serializable`);
  }
  if (value === null) {
    out.push("null");
    return;
  }
  if (value instanceof JsonFloat) {
    if (!Number.isFinite(value.value)) {
      throw new TypeError(`out of range float value ${value.value} is not JSON compliant`);
    }
    out.push(pyFloatRepr(value.value));
    return;
  }
  if (active.has(value)) throw new TypeError("circular reference in JSON value");
  active.add(value);
  if (Array.isArray(value)) {
    out.push("[");
    for (let i = 0; i < value.length; i++) {
      if (i > 0) out.push(",");
      if (!(i in value)) throw new TypeError("sparse arrays are not JSON serializable");
      _write(value[i], out, active);
    }
    out.push("]");
  } else if (value instanceof Map) {
    out.push("{");
    let first = true;
    for (const [key, item] of value) {
      if (typeof key !== "string") throw new TypeError("JSON object keys must be strings");
      if (!first) out.push(",");
      first = false;
      out.push(JSON.stringify(key), ":");
      _write(item, out, active);
    }
    out.push("}");
  } else {
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) {
      const name = (value as { constructor?: { name?: string } }).constructor?.name ?? "object";
      throw new TypeError(`${name} is not JSON serializable`);
    }
    out.push("{");
    let first = true;
    for (const key of Object.keys(value)) {
      if (!first) out.push(",");
      first = false;
      out.push(JSON.stringify(key), ":");
      _write((value as Record<string, unknown>)[key], out, active);
    }
    out.push("}");
  }
  active.delete(value);
}

function _numberText(value: number): string {
  if (!Number.isFinite(value)) {
    throw new TypeError(`out of range float value ${value} is not JSON compliant`);
  }
  if (Number.isInteger(value)) {
    if (Math.abs(value) < 1e21) return String(value === 0 ? 0 : value);
    return BigInt(value).toString();
  }
  return pyFloatRepr(value);
}

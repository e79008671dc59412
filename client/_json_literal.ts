/**
 * JSON literals in run arguments: validated and copied when the instruction
 * is added, so later changes to the caller's objects do not change the program.
 *
 * @module
 */

import { JsonFloat } from "../protocol/json_float.ts";
import { ValidationError } from "./errors.ts";
import { Register } from "./register.ts";

/**
 * Copy a JSON literal into an immutable-by-convention tree: plain objects
 * become `Map`s (keeping their key order), `Map`s are copied, numbers must be
 * finite. Registers are not allowed inside literals (only top-level `run`
 * arguments are references).
 */
export function jsonLiteral(value: unknown, active: Set<object> = new Set()): unknown {
  switch (typeof value) {
    case "string":
    case "boolean":
    case "bigint":
      return value;
    case "number":
      if (!Number.isFinite(value)) {
        throw new ValidationError(`out of range float values are not JSON compliant: ${value}`);
      }
      return value;
    case "object":
      break;
    default:
      throw new TypeError(`${typeof value} is not a JSON value`);
  }
  if (value === null) return null;
  if (value instanceof JsonFloat) {
    if (!Number.isFinite(value.value)) {
      throw new ValidationError(`out of range float values are not JSON compliant: ${value.value}`);
    }
    return value;
  }
  if (value instanceof Register) {
    throw new TypeError("registers are only allowed as top-level run arguments");
  }
  if (active.has(value)) {
    throw new ValidationError("JSON values cannot contain circular containers");
  }
  active.add(value);
  let copy: unknown;
  if (Array.isArray(value)) {
    copy = Array.from(value, (item) => jsonLiteral(item, active));
  } else if (value instanceof Map) {
    const map = new Map<string, unknown>();
    for (const [key, item] of value) {
      if (typeof key !== "string") throw new TypeError("JSON object keys must be strings");
      map.set(key, jsonLiteral(item, active));
    }
    copy = map;
  } else {
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) {
      throw new TypeError(`${value.constructor?.name ?? "object"} is not a JSON value`);
    }
    const map = new Map<string, unknown>();
    for (const key of Object.keys(value)) {
      map.set(key, jsonLiteral((value as Record<string, unknown>)[key], active));
    }
    copy = map;
  }
  active.delete(value);
  return copy;
}

/**
 * What a non-200 `/execute` response says about itself (spec protocol §3.4), read as upstream's
 * client reads it: whatever the body is, it describes the error.
 *
 * @module
 */

import type { TypedJsonObject, TypedJsonValue } from "./json.ts";
import { JsonFloat } from "./json_float.ts";
import { pyRepr } from "./python_repr.ts";
import { decodeJsonObject, ResponseError } from "./response_decode.ts";

/** What a non-200 response says about itself (for `KCoralError`). */
export interface ServerErrorInfo {
  /** `error.message`, `str(error)` when `error` is not an object, or `HTTP <code>`. */
  message: string;
  /** `error.kind` when it is a string. */
  kind: string | null;
  /** `request_id` when it is a string. */
  requestId: string | null;
}

function _pyStr(value: TypedJsonValue): string {
  return typeof value === "string" ? value : pyRepr(value);
}

function _truthy(value: TypedJsonValue | undefined): boolean {
  if (value === undefined || value === null || value === false) return false;
  if (typeof value === "string" || Array.isArray(value)) return value.length > 0;
  if (value instanceof Map) return value.size > 0;
  if (value instanceof JsonFloat) return value.value !== 0;
  return value !== 0 && value !== 0n;
}

/**
 * Read a non-200 body as upstream's client does: whatever it is, the result describes the error
 * (unparseable bodies give `HTTP <code>`).
 */
export function decodeServerError(statusCode: number, bytes: Uint8Array): ServerErrorInfo {
  let body: TypedJsonObject = new Map();
  try {
    body = decodeJsonObject(bytes);
  } catch (error) {
    if (!(error instanceof ResponseError)) throw error;
  }
  const error = body.get("error");
  let message: string;
  let kind: string | null = null;
  if (error instanceof Map) {
    message = error.has("message") ? _pyStr(error.get("message")!) : "server error";
    const rawKind = error.get("kind");
    kind = typeof rawKind === "string" ? rawKind : null;
  } else {
    message = _truthy(error) ? _pyStr(error!) : `HTTP ${statusCode}`;
  }
  const requestId = body.get("request_id");
  return { message, kind, requestId: typeof requestId === "string" ? requestId : null };
}

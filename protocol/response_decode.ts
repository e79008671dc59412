/**
 * `/execute` response decoding with every client-side check of upstream's client (spec protocol
 * §3.3, §3.4): the body's JSON object and binary parts, a CACHE_MISS body's missing hashes, and a
 * COMPLETED/FAILED body's fields and values. What a non-200 body says about itself is read in
 * `server_error_decode.ts`.
 *
 * @module
 */

import { JsonFloat } from "./json_float.ts";
import {
  JsonParseError,
  parseJsonTyped,
  type TypedJsonObject,
  type TypedJsonValue,
} from "./json.ts";
import {
  boundaryFromContentType,
  parseMultipart,
  type ParseMultipartOptions,
} from "./multipart_parse.ts";
import { isBlobHash } from "./program.ts";
import { pyListRepr, pyRepr, pyStrRepr } from "./python_repr.ts";
import {
  type DecodedResult,
  ERROR_FIELDS,
  type ExecutionErrorInfo,
  GPU_ACCESS_FIELDS,
} from "./result_fields.ts";
import {
  type DecodedValue,
  type KnownDigest,
  ResultValueError,
  ValueDecoder,
  type ValueFactories,
} from "./values.ts";

/** A response that violates the protocol; `message` is upstream's client text. */
export class ResponseError extends Error {
  /** Create the error with upstream's message text. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ResponseError";
  }
}

/** A decoded 200 body: its JSON object and binary parts by name. */
export interface ResponseBody {
  /** The JSON body (or the multipart `result` part), parsed with float spellings kept. */
  body: TypedJsonObject;
  /** Binary parts by name (views into the response bytes). */
  parts: Map<string, Uint8Array>;
}

function _jsonObject(bytes: Uint8Array, invalid: string, notObject: string): TypedJsonObject {
  let value: TypedJsonValue;
  try {
    value = parseJsonTyped(bytes);
  } catch (error) {
    if (error instanceof JsonParseError) {
      throw new ResponseError(`${invalid}: ${error.message}`, { cause: error });
    }
    throw error;
  }
  if (!(value instanceof Map)) throw new ResponseError(notObject);
  return value;
}

/**
 * Parse a JSON response body that must be an object (strict JSON).
 *
 * @throws {ResponseError} `response is not valid JSON: …` / `JSON response must be an object`.
 */
export function decodeJsonObject(bytes: Uint8Array): TypedJsonObject {
  return _jsonObject(bytes, "response is not valid JSON", "JSON response must be an object");
}

/**
 * Split a 200 `/execute` response into its JSON object and binary parts (spec §3.3): the media type
 * must be `application/json` or `multipart/form-data`; a multipart body needs exactly one `result`
 * part (`application/json`, an object) and unique `application/octet-stream` parts otherwise.
 * `options` go to {@linkcode parseMultipart} (e.g. delimiter marks found while the body arrived).
 *
 * @throws {ResponseError} with upstream's message.
 */
export function decodeResponseBody(
  contentType: string | null,
  bytes: Uint8Array,
  options: ParseMultipartOptions = {},
): ResponseBody {
  const mediaType = (contentType ?? "").split(";", 1)[0].trim().toLowerCase();
  if (mediaType === "application/json") return { body: decodeJsonObject(bytes), parts: new Map() };
  if (mediaType !== "multipart/form-data") {
    throw new ResponseError(`unsupported response content type: ${pyStrRepr(mediaType)}`);
  }
  let multipart;
  try {
    multipart = parseMultipart(bytes, boundaryFromContentType(contentType), options);
  } catch (error) {
    throw new ResponseError(`malformed multipart response: ${(error as Error).message}`, {
      cause: error,
    });
  }
  let result: TypedJsonObject | undefined;
  const parts = new Map<string, Uint8Array>();
  for (const part of multipart) {
    if (part.name === "result") {
      if (result !== undefined) throw new ResponseError("duplicate 'result' response part");
      if (part.mediaType !== "application/json") {
        throw new ResponseError("the 'result' response part must use application/json");
      }
      result = _jsonObject(
        part.body,
        "the 'result' part is not valid JSON",
        "the 'result' response part must contain an object",
      );
    } else {
      if (parts.has(part.name)) {
        throw new ResponseError(`duplicate response part: ${pyStrRepr(part.name)}`);
      }
      if (part.mediaType !== "application/octet-stream") {
        throw new ResponseError(
          `response part ${pyStrRepr(part.name)} has the wrong content type`,
        );
      }
      parts.set(part.name, part.body);
    }
  }
  if (result === undefined) {
    throw new ResponseError("multipart response is missing the 'result' part");
  }
  return { body: result, parts };
}

/**
 * The hashes of a CACHE_MISS body: a non-empty array of distinct valid hashes.
 *
 * @throws {ResponseError} with upstream's message.
 */
export function decodeMissingBlobs(body: TypedJsonObject): string[] {
  const missing = body.get("missing_blobs");
  if (!Array.isArray(missing) || missing.length === 0) {
    throw new ResponseError("CACHE_MISS response needs a non-empty 'missing_blobs' array");
  }
  if (!missing.every(isBlobHash)) {
    throw new ResponseError("CACHE_MISS response contains an invalid blob hash");
  }
  if (new Set(missing).size !== missing.length) {
    throw new ResponseError("CACHE_MISS response contains duplicate blob hashes");
  }
  return missing as string[];
}

const _ERROR_KINDS = new Set([
  "parse",
  "compile",
  "runtime",
  "gpu_access",
  "correctness",
  "serialization",
  "unavailable",
  "engine",
]);

class _Malformed extends Error {}

function _bad(message: string): never {
  throw new _Malformed(message);
}

function _field(body: TypedJsonObject, key: string): TypedJsonValue {
  if (!body.has(key)) _bad(pyStrRepr(key)); // Python's KeyError text
  return body.get(key)!;
}

function _isNumber(value: TypedJsonValue | undefined): boolean {
  if (value instanceof JsonFloat) return Number.isFinite(value.value);
  return typeof value === "number" || (typeof value === "bigint" && Number.isFinite(Number(value)));
}

function _isInt(value: TypedJsonValue | undefined): value is number | bigint {
  return typeof value === "number" || typeof value === "bigint";
}

/**
 * Validate and decode a COMPLETED/FAILED body (spec §3.3 semantic checks, §3.2 values, §3.4 error
 * object) against the response's binary parts. Every binary part must be used exactly once,
 * numbered depth-first in JSON text order.
 *
 * @throws {ResponseError} `malformed execution response: …` with upstream's detail.
 *
 * `knownDigest` may supply SHA-256 digests of parts already computed while receiving them.
 */
export function decodeProgramResult<T>(
  body: TypedJsonObject,
  parts: ReadonlyMap<string, Uint8Array>,
  factories: ValueFactories<T>,
  knownDigest?: KnownDigest,
): DecodedResult<T> {
  try {
    return _decodeProgramResult(body, parts, factories, knownDigest);
  } catch (error) {
    if (error instanceof _Malformed || error instanceof ResultValueError) {
      throw new ResponseError(`malformed execution response: ${error.message}`, { cause: error });
    }
    throw error;
  }
}

function _decodeProgramResult<T>(
  body: TypedJsonObject,
  parts: ReadonlyMap<string, Uint8Array>,
  factories: ValueFactories<T>,
  knownDigest: KnownDigest | undefined,
): DecodedResult<T> {
  const status = _field(body, "status");
  if (status !== "COMPLETED" && status !== "FAILED") {
    _bad(`unexpected program status ${pyRepr(status)}`);
  }
  const requestId = _field(body, "request_id");
  const timings = ["queue_ms", "elapsed_ms", "lease_wait_ms", "lease_held_ms"].map((key) =>
    _field(body, key)
  );
  const stdout = _field(body, "stdout");
  const stderr = _field(body, "stderr");
  const stdoutTruncated = body.has("stdout_truncated") ? body.get("stdout_truncated") : false;
  const stderrTruncated = body.has("stderr_truncated") ? body.get("stderr_truncated") : false;
  if (typeof requestId !== "string" || requestId === "") {
    _bad("request_id must be a non-empty string");
  }
  if (!timings.every(_isNumber)) _bad("the reported timings must be finite numbers");
  if (typeof stdout !== "string" || typeof stderr !== "string") {
    _bad("stdout and stderr must be strings");
  }
  if (typeof stdoutTruncated !== "boolean" || typeof stderrTruncated !== "boolean") {
    _bad("output truncation flags must be booleans");
  }
  if (body.has("gpu_ids") !== body.has("gpu_count")) {
    _bad("gpu_ids and gpu_count must be reported together");
  }
  const gpuIds = body.has("gpu_ids") ? body.get("gpu_ids") : [];
  if (!Array.isArray(gpuIds) || !gpuIds.every((id) => _isInt(id) && id >= 0)) {
    _bad("gpu_ids must be a list of device indices");
  }
  const ids = (gpuIds as (number | bigint)[]).map(Number);
  if (new Set(ids).size !== ids.length || ids.length > 8) {
    _bad("gpu_ids must contain at most eight distinct devices");
  }
  if (body.has("gpu_count")) {
    const count = body.get("gpu_count");
    if (!_isInt(count) || Number(count) !== ids.length || ids.length === 0) {
      _bad("gpu_count must match gpu_ids");
    }
  }
  const encoded = _field(body, "results");
  if (!(encoded instanceof Map)) _bad("results must be an object");
  const decoder = new ValueDecoder(parts, factories, knownDigest);
  const results = new Map<string, DecodedValue<T>>();
  for (const [key, value] of encoded) results.set(key, decoder.decode(value));
  let error: ExecutionErrorInfo | null = null;
  if (status === "COMPLETED") {
    if (body.has("error")) _bad("COMPLETED response must not contain error details");
  } else {
    error = _decodeError(_field(body, "error"));
  }
  const unreferenced = decoder.unreferencedParts();
  if (unreferenced.length > 0) {
    _bad(`unreferenced binary response parts: ${pyListRepr(unreferenced)}`);
  }
  const [queueMs, elapsedMs, leaseWaitMs, leaseHeldMs] = timings.map((value) =>
    value instanceof JsonFloat ? value.value : Number(value)
  );
  return {
    status,
    requestId,
    queueMs,
    elapsedMs,
    leaseWaitMs,
    leaseHeldMs,
    results,
    stdout,
    stderr,
    stdoutTruncated,
    stderrTruncated,
    error,
    gpuIds: ids,
  };
}

function _decodeError(error: TypedJsonValue): ExecutionErrorInfo {
  if (!(error instanceof Map)) _bad("error must be an object");
  const expected = error.get("kind") === "gpu_access"
    ? [...ERROR_FIELDS, ...GPU_ACCESS_FIELDS]
    : ERROR_FIELDS;
  if (error.size !== expected.length || !expected.every((key) => error.has(key))) {
    _bad("error details have unexpected fields");
  }
  const kind = error.get("kind");
  if (typeof kind !== "string" || !_ERROR_KINDS.has(kind)) _bad("error kind is invalid");
  const info: Partial<ExecutionErrorInfo> = {};
  if (kind === "gpu_access") {
    const cudaCall = error.get("cuda_call");
    const location = error.get("location");
    const interfered = error.get("interfered_request_id");
    if (
      typeof cudaCall !== "string" || typeof location !== "string" ||
      (interfered !== null && typeof interfered !== "string")
    ) {
      _bad("gpu_access error details have the wrong types");
    }
    Object.assign(info, { cudaCall, location, interferedRequestId: interfered });
  }
  const message = error.get("message");
  const traceback = error.get("traceback");
  if (typeof message !== "string" || typeof traceback !== "string") {
    _bad("error message and traceback must be strings");
  }
  const index = error.get("instruction_index");
  if (!_isInt(index)) _bad("error instruction_index must be an integer");
  const op = error.get("instruction_op");
  if (op !== "upload" && op !== "get_function" && op !== "run" && op !== "return") {
    _bad("error instruction_op is invalid");
  }
  const id = error.get("instruction_id");
  if (id !== null && typeof id !== "string") _bad("error instruction_id must be a string or null");
  return {
    kind,
    message,
    instructionIndex: Number(index),
    instructionOp: op,
    instructionId: id,
    traceback,
    ...info,
  };
}

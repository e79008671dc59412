// /execute responses: encoding (server, spec protocol §3.1, §3.3, §2.8) and
// decoding with every client-side check of upstream's client (§3.3, §3.4).

import { JsonFloat } from "./json_float.ts";
import {
  JsonParseError,
  parseJsonTyped,
  type TypedJsonObject,
  type TypedJsonValue,
} from "./json.ts";
import {
  boundaryFromContentType,
  type EncodedMultipart,
  encodeMultipart,
  type MultipartInput,
  parseMultipart,
  type ParseMultipartOptions,
} from "./multipart.ts";
import { isBlobHash } from "./program.ts";
import {
  type DecodedValue,
  type KnownDigest,
  ResultValueError,
  ValueDecoder,
  type ValueFactories,
} from "./values.ts";
import { _pyFloatRepr, _pyListRepr, _pyRepr, _pyStrRepr } from "./_python.ts";

/** The fields of a COMPLETED/FAILED body, for {@linkcode resultJson}. */
export interface ResultFields {
  /** Program outcome. */
  status: "COMPLETED" | "FAILED";
  /** The request id (also sent as `X-Request-ID`). */
  requestId: string;
  /** Milliseconds waiting for a worker. */
  queueMs: number;
  /** Milliseconds from worker assignment to outcome. */
  elapsedMs: number;
  /** Part of `elapsedMs` spent waiting for the GPU lease. */
  leaseWaitMs: number;
  /** Part of `elapsedMs` spent holding the GPU lease. */
  leaseHeldMs: number;
  /** Captured standard output (head). */
  stdout: string;
  /** Captured standard error (head). */
  stderr: string;
  /** More than the limit was written to stdout. */
  stdoutTruncated: boolean;
  /** More than the limit was written to stderr. */
  stderrTruncated: boolean;
  /** Physical GPU ids; only when the request set `options.gpu_count`. */
  gpuIds?: number[];
  /** Raw JSON text of the `results` object, inserted verbatim. */
  resultsJson: string;
  /** Raw JSON text of the `error` object (FAILED only), inserted verbatim. */
  errorJson?: string;
}

function _timing(value: number, name: string): string {
  if (!Number.isFinite(value)) throw new TypeError(`${name} must be a finite number`);
  return _pyFloatRepr(value);
}

/**
 * The JSON body of a COMPLETED or FAILED response, keys in upstream's order
 * (spec §3.1). Timings use Python's float spelling (`0.0`, `153.7`);
 * `gpu_ids` and `gpu_count` only when `gpuIds` is given; `error` only for
 * FAILED (required there, forbidden for COMPLETED).
 *
 * @example
 * ```ts
 * import { resultJson } from "./mod.ts";
 *
 * const text = resultJson({
 *   status: "COMPLETED", requestId: "r", queueMs: 0, elapsedMs: 1.5, leaseWaitMs: 0,
 *   leaseHeldMs: 1, stdout: "", stderr: "", stdoutTruncated: false, stderrTruncated: false,
 *   resultsJson: "{}",
 * });
 * if (!text.startsWith('{"status":"COMPLETED","request_id":"r","queue_ms":0.0,"elapsed_ms":1.5,')) {
 *   throw new Error(text);
 * }
 * ```
 */
export function resultJson(fields: ResultFields): string {
  const failed = fields.status === "FAILED";
  if (fields.status !== "COMPLETED" && !failed) {
    throw new TypeError("status must be COMPLETED or FAILED");
  }
  if (failed !== (fields.errorJson !== undefined)) {
    throw new TypeError("errorJson is required for FAILED and forbidden for COMPLETED");
  }
  let text = `{"status":"${fields.status}","request_id":${JSON.stringify(fields.requestId)}` +
    `,"queue_ms":${_timing(fields.queueMs, "queueMs")}` +
    `,"elapsed_ms":${_timing(fields.elapsedMs, "elapsedMs")}` +
    `,"lease_wait_ms":${_timing(fields.leaseWaitMs, "leaseWaitMs")}` +
    `,"lease_held_ms":${_timing(fields.leaseHeldMs, "leaseHeldMs")}` +
    `,"stdout":${JSON.stringify(fields.stdout)},"stderr":${JSON.stringify(fields.stderr)}` +
    `,"stdout_truncated":${fields.stdoutTruncated ? "true" : "false"}` +
    `,"stderr_truncated":${fields.stderrTruncated ? "true" : "false"}`;
  if (fields.gpuIds !== undefined) {
    if (!fields.gpuIds.every((id) => Number.isSafeInteger(id) && id >= 0)) {
      throw new TypeError("gpuIds must be non-negative integers");
    }
    text += `,"gpu_ids":[${fields.gpuIds.join(",")}],"gpu_count":${fields.gpuIds.length}`;
  }
  text += `,"results":${fields.resultsJson}`;
  if (failed) text += `,"error":${fields.errorJson}`;
  return text + "}";
}

/**
 * The CACHE_MISS body (HTTP 200, `application/json`): missing hashes in
 * first-reference order.
 *
 * @example
 * ```ts
 * import { cacheMissJson } from "./mod.ts";
 *
 * if (cacheMissJson("r", ["ab"]) !== '{"status":"CACHE_MISS","request_id":"r","missing_blobs":["ab"]}') {
 *   throw new Error();
 * }
 * ```
 */
export function cacheMissJson(requestId: string, missing: readonly string[]): string {
  return `{"status":"CACHE_MISS","request_id":${JSON.stringify(requestId)},"missing_blobs":[${
    missing.map((hash) => JSON.stringify(hash)).join(",")
  }]}`;
}

const _encoder = new TextEncoder();

/**
 * Encode a 200 body (spec §3.3): `application/json` when there are no binary
 * parts, else multipart with `result` first and `return:<i>` in index order
 * (boundary `kcoral-<32 hex>`, re-drawn until absent from every payload).
 *
 * @example
 * ```ts
 * import { encodeExecuteResponse } from "./mod.ts";
 *
 * const plain = encodeExecuteResponse('{"status":"CACHE_MISS"}', []);
 * if (plain.contentType !== "application/json") throw new Error();
 * const multi = encodeExecuteResponse("{}", [new Uint8Array([1])]);
 * if (!multi.contentType.startsWith("multipart/form-data; boundary=kcoral-")) throw new Error();
 * ```
 */
export function encodeExecuteResponse(
  json: string,
  binaryParts: readonly Uint8Array[],
): EncodedMultipart {
  const result = _encoder.encode(json);
  if (binaryParts.length === 0) return { contentType: "application/json", body: result };
  const parts: MultipartInput[] = [{
    name: "result",
    contentType: "application/json",
    body: result,
  }];
  binaryParts.forEach((body, i) => {
    parts.push({ name: `return:${i}`, contentType: "application/octet-stream", body });
  });
  return encodeMultipart(parts);
}

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
 * Split a 200 `/execute` response into its JSON object and binary parts
 * (spec §3.3): the media type must be `application/json` or
 * `multipart/form-data`; a multipart body needs exactly one `result` part
 * (`application/json`, an object) and unique `application/octet-stream`
 * parts otherwise. `options` go to {@linkcode parseMultipart} (e.g. delimiter
 * marks found while the body arrived).
 *
 * @throws {ResponseError} with upstream's message.
 *
 * @example
 * ```ts
 * import { decodeResponseBody } from "./mod.ts";
 *
 * const { body, parts } = decodeResponseBody("application/json", new TextEncoder().encode('{"a":1}'));
 * if (body.get("a") !== 1 || parts.size !== 0) throw new Error();
 * ```
 */
export function decodeResponseBody(
  contentType: string | null,
  bytes: Uint8Array,
  options: ParseMultipartOptions = {},
): ResponseBody {
  const mediaType = (contentType ?? "").split(";", 1)[0].trim().toLowerCase();
  if (mediaType === "application/json") return { body: decodeJsonObject(bytes), parts: new Map() };
  if (mediaType !== "multipart/form-data") {
    throw new ResponseError(`unsupported response content type: ${_pyStrRepr(mediaType)}`);
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
        throw new ResponseError(`duplicate response part: ${_pyStrRepr(part.name)}`);
      }
      if (part.mediaType !== "application/octet-stream") {
        throw new ResponseError(
          `response part ${_pyStrRepr(part.name)} has the wrong content type`,
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

/**
 * The `error` object of a FAILED result (spec §3.4).
 *
 * @example
 * ```ts
 * import type { ExecutionErrorInfo } from "../mod.ts";
 *
 * function describe(error: ExecutionErrorInfo): string {
 *   return `instruction ${error.instructionIndex} (${error.instructionOp}) failed: ${error.message}`;
 * }
 * ```
 */
export interface ExecutionErrorInfo {
  /** `parse`, `compile`, `runtime`, `gpu_access`, `correctness`, `serialization`, `unavailable` or `engine`. */
  kind: string;
  /** Human-readable message, e.g. `ValueError: bad`. */
  message: string;
  /** 0-based index of the failing instruction. */
  instructionIndex: number;
  /** `upload`, `get_function`, `run` or `return`. */
  instructionOp: string;
  /** The failing instruction's id (`null` for `return`). */
  instructionId: string | null;
  /** Python traceback (its last 8192 characters). */
  traceback: string;
  /** `gpu_access` only: the CUDA call entered. */
  cudaCall?: string;
  /** `gpu_access` only: where it was called. */
  location?: string;
  /** `gpu_access` only: the request that held the GPU then, if any. */
  interferedRequestId?: string | null;
}

/**
 * A decoded COMPLETED/FAILED body.
 *
 * @example
 * ```ts
 * import { ProgramResult } from "../mod.ts";
 *
 * const result = new ProgramResult({
 *   status: "COMPLETED", requestId: "r", queueMs: 0, elapsedMs: 0, leaseWaitMs: 0, leaseHeldMs: 0,
 *   results: new Map(), stdout: "", stderr: "", stdoutTruncated: false, stderrTruncated: false,
 *   error: null, gpuIds: [],
 * });
 * ```
 */
export interface DecodedResult<T> {
  /** Program outcome. */
  status: "COMPLETED" | "FAILED";
  /** This attempt's request id. */
  requestId: string;
  /** Milliseconds waiting for a worker. */
  queueMs: number;
  /** Milliseconds on the worker. */
  elapsedMs: number;
  /** Part of `elapsedMs` waiting for the GPU lease. */
  leaseWaitMs: number;
  /** Part of `elapsedMs` holding the GPU lease. */
  leaseHeldMs: number;
  /** Returned values by key, in response order. */
  results: Map<string, DecodedValue<T>>;
  /** Captured stdout. */
  stdout: string;
  /** Captured stderr. */
  stderr: string;
  /** stdout was truncated. */
  stdoutTruncated: boolean;
  /** stderr was truncated. */
  stderrTruncated: boolean;
  /** The failure, for FAILED. */
  error: ExecutionErrorInfo | null;
  /** GPUs used (empty unless `gpu_count` was requested). */
  gpuIds: number[];
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
/**
 * The fields of a FAILED body's `error` object, in wire order (spec §3.4).
 *
 * @example
 * ```ts
 * import { ERROR_FIELDS } from "./mod.ts";
 *
 * if (ERROR_FIELDS[0] !== "kind" || ERROR_FIELDS.at(-1) !== "traceback") throw new Error();
 * ```
 */
export const ERROR_FIELDS: readonly string[] = [
  "kind",
  "message",
  "instruction_index",
  "instruction_op",
  "instruction_id",
  "traceback",
];

/**
 * The fields a `gpu_access` error adds after {@linkcode ERROR_FIELDS}, in wire order.
 *
 * @example
 * ```ts
 * import { GPU_ACCESS_FIELDS } from "./mod.ts";
 *
 * if (!GPU_ACCESS_FIELDS.includes("interfered_request_id")) throw new Error();
 * ```
 */
export const GPU_ACCESS_FIELDS: readonly string[] = [
  "cuda_call",
  "location",
  "interfered_request_id",
];

class _Malformed extends Error {}

function _bad(message: string): never {
  throw new _Malformed(message);
}

function _field(body: TypedJsonObject, key: string): TypedJsonValue {
  if (!body.has(key)) _bad(_pyStrRepr(key)); // Python's KeyError text
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
 * Validate and decode a COMPLETED/FAILED body (spec §3.3 semantic checks,
 * §3.2 values, §3.4 error object) against the response's binary parts.
 * Every binary part must be used exactly once, numbered depth-first in JSON
 * text order.
 *
 * @throws {ResponseError} `malformed execution response: …` with upstream's detail.
 *
 * `knownDigest` may supply SHA-256 digests of parts already computed while receiving them.
 *
 * @example
 * ```ts
 * import { decodeProgramResult, parseJsonTyped } from "./mod.ts";
 *
 * const body = parseJsonTyped(
 *   '{"status":"COMPLETED","request_id":"r","queue_ms":0,"elapsed_ms":1.0,"lease_wait_ms":0.0,' +
 *     '"lease_held_ms":0.5,"stdout":"","stderr":"","results":{"n":{"type":"integer","value":6}}}',
 * ) as Map<string, never>;
 * const factories = { tensor: () => 0, bytes: () => 0, file: () => 0, folder: () => 0 };
 * const result = decodeProgramResult(body, new Map(), factories);
 * if (result.results.get("n") !== 6 || result.stdoutTruncated) throw new Error();
 * ```
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
    _bad(`unexpected program status ${_pyRepr(status)}`);
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
    _bad(`unreferenced binary response parts: ${_pyListRepr(unreferenced)}`);
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
  return typeof value === "string" ? value : _pyRepr(value);
}

function _truthy(value: TypedJsonValue | undefined): boolean {
  if (value === undefined || value === null || value === false) return false;
  if (typeof value === "string" || Array.isArray(value)) return value.length > 0;
  if (value instanceof Map) return value.size > 0;
  if (value instanceof JsonFloat) return value.value !== 0;
  return value !== 0 && value !== 0n;
}

/**
 * Read a non-200 body as upstream's client does: whatever it is, the result
 * describes the error (unparseable bodies give `HTTP <code>`).
 *
 * @example
 * ```ts
 * import { decodeServerError } from "./mod.ts";
 *
 * const info = decodeServerError(503, new TextEncoder().encode(
 *   '{"status":"ERROR","request_id":"r","error":{"kind":"busy","message":"server saturated"}}',
 * ));
 * if (info.message !== "server saturated" || info.kind !== "busy" || info.requestId !== "r") {
 *   throw new Error();
 * }
 * ```
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

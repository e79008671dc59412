/**
 * `/execute` response encoding (spec protocol §3.1, §3.3, §2.8): the JSON of a COMPLETED/FAILED
 * body and of a CACHE_MISS body, and a whole 200 body.
 *
 * @module
 */

import { type EncodedMultipart, encodeMultipart, type MultipartInput } from "./multipart_encode.ts";
import { pyFloatRepr } from "./python_repr.ts";
import type { ResultFields } from "./result_fields.ts";

function _timing(value: number, name: string): string {
  if (!Number.isFinite(value)) throw new TypeError(`${name} must be a finite number`);
  return pyFloatRepr(value);
}

/**
 * The JSON body of a COMPLETED or FAILED response, keys in upstream's order (spec §3.1). Timings
 * use Python's float spelling (`0.0`, `153.7`); `gpu_ids` and `gpu_count` only when `gpuIds` is
 * given; `error` only for FAILED (required there, forbidden for COMPLETED).
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

/** The CACHE_MISS body (HTTP 200, `application/json`): missing hashes in first-reference order. */
export function cacheMissJson(requestId: string, missing: readonly string[]): string {
  return `{"status":"CACHE_MISS","request_id":${JSON.stringify(requestId)},"missing_blobs":[${
    missing.map((hash) => JSON.stringify(hash)).join(",")
  }]}`;
}

const _encoder = new TextEncoder();

/**
 * Encode a 200 body (spec §3.3): `application/json` when there are no binary parts, else multipart
 * with `result` first and `return:<i>` in index order (boundary `kcoral-<32 hex>`, re-drawn until
 * absent from every payload).
 *
 * The server streams its own multipart from the worker's part files; this whole-body form serves
 * tests and tools that play a server.
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

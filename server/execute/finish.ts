/**
 * Finish, the last stage of `/execute`: how a request ended becomes both its HTTP response and its
 * `request_finished` record. Error answers arrive as a {@linkcode Rejection}; any other error is
 * an unhandled one (500 `engine`, logged with its stack).
 *
 * @module
 */
import { cacheMissJson } from "../../protocol/response_encode.ts";
import { ERROR_MESSAGES } from "../../protocol/errors.ts";
import type { GpuReceipt } from "../../protocol/gpu_receipt.ts";
import { receiptHeaders } from "./gpu_receipt.ts";
import type { EventLevel, EventLog } from "../../http/events.ts";
import { Rejection, unhandledFields } from "../../http/rejection.ts";
import { jsonResponse } from "../../http/routes.ts";
import type { CacheMiss } from "./admission.ts";

/** A program that ran (or whose worker died inside an instruction): a 200 answer. */
export interface ProgramOutcome {
  /** `"program"`. */
  kind: "program";
  /** The result body's status. */
  status: "COMPLETED" | "FAILED";
  /** The result body (JSON, or a multipart stream). */
  body: BodyInit;
  /** Its content type. */
  contentType: string;
  /** Its length in bytes. */
  bytes: number;
  /** What the log record says beyond the status: the worker, timings, the error, a crash. */
  record: ProgramRecord;
  /** The request held a GPU lease: its GPU-state receipt, sent as `X-KCoral-GPU-Receipt`. */
  gpuReceipt?: GpuReceipt | null;
}

/** The `request_finished` fields of a program that ran (upstream's, in upstream's order). */
export interface ProgramRecord {
  /** `completed`, `program_failed`, or `crashed` (a worker that died inside an instruction). */
  finishReason: "completed" | "program_failed" | "crashed";
  /** The dead worker's exit code (crashes only). */
  exitcode: number | null;
  /** The end of its output, for the log (crashes only). */
  outputTail: string | null;
  /** The seat, e.g. `gpu0/w3`. */
  workerId: string;
  /** Its GPU (`null` on a CPU server). */
  gpuId: number | null;
  /** The FAILED error object (`null` when completed). */
  error: Record<string, unknown> | null;
  /** Waiting for a worker. */
  queueMs: number;
  /** On the worker. */
  elapsedMs: number;
  /** Waiting for the lease. */
  leaseWaitMs: number;
  /** Holding the lease. */
  leaseHeldMs: number;
}

/** How a request ended, short of an ERROR answer. */
export type Outcome = ProgramOutcome | CacheMiss;

/** `request_finished` levels by `finish_reason`; others are INFO. */
const _LEVELS: Record<string, EventLevel> = {
  completed: "INFO",
  program_failed: "INFO",
  timeout: "WARNING",
  crashed: "ERROR",
  no_worker: "WARNING",
  rejected: "WARNING",
  cache_miss: "INFO",
  server_error: "ERROR",
};

/** The response to request `requestId`, which ended with `ended`, and its `request_finished`. */
export function finishRequest(
  events: EventLog,
  requestId: string,
  ended: Outcome | Rejection | unknown,
): Response {
  if (ended instanceof Rejection) return _rejected(events, requestId, ended);
  if (_isOutcome(ended)) {
    if (ended.kind === "cache_miss") {
      events.emit("INFO", "request_finished", {
        request_id: requestId,
        http_status: 200,
        finish_reason: "cache_miss",
        status: "CACHE_MISS",
        missing: ended.missing.length,
      });
      return jsonResponse(200, cacheMissJson(requestId, ended.missing), requestId);
    }
    return _program(events, requestId, ended);
  }
  return _rejected(
    events,
    requestId,
    new Rejection(500, "engine", ERROR_MESSAGES.internal, "server_error", unhandledFields(ended)),
  );
}

function _rejected(events: EventLog, requestId: string, rejection: Rejection): Response {
  events.emit(_LEVELS[rejection.reason] ?? "INFO", "request_finished", {
    request_id: requestId,
    http_status: rejection.status,
    finish_reason: rejection.reason,
    ...rejection.fields,
  });
  return rejection.response(requestId);
}

function _program(events: EventLog, requestId: string, outcome: ProgramOutcome): Response {
  const r = outcome.record;
  const error = r.error ?? {};
  events.emit(_LEVELS[r.finishReason], "request_finished", {
    request_id: requestId,
    http_status: 200,
    finish_reason: r.finishReason,
    exitcode: r.exitcode,
    output_tail: r.outputTail || null,
    status: outcome.status,
    worker_id: r.workerId,
    gpu_id: r.gpuId,
    error_kind: error.kind ?? null,
    error_message: typeof error.message === "string" && error.message !== ""
      ? error.message.slice(0, 2048)
      : null,
    instruction_index: error.instruction_index ?? null,
    instruction_op: error.instruction_op ?? null,
    instruction_id: error.instruction_id ?? null,
    queue_ms: r.queueMs,
    elapsed_ms: r.elapsedMs,
    lease_wait_ms: r.leaseWaitMs,
    lease_held_ms: r.leaseHeldMs,
    response_bytes: outcome.bytes,
  });
  const headers: Record<string, string> = {
    "content-type": outcome.contentType,
    "content-length": String(outcome.bytes),
    "x-request-id": requestId,
    ...receiptHeaders(outcome.gpuReceipt ?? null),
  };
  return new Response(outcome.body, { status: 200, headers });
}

function _isOutcome(value: unknown): value is Outcome {
  if (typeof value !== "object" || value === null || value instanceof Error) return false;
  const kind = (value as { kind?: unknown }).kind;
  return kind === "program" || kind === "cache_miss";
}

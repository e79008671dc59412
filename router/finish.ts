/**
 * Finish, the last stage of a routed `POST /execute` (spec router §2.2): how an attempt ended
 * becomes its one `request_finished` console line and, when the Router answers itself, its ERROR
 * answer. The Router's answers are {@linkcode Rejection}s (http/rejection.ts, the server's too)
 * that the earlier stages throw, all made by {@linkcode routerRejections}: the spec's kinds and
 * statuses, `X-Request-ID`, a declared length, `Retry-After: 1` with a 503.
 *
 * @module
 */
import type { ErrorKind } from "../protocol/errors.ts";
import type { EventLog } from "../http/events.ts";
import { Rejection } from "../http/rejection.ts";

/** Why an attempt ended (`finish_reason` of `request_finished`). */
export type FinishReason =
  | "completed"
  | "client_disconnected"
  | "queue_full"
  | "queue_timeout"
  | "tunnel_disconnected"
  | "invalid_response"
  | "request_rejected";

const _reject = (
  status: number,
  kind: ErrorKind,
  message: string,
  reason: FinishReason,
  fields?: Record<string, unknown>,
) => new Rejection(status, kind, message, reason, fields);

const _TRANSPORT = "KCoral Server tunnel failed; execution outcome is unknown and was not retried";

/**
 * Every answer the Router makes itself (spec router §2.2, "Error body"), with the
 * `finish_reason` of its log line. A client that went away gets a 499 nobody reads; its log line
 * says `http_status` 0.
 */
export const routerRejections = {
  /** 400: a `Content-Length` that is no length. */
  invalidLength: (): Rejection =>
    _reject(400, "invalid_request", "invalid Content-Length", "request_rejected"),
  /** 413: a body past `--max-request-bytes`, declared or sent. */
  tooLarge: (): Rejection =>
    _reject(413, "request_too_large", "request body is too large", "request_rejected"),
  /** 400: a body of another length than its `Content-Length`. */
  lengthMismatch: (): Rejection =>
    _reject(
      400,
      "invalid_request",
      "Content-Length does not match request body",
      "request_rejected",
    ),
  /** 400: the client's body failed while it was read. */
  bodyFailed: (): Rejection =>
    _reject(
      400,
      "invalid_request",
      "client request body failed while streaming",
      "client_disconnected",
    ),
  /** 408: no body bytes for `timeoutMs` (`--body-timeout-seconds`). */
  bodyTimeout: (timeoutMs: number): Rejection =>
    _reject(
      408,
      "timeout",
      `request body not received in time: no bytes for ${timeoutMs / 1000} s`,
      "request_rejected",
    ),
  /** 503 `router_busy`: no queue place left. */
  queueFull: (): Rejection => _reject(503, "router_busy", "router queue is full", "queue_full"),
  /** 503 `router_busy`: the Router is stopping. */
  stopping: (): Rejection =>
    _reject(503, "router_busy", "router is shutting down", "queue_timeout"),
  /** 503 `no_node`: no slot freed up before the queue wait ended. */
  noNode: (): Rejection =>
    _reject(503, "no_node", "no compatible node has an available slot", "queue_timeout"),
  /** The client went away: logged with `http_status` 0. */
  clientGone: (): Rejection =>
    _reject(499, "invalid_request", "client went away", "client_disconnected", { http_status: 0 }),
  /** 502 `server_transport`: the slot failed (`reason`: how); the outcome is unknown. */
  transport: (reason: FinishReason = "tunnel_disconnected"): Rejection =>
    _reject(502, "server_transport", _TRANSPORT, reason),
  /** 502 `server_transport`: the slot failed while the body was sent. */
  uploadTransport: (): Rejection =>
    _reject(
      502,
      "server_transport",
      "tunnel failed; execution outcome is unknown and was not retried",
      "tunnel_disconnected",
    ),
} as const;

/**
 * One attempt's record behind its `request_finished` line (upstream's `RequestTrace`): its
 * request id (the one the node's `events.jsonl` has for it), node, status, waits, byte counts
 * and how it ended. The line is written once; `onFinished` is called then.
 */
export class RequestTrace {
  /** The request id the node gets (`X-Request-ID`). */
  readonly id: string = crypto.randomUUID();
  /** When the attempt began (`performance.now()`). */
  readonly started: number = performance.now();
  /** The node that took it (`""`: none yet). */
  node = "";
  /** The HTTP status answered (0: none). */
  status = 0;
  /** Time spent waiting for a slot. */
  queueWaitMs = 0;
  /** How it ended. */
  reason: FinishReason = "client_disconnected";
  /** The kind of an answer the Router made itself (`router_busy`, `server_transport`, ...). */
  errorKind: string | null = null;
  /** Body bytes sent to the node. */
  requestBytes = 0;
  /** Body bytes sent to the client. */
  responseBytes = 0;
  readonly #events: EventLog;
  readonly #onFinished: (() => void) | undefined;
  #done = false;

  /** Begins the record of an attempt whose line goes to `events`. */
  constructor(events: EventLog, onFinished?: () => void) {
    this.#events = events;
    this.#onFinished = onFinished;
  }

  /** Writes the `request_finished` line (once; later calls do nothing). */
  finish(): void {
    if (this.#done) return;
    this.#done = true;
    const level = this.status >= 500 || this.status === 0 ? "WARNING" : "INFO";
    this.#events.emit(level, "request_finished", {
      request_id: this.id,
      node: this.node,
      http_status: this.status,
      queue_wait_ms: Math.round(this.queueWaitMs),
      duration_ms: Math.round(performance.now() - this.started),
      request_bytes: this.requestBytes,
      response_bytes: this.responseBytes,
      finish_reason: this.reason,
      error_kind: this.errorKind,
    });
    this.#onFinished?.();
  }

  /** The attempt ends with the Router's own answer: finished, and that answer. */
  rejected(rejection: Rejection): Response {
    const logged = rejection.fields.http_status;
    this.status = typeof logged === "number" ? logged : rejection.status;
    this.reason = rejection.reason as FinishReason;
    this.errorKind = rejection.kind;
    this.finish();
    return rejection.response(this.id);
  }
}

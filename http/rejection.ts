/**
 * A request turned away with an ERROR body (spec protocol §3.5): a typed error that any stage of a
 * request may throw, caught in one place that makes both the response and its log record (as Hono's
 * `HTTPException` with one `errorHandler`).
 *
 * @module
 */
import { errorBody } from "../protocol/errors.ts";

/**
 * An ERROR answer: HTTP `status`, the body's `kind` and `message`, and for the log the
 * `finish_reason` and the fields of its `request_finished` record.
 */
export class Rejection extends Error {
  /** HTTP status (400, 413, 500, 502, 503, 504). */
  readonly status: number;
  /** `error.kind` of the body (`parse`, `busy`, `timeout`, ...). */
  readonly kind: string;
  /** `finish_reason` of the log record (`rejected`, `no_worker`, `timeout`, ...). */
  readonly reason: string;
  /** The rest of the log record (`error_kind`, `worker_id`, ...). */
  readonly fields: Record<string, unknown>;
  /**
   * Extension headers the answer carries besides its own (a server's `X-KCoral-GPU-Receipt`); added
   * to by the stage that knows them.
   */
  readonly headers: Record<string, string> = {};

  /** Creates the rejection; `message` is the body's `error.message`. */
  constructor(
    status: number,
    kind: string,
    message: string,
    reason: string,
    fields: Record<string, unknown> = {},
  ) {
    super(message);
    this.name = "Rejection";
    this.status = status;
    this.kind = kind;
    this.reason = reason;
    this.fields = fields;
  }

  /**
   * The ERROR response (`X-Request-ID`; `Retry-After: 1` with a 503; {@linkcode headers}), its
   * length declared: a node's link then sends it to the Router in one frame with its head and end,
   * where an answer of unknown length is streamed (node/tunnelled_request.ts).
   */
  response(requestId: string): Response {
    const body = _encoder.encode(errorBody(requestId, this.kind, this.message));
    const headers: Record<string, string> = {
      ...this.headers,
      "content-type": "application/json",
      "content-length": String(body.length),
      "x-request-id": requestId,
    };
    if (this.status === 503) headers["retry-after"] = "1";
    return new Response(body, { status: this.status, headers });
  }
}

const _encoder = new TextEncoder();

/**
 * The log fields of an unexpected error (it becomes a 500 `engine` "internal server error"):
 * `error_kind` `unhandled`, `"Type: message"`, and the stack's last 8192 characters.
 */
export function unhandledFields(error: unknown): Record<string, unknown> {
  const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return {
    error_kind: "unhandled",
    error_message: message.slice(0, 2048),
    traceback: error instanceof Error ? (error.stack ?? "").slice(-8192) : "",
  };
}

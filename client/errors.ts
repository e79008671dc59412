/**
 * Client exceptions (spec protocol §5.6). None of them subclass another.
 * `RemoteExecutionError` lives with its producer, `remote_function.ts`.
 *
 * @module
 */
import type { GpuReceipt } from "../protocol/gpu_receipt.ts";

/**
 * Options of {@linkcode KCoralError}.
 *
 * @example
 * ```ts
 * import { KCoralError } from "./mod.ts";
 *
 * const error = new KCoralError(504, "execution timed out", { kind: "timeout" });
 * if (error.requestId !== null) throw new Error();
 * ```
 */
export interface KCoralErrorOptions extends ErrorOptions {
  /** `error.kind` of the body (e.g. `busy`), when the server sent one. */
  kind?: string | null;
  /** `request_id` of the body, when the server sent one. */
  requestId?: string | null;
  /** The answer's GPU-state receipt (`X-KCoral-GPU-Receipt`), when it had one. */
  gpuReceipt?: GpuReceipt | null;
}

/**
 * A non-200 HTTP response from `/execute` or `/health` (never retried).
 * `message` reads `HTTP <code>: <server message>`; `detail` is the server's
 * message alone (upstream's `message` attribute).
 *
 * @example
 * ```ts
 * import { KCoralError } from "./mod.ts";
 *
 * const error = new KCoralError(503, "server saturated", { kind: "busy", requestId: "r" });
 * if (error.message !== "HTTP 503: server saturated" || error.detail !== "server saturated") {
 *   throw new Error();
 * }
 * if (error.gpuReceipt !== null) throw new Error(); // a request that held no GPU lease
 * ```
 */
export class KCoralError extends Error {
  /** The HTTP status, e.g. 503. */
  readonly statusCode: number;
  /** The server's message (`error.message`, or `HTTP <code>` without a usable body). */
  readonly detail: string;
  /** `error.kind`, e.g. `busy`, `timeout`, `parse`; null when absent. */
  readonly kind: string | null;
  /** The request id the server reported; null when absent. */
  readonly requestId: string | null;
  /**
   * The GPU-state receipt of a request that held a GPU lease and still failed (a 504 timeout,
   * a 500 for a worker that died outside an instruction; docs/timing.md); null without one.
   */
  readonly gpuReceipt: GpuReceipt | null;

  /** Create the error (the client does this for every non-200 response). */
  constructor(statusCode: number, message: string, options: KCoralErrorOptions = {}) {
    super(`HTTP ${statusCode}: ${message}`, options);
    this.name = "KCoralError";
    this.statusCode = statusCode;
    this.detail = message;
    this.kind = options.kind ?? null;
    this.requestId = options.requestId ?? null;
    this.gpuReceipt = options.gpuReceipt ?? null;
  }
}

/**
 * No HTTP response was obtained: connection refused, connect timeout, reset,
 * read error. A lost connection does not tell whether the program ran.
 *
 * @example
 * ```ts
 * import { TransportError } from "./mod.ts";
 *
 * const error = new TransportError("connection refused");
 * if (error.name !== "TransportError") throw new Error();
 * ```
 */
export class TransportError extends Error {
  /** Create the error; `options.cause` holds the underlying failure. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "TransportError";
  }
}

/**
 * The response violates the protocol (content type, JSON, multipart, schema,
 * binary parts), CACHE_MISS negotiation failed, health is not ok, the target
 * is missing, or a remote function returned no `output`.
 *
 * @example
 * ```ts
 * import { ProtocolError } from "./mod.ts";
 *
 * const error = new ProtocolError("health status is not ok");
 * if (error.name !== "ProtocolError") throw new Error();
 * ```
 */
export class ProtocolError extends Error {
  /** Create the error with upstream's message text. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ProtocolError";
  }
}

/**
 * A {@linkcode ProtocolError} for blobs the server lacks and the program holds no bytes of (a
 * kept return the server has dropped since): `hashes` names them.
 *
 * @example
 * ```ts
 * import { BlobsNotHeldError, ProtocolError } from "./errors.ts";
 *
 * const error = new BlobsNotHeldError(["ab".repeat(32)], "server misses blobs with no local bytes");
 * if (!(error instanceof ProtocolError) || error.hashes.length !== 1) throw new Error();
 * ```
 */
export class BlobsNotHeldError extends ProtocolError {
  /** The SHA-256s the server asked for and the program cannot send. */
  readonly hashes: readonly string[];

  /** Create the error; `message` is upstream's text. */
  constructor(hashes: readonly string[], message: string) {
    super(message);
    this.hashes = Object.freeze([...hashes]);
  }
}

/**
 * An invalid value given to the program builder or client (upstream raises
 * `ValueError`/`ValidationError`). Wrong types raise `TypeError` instead.
 *
 * @example
 * ```ts
 * import { Program, ValidationError } from "./mod.ts";
 *
 * try {
 *   new Program().returnFile({ key: "k", path: "../x" });
 *   throw new Error("expected a ValidationError");
 * } catch (error) {
 *   if (!(error instanceof ValidationError)) throw error;
 * }
 * ```
 */
export class ValidationError extends Error {
  /** Create the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ValidationError";
  }
}

/**
 * Intake, the first stage of a routed `POST /execute` (spec router §2.2): what the Router takes
 * from a client's request before a slot — the node it asks for (`x-kcoral-node`), its declared
 * length (400 when it is not one, 413 past `--max-request-bytes`) and the body's first frame:
 * a body that fits one frame is read whole (400 when it fails or is not the declared length),
 * goes to the node in one frame with its head and end, and can still go to another slot if the
 * one taken goes away before anything was sent on it; of a larger one, its first frame's bytes
 * (router/upload.ts streams the rest once a slot is taken). So a body that stalls before its
 * first frame has arrived never holds a slot: the connection's body timeout cuts it first (408,
 * http/http1_server.ts; the read fails with `BodyTimeoutError`).
 *
 * @module
 */
import { isValidNodeId, MAX_DATA_BYTES, NODE_HEADER } from "../link/messages.ts";
import { BodyTimeoutError, declaredLength } from "../http/request_body.ts";
import { wholeBody } from "../http/whole_body.ts";
import type { Rejection } from "../http/rejection.ts";
import type { ForwardContext } from "./forward_context.ts";
import { routerRejections } from "./finish.ts";

/** A client's request as the later stages see it. */
export interface RoutedRequest {
  /** The client's request. */
  readonly request: Request;
  /** The node asked for (`x-kcoral-node`), `null` when none or not a node id. */
  readonly preferred: string | null;
  /** The declared body length, `null` without a `Content-Length`. */
  readonly length: number | null;
  /** The whole body read here (at most one frame's bytes), `null` when it is streamed later. */
  readonly body: Uint8Array | null;
  /**
   * Of a body streamed later, its first frame's bytes, read here (`null`: none read, the body
   * is streamed from its start).
   */
  readonly prefix: Uint8Array | null;
}

/**
 * Reads what the Router needs of `request` before it takes a slot; throws the
 * {@linkcode Rejection} to answer.
 */
export async function receiveRequest(
  request: Request,
  ctx: Pick<ForwardContext, "maxRequestBytes">,
): Promise<RoutedRequest> {
  const preferredHeader = request.headers.get(NODE_HEADER);
  const preferred = isValidNodeId(preferredHeader) ? preferredHeader : null;
  const length = declaredLength(request.headers);
  if (Number.isNaN(length)) throw routerRejections.invalidLength();
  if (length !== null && length > ctx.maxRequestBytes) throw routerRejections.tooLarge();
  let body: Uint8Array | null = null;
  let prefix: Uint8Array | null = null;
  if (length !== null ? length <= MAX_DATA_BYTES : !request.body) {
    const small = await _smallBody(request, length);
    if (!(small instanceof Uint8Array)) throw small;
    body = small;
  } else if (request.body) {
    const first = await _firstFrame(request.body, length);
    if (first !== null && !(first instanceof Uint8Array)) throw first;
    // A body of unknown length that ended within one frame is whole.
    if (first && length === null && first.length <= MAX_DATA_BYTES) body = first;
    else prefix = first;
  }
  return { request, preferred, length, body, prefix };
}

/**
 * The whole body of a request that declared at most one frame's bytes (or has none): its bytes, or
 * the rejection to answer (the body failed, or it is not the declared length).
 */
async function _smallBody(
  request: Request,
  length: number | null,
): Promise<Uint8Array | Rejection> {
  const bytes = await _readBody(request);
  if (!(bytes instanceof Uint8Array)) return bytes;
  if (length !== null && bytes.length !== length) return routerRejections.lengthMismatch();
  return bytes;
}

/**
 * The client's whole body (empty when it has none), or the rejection its failure is answered
 * with; a promise chain rather than an `async` function, one layer less on every small request.
 */
function _readBody(request: Request): Promise<Uint8Array | Rejection> {
  const whole = wholeBody(request);
  if (whole) return Promise.resolve(whole);
  return request.body
    ? request.bytes().catch(bodyReadRejection)
    : Promise.resolve(new Uint8Array(0));
}

/**
 * The first frame's bytes of a body larger than one frame (`MAX_DATA_BYTES`), or for a body of
 * unknown length up to one byte more (fewer: it ended within one frame, and is whole); a BYOB
 * read straight into them. A stream that is not a byte stream is left unread (`null`).
 */
async function _firstFrame(
  body: ReadableStream<Uint8Array>,
  length: number | null,
): Promise<Uint8Array | Rejection | null> {
  let reader: ReadableStreamBYOBReader;
  try {
    reader = body.getReader({ mode: "byob" });
  } catch {
    return null;
  }
  const capacity = length === null ? MAX_DATA_BYTES + 1 : MAX_DATA_BYTES;
  try {
    const { bytes, done } = await readInto(reader, new Uint8Array(capacity));
    return done && length !== null ? routerRejections.lengthMismatch() : bytes;
  } catch (error) {
    return bodyReadRejection(error);
  } finally {
    reader.releaseLock();
  }
}

/**
 * Fills `buffer` from a BYOB `reader` until it is full or the stream ends: the bytes read (a
 * read moves the memory, so a new view of `buffer`'s range) and whether the stream ended.
 */
export async function readInto(
  reader: ReadableStreamBYOBReader,
  buffer: Uint8Array,
): Promise<{ bytes: Uint8Array; done: boolean }> {
  const { byteOffset, length: capacity } = buffer;
  let filled = 0;
  while (filled < capacity) {
    const read = await reader.read(buffer.subarray(filled));
    if (read.value) {
      buffer = new Uint8Array(read.value.buffer as ArrayBuffer, byteOffset, capacity);
      filled += read.value.length;
    }
    if (read.done) return { bytes: buffer.subarray(0, filled), done: true };
  }
  return { bytes: buffer.subarray(0, filled), done: false };
}

/**
 * What a client's body that failed while it was read is answered with: 408 when it stopped
 * arriving (the connection's body timeout), else 400.
 */
export function bodyReadRejection(error: unknown): Rejection {
  const timeout = error instanceof BodyTimeoutError
    ? error
    : (error as { cause?: unknown } | null)?.cause;
  return timeout instanceof BodyTimeoutError
    ? routerRejections.bodyTimeout(timeout.timeoutMs)
    : routerRejections.bodyFailed();
}

/**
 * Receiving a `POST /execute` body: small bodies in one allocation; large ones read in place into
 * reused buffers while their multipart parts are scanned and hashed on other threads
 * (docs/decisions.md, "The large-data path").
 *
 * @module
 */
import { concatBytes } from "../protocol/bytes.ts";
import { errorMessage } from "../protocol/errors.ts";
import type { PartDigests } from "../protocol/part_digests.ts";

/** Bodies at least this large are read into reused buffers and hashed while they arrive. */
export const LARGE_BODY_BYTES = 8 * 1024 * 1024;
const _READ_STEP = 4 * 1024 * 1024;

/**
 * The body could not be read off its connection (cut short, framed wrongly): the request's fault,
 * not the server's. The message is the reading error's.
 */
export class BodyReadError extends Error {
  /** `"BodyReadError"`. */
  override name = "BodyReadError";
}

/**
 * A request body that stopped arriving: no byte came for the connection's body timeout (its
 * connection answered 408 and closed; http/http1_server.ts).
 */
export class BodyTimeoutError extends BodyReadError {
  /** `"BodyTimeoutError"`. */
  override name = "BodyTimeoutError";

  /** How long the body went without a byte, in ms. */
  readonly timeoutMs: number;

  /** The body made no progress for `timeoutMs`. */
  constructor(timeoutMs: number) {
    super(`request body not received in time: no bytes for ${timeoutMs / 1000} s`);
    this.timeoutMs = timeoutMs;
  }
}

/** A body that goes on past its Content-Length. */
export class BodyLengthError extends BodyReadError {
  /** `"BodyLengthError"`. */
  override name = "BodyLengthError";
}

/** A read of the body: its failure is a {@linkcode BodyReadError}. */
function _read<T>(read: Promise<T>): Promise<T> {
  return read.catch((error) => {
    throw new BodyReadError(errorMessage(error), { cause: error });
  });
}

/**
 * A request's declared body length: `null` without a `Content-Length`, `NaN` when it is not one
 * length. `Deno.serve` joins a repeated header (`3, 3`); repeats of one value stand for it (RFC
 * 9110 §8.6; the HTTP parser has already refused differing ones). Past 2^53 the number is not
 * exact, but it is past any limit.
 */
export function declaredLength(headers: Headers): number | null {
  const joined = headers.get("content-length");
  if (joined === null) return null;
  const [value, ...repeats] = joined.includes(",")
    ? joined.split(",").map((part) => part.trim())
    : [joined.trim()];
  if (!/^\d+$/.test(value) || repeats.some((repeat) => repeat !== value)) return NaN;
  return Number(value);
}

/** A request body; `digests` when it was scanned and hashed while it arrived. */
export interface ReceivedBody {
  /** The whole body. */
  body: Uint8Array;
  /** Part digests computed while it arrived, when it was scanned. */
  digests?: PartDigests;
  /** The body's buffer came from (and goes back to) the server's body pool. */
  pooled: boolean;
}

/**
 * Reads a request body of at most `limit` bytes (`null` when it is larger). With `large`, a body
 * with a Content-Length of {@linkcode LARGE_BODY_BYTES} or more is read in place by a BYOB reader
 * into a buffer from `large.take` (give it back once nothing of the request can read it), and the
 * `large.observer` sees it arrive (delimiter marks, part digests on hashing threads). Without it,
 * such a body is held as it arrives: memory only for bytes received, never for bytes merely
 * declared. Aborting `signal` stops the reading: the rest of the body is cancelled and the call
 * rejects with the signal's reason.
 */
export async function readRequestBody(
  request: Request,
  limit: number,
  large?: { take: (size: number) => ArrayBuffer; observer: () => PartDigests | undefined },
  signal?: AbortSignal,
): Promise<ReceivedBody | null> {
  if (!request.body) return { body: new Uint8Array(0), pooled: false };
  signal?.throwIfAborted();
  const declared = declaredLength(request.headers) ?? NaN;
  if (
    large && Number.isSafeInteger(declared) && declared >= LARGE_BODY_BYTES && declared <= limit
  ) {
    // Read in place into a reused buffer (a BYOB reader moves the bytes straight there, about
    // twice as fast as copying 64 KiB chunks), scanned and hashed on other threads meanwhile.
    const digests = large.observer();
    let buffer = large.take(declared);
    let offset = 0;
    let byob: ReadableStreamBYOBReader | null = null;
    try {
      byob = request.body.getReader({ mode: "byob" });
    } catch {
      // not a byte stream (a Request built in code): copy its chunks into the buffer instead
    }
    if (byob) {
      const reader = byob;
      const stopCancelling = _cancelOnAbort(reader, signal);
      try {
        while (offset < declared) {
          const want = Math.min(declared - offset, _READ_STEP);
          const { value, done } = await _read(reader.read(new Uint8Array(buffer, offset, want)));
          signal?.throwIfAborted();
          if (value) buffer = value.buffer as ArrayBuffer; // the same memory, a new owner
          if (done || !value) break;
          offset += value.length;
          await digests?.update(new Uint8Array(buffer, 0, declared), offset);
        }
        if (offset === declared) {
          // Read on to the end of the stream: a body never seen to end keeps its connection
          // from being reused (closed after the answer, and only seconds later).
          const { done, value } = await _read(reader.read(new Uint8Array(1)));
          signal?.throwIfAborted();
          if (!done || (value && value.length > 0)) {
            throw new BodyLengthError("the request body is longer than its Content-Length");
          }
        }
      } finally {
        stopCancelling();
        reader.releaseLock();
      }
    } else {
      const target = new Uint8Array(buffer, 0, declared);
      for await (const chunk of _chunks(request.body, signal)) {
        if (offset + chunk.length > declared) {
          throw new BodyLengthError("the request body is longer than its Content-Length");
        }
        target.set(chunk, offset);
        offset += chunk.length;
        await digests?.update(target, offset);
      }
    }
    return { body: new Uint8Array(buffer, 0, offset), digests, pooled: true };
  }
  if (
    Number.isSafeInteger(declared) && declared >= 0 && declared <= limit &&
    declared < LARGE_BODY_BYTES
  ) {
    // One allocation, filled in place (no chunk list, no final copy).
    const body = new Uint8Array(declared);
    let offset = 0;
    for await (const chunk of _chunks(request.body, signal)) {
      if (offset + chunk.length > declared) {
        return offset + chunk.length > limit
          ? null
          : { body: concatBytes([body.subarray(0, offset), chunk]), pooled: false };
      }
      body.set(chunk, offset);
      offset += chunk.length;
    }
    return { body: offset === declared ? body : body.subarray(0, offset), pooled: false };
  }
  const chunks: Uint8Array[] = [];
  let total = 0;
  for await (const chunk of _chunks(request.body, signal)) {
    total += chunk.length;
    if (total > limit) return null;
    chunks.push(chunk);
  }
  return { body: chunks.length === 1 ? chunks[0] : concatBytes(chunks), pooled: false };
}

/**
 * The chunks of `body`; leaving early (or `signal` aborting, which rejects with its reason) cancels
 * the rest of it.
 */
async function* _chunks(
  body: ReadableStream<Uint8Array>,
  signal?: AbortSignal,
): AsyncGenerator<Uint8Array> {
  const reader = body.getReader();
  const stopCancelling = _cancelOnAbort(reader, signal);
  let ended = false;
  try {
    for (;;) {
      const { done, value } = await _read(reader.read());
      signal?.throwIfAborted();
      if (done) {
        ended = true;
        return;
      }
      yield value;
    }
  } finally {
    stopCancelling();
    if (!ended) await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

/** Cancels `reader` (its pending read ends) when `signal` aborts; returns the undo. */
function _cancelOnAbort(
  reader: ReadableStreamDefaultReader<Uint8Array> | ReadableStreamBYOBReader,
  signal: AbortSignal | undefined,
): () => void {
  if (!signal) return () => {};
  const abort = () => void reader.cancel(signal.reason).catch(() => {});
  signal.addEventListener("abort", abort, { once: true });
  return () => signal.removeEventListener("abort", abort);
}

/**
 * Intake, the first stage of `/execute`: admits a request body and reads it (413 over the limit,
 * 400 cut short, 503 at a stop). Up to four large bodies at once are read in place into reused
 * buffers while their parts are hashed and spooled on other threads.
 *
 * @module
 */
import { ERROR_MESSAGES, errorMessage } from "../../protocol/errors.ts";
import type { HashThreads } from "../../protocol/hash_threads.ts";
import { PartDigests } from "../../protocol/part_digests.ts";
import type { BodyBuffers } from "../../http/body_buffers.ts";
import { Rejection } from "../../http/rejection.ts";
import {
  BodyReadError,
  BodyTimeoutError,
  declaredLength,
  LARGE_BODY_BYTES,
  readRequestBody,
} from "../../http/request_body.ts";
import type { BlobStore } from "../cache/cache_memory.ts";

/** Large bodies read at once into buffers sized before their bytes arrive (as upstream's 4). */
const _MAX_LARGE_RECEIVES = 4;
const _BLOB_PART = /name="blob:[0-9a-f]{64}"/;
/** Why a body still arriving at shutdown stopped being read. */
const _SHUTTING_DOWN = new Error("the server is shutting down");

/** A request body that has arrived, and what must happen once the request is done with it. */
export interface ReceivedBody {
  /** The body's bytes. */
  readonly body: Uint8Array;
  /** Delimiter marks and part digests taken while it arrived (large bodies). */
  readonly digests: PartDigests | undefined;
  /** When reading began (`performance.now()`). */
  readonly receiveStart: number;
  /**
   * Its blobs are in the store (or were refused): spool files no blob took over are deleted
   * and the shared mirror goes back. Idempotent.
   */
  blobsResolved(): void;
  /** A cache write reading from the body began (the buffer is not reused before it ends). */
  noteDiskWrite(write: Promise<void>): void;
  /** The request is done with the body; a reused buffer goes back once cache writes end. */
  release(): void;
}

/** An `/execute` request whose small body comes whole from a node's link, not as a stream. */
export interface WholeBodyRequest {
  /** Its headers (`content-length`, `content-type`, `x-request-id`, `x-kcoral-stream`, ...). */
  readonly headers: Headers;
  /** The whole body (called at most once); rejects when it could not arrive. */
  bytes(): Promise<Uint8Array>;
  /** The body is not wanted (a 413, a stop): what still arrives is dropped. */
  discard(): void;
  /** Aborts once the request's client has gone (its program is then not started). */
  readonly signal?: AbortSignal;
}

/** Drops `request`'s body unread. */
export async function discardBody(request: Request | WholeBodyRequest): Promise<void> {
  if (request instanceof Request) await request.body?.cancel().catch(() => {});
  else request.discard();
}

/** The body reader of a server: its buffer pools, hashing threads and the bodies still arriving. */
export class Intake {
  readonly #o: IntakeOptions;
  /** Large bodies being read into buffers sized by their Content-Length. */
  #largeReceives = 0;
  /** Requests whose bodies are still arriving. */
  readonly #receiving = new Set<AbortController>();

  /** Reads bodies with `options`. */
  constructor(options: IntakeOptions) {
    this.#o = options;
  }

  /** Reads `request`'s body; throws a {@linkcode Rejection} (413, 400, 408 or 503). */
  async receive(request: Request | WholeBodyRequest): Promise<ReceivedBody> {
    const { maxRequestBytes, hashes, bodies, mirrors, store } = this.#o;
    const declared = declaredLength(request.headers); // NaN (not one length) passes both checks
    if (declared !== null && declared > maxRequestBytes) {
      await discardBody(request);
      throw _tooLarge();
    }
    if (!(request instanceof Request)) return await this.#receiveWhole(request);
    // At most a few large bodies at once get buffers sized by their Content-Length before their
    // bytes arrive (a declared length costs a client nothing); any others are held as they come.
    const inPlace = declared !== null && declared >= LARGE_BODY_BYTES &&
      this.#largeReceives < _MAX_LARGE_RECEIVES;
    if (inPlace) {
      hashes.warm();
      this.#largeReceives++;
    }
    const receiveStart = performance.now();
    let observed: PartDigests | undefined;
    let mirror: SharedArrayBuffer | undefined;
    let read;
    const receiving = new AbortController();
    this.#receiving.add(receiving);
    try {
      read = await readRequestBody(
        request,
        maxRequestBytes,
        !inPlace ? undefined : {
          take: (size) => bodies.take(size),
          observer: () =>
            observed = PartDigests.forMultipart(request.headers, hashes, {
              mirror: () => mirror = mirrors.take(declared!),
              // Blob payloads are also written to the memory cache's directory as they arrive.
              spool: (partHeader) =>
                store && _BLOB_PART.test(partHeader)
                  ? `${store.dir}/.spool-${crypto.randomUUID()}`
                  : undefined,
            }),
        },
        receiving.signal,
      );
    } catch (error) {
      this.#endBody(observed, mirror);
      if (error === _SHUTTING_DOWN) throw busyRejection();
      // A body cut short or framed wrongly is the request's fault (400); one that stalled, 408.
      if (!(error instanceof BodyReadError)) throw error;
      if (error instanceof BodyTimeoutError || error.cause instanceof BodyTimeoutError) {
        throw new Rejection(408, "timeout", error.message, "rejected", {
          error_kind: "body_timeout",
        });
      }
      throw invalidRequest(`the request body could not be read: ${error.message}`);
    } finally {
      this.#receiving.delete(receiving);
      if (inPlace) this.#largeReceives--;
    }
    if (read === null) {
      this.#endBody(observed, mirror);
      throw _tooLarge();
    }
    return this.#received(read.body, read.digests, read.pooled, mirror, receiveStart);
  }

  /** A {@linkcode WholeBodyRequest}'s body, under the rules of a streamed small body. */
  async #receiveWhole(request: WholeBodyRequest): Promise<ReceivedBody> {
    const receiveStart = performance.now();
    const receiving = new AbortController();
    const { promise: stopped, reject: stop } = Promise.withResolvers<never>();
    receiving.signal.addEventListener("abort", () => stop(receiving.signal.reason), { once: true });
    this.#receiving.add(receiving);
    let body: Uint8Array;
    try {
      body = await Promise.race([request.bytes(), stopped]);
    } catch (error) {
      if (error === _SHUTTING_DOWN) {
        request.discard();
        throw busyRejection();
      }
      throw invalidRequest(`the request body could not be read: ${errorMessage(error)}`);
    } finally {
      this.#receiving.delete(receiving);
    }
    if (body.length > this.#o.maxRequestBytes) throw _tooLarge();
    return this.#received(body, undefined, false, undefined, receiveStart);
  }

  /** What the pipeline holds of a body that has arrived. */
  #received(
    body: Uint8Array,
    digests: PartDigests | undefined,
    pooled: boolean,
    mirror: SharedArrayBuffer | undefined,
    receiveStart: number,
  ): ReceivedBody {
    const bodies = this.#o.bodies;
    let ended = false;
    let released = false;
    let diskWrite: Promise<void> | null = null;
    return {
      body,
      digests,
      receiveStart,
      blobsResolved: () => {
        if (!ended) this.#endBody(digests, mirror);
        ended = true;
      },
      noteDiskWrite: (write) => diskWrite = write,
      release: () => {
        if (!ended) this.#endBody(digests, mirror);
        ended = true;
        if (released || !pooled) return;
        released = true;
        const buffer = body.buffer as ArrayBuffer;
        if (diskWrite) diskWrite.finally(() => bodies.give(buffer));
        else bodies.give(buffer);
      },
    };
  }

  /** A stop began: bodies still arriving are given up (each answered 503). */
  stop(): void {
    for (const receiving of this.#receiving) receiving.abort(_SHUTTING_DOWN);
  }

  /** Deletes spool files no blob took over; the mirror goes back unless a thread may read it. */
  #endBody(digests: PartDigests | undefined, mirror: SharedArrayBuffer | undefined): void {
    if (!digests) return;
    this.#o.track(
      digests.discardSpooled().then((idle) => {
        if (mirror && idle) this.#o.mirrors.give(mirror);
      }),
    );
  }
}

/** What an {@linkcode Intake} reads with. */
export interface IntakeOptions {
  /** The request limit (`--max-request-bytes`). */
  maxRequestBytes: number;
  /** Threads hashing and spooling large bodies. */
  hashes: HashThreads;
  /** Reused buffers for large bodies. */
  bodies: BodyBuffers<ArrayBuffer>;
  /** Reused shared copies of large bodies that the hashing threads read. */
  mirrors: BodyBuffers<SharedArrayBuffer>;
  /** The memory cache, whose directory blob payloads are spooled into (`null`: none). */
  store: BlobStore | null;
  /** Work left running in the background (awaited when the server stops). */
  track: (task: Promise<void>) => void;
}

/** A 400 `parse` for a request that breaks the protocol (logged as `invalid_request`). */
export function invalidRequest(message: string): Rejection {
  return new Rejection(400, "parse", message, "rejected", {
    error_kind: "invalid_request",
    error_message: message.slice(0, 2048),
  });
}

/** A 503 `busy`: no worker (or the server is stopping), after `queueMs` waiting. */
export function busyRejection(queueMs = 0): Rejection {
  return new Rejection(503, "busy", ERROR_MESSAGES.busy, "no_worker", { queue_ms: queueMs });
}

function _tooLarge(): Rejection {
  return new Rejection(413, "request_too_large", ERROR_MESSAGES.requestTooLarge, "rejected", {
    error_kind: "request_too_large",
  });
}

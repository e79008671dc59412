/**
 * A small HTTP/1.1 client over `Deno.connect`, used for plain-HTTP servers reached without a
 * proxy. It exists for speed: `fetch` copies a request body before sending it and hands a
 * response to JavaScript in small chunks, which made a 64 MiB tensor cost several times the
 * time of the wire (measured on the H200 host: 128 MiB upload 245 ms with fetch, ~100 ms
 * here; 64 MiB download 129 ms with fetch, ~50 ms here). Bodies are written straight from the
 * caller's buffers and a response with a Content-Length is read straight into one buffer
 * (`http1_reader.ts`).
 *
 * Scope: one request at a time per connection, keep-alive connections pooled, Content-Length
 * and chunked response bodies (or read-to-close), 1xx interim responses skipped. HTTPS and
 * proxies stay with `fetch`.
 *
 * @module
 */

import { concatBytes } from "../../protocol/bytes.ts";
import { type ConnectTarget, connectTcp } from "./connect.ts";
import {
  type Allocation,
  FIRST_READ_BYTES,
  NothingReceived,
  type PendingRead,
  readResponse,
  ResponseReader,
} from "./http1_reader.ts";
import { Prefault, PREFAULT_SLACK, PrefaultPlan } from "./prefault.ts";
import type { BodyObserver, TransportResponse } from "./transport.ts";

/** Where to connect and how long a connection attempt may take. */
export interface Http1Target extends ConnectTarget {
  /** The `Host` header value (host and, when not the default, port). */
  host: string;
  /** Idle connections older than this are not reused (default 4000 ms; see `_IDLE_REUSE_MS`). */
  idleReuseMs?: number;
}

const _SMALL_BODY = 64 * 1024;
/**
 * Idle connections older than this are closed, not reused: below the keep-alive timeout of
 * common servers (uvicorn's 5 s), so a request never races the server closing its connection
 * (which a POST, fully sent, could not be retried after).
 */
const _IDLE_REUSE_MS = 4000;

/**
 * An idle keep-alive connection. A read is always pending on it (unref'd: it never keeps the
 * process alive), so a connection the server closes, or one that receives anything unasked, is
 * dropped from the pool at once instead of failing the next request; that read's buffer and
 * result become the first read of the next response.
 */
interface _Idle extends PendingRead {
  conn: Deno.TcpConn;
  /** When it was parked (`performance.now()`). */
  since: number;
}

/** A pool of keep-alive connections to one server. */
export class Http1Agent {
  readonly #target: Http1Target;
  #idle: _Idle[] = [];
  #closed = false;
  readonly #prefault = new PrefaultPlan();

  /** An agent for `target`; connections open on first use. */
  constructor(target: Http1Target) {
    this.#target = target;
  }

  /** Closes idle connections; requests in flight finish, then close theirs. */
  close(): void {
    this.#closed = true;
    for (const idle of this.#idle.splice(0)) _closeQuietly(idle.conn);
  }

  /** Idle pooled connections (for tests and diagnostics). */
  get idleConnections(): number {
    return this.#idle.length;
  }

  /** Responses read into a buffer prepared while waiting (for tests and diagnostics). */
  get prefaultedResponses(): number {
    return this.#prefault.hits;
  }

  #park(conn: Deno.TcpConn): void {
    const buffer = new Uint8Array(FIRST_READ_BYTES);
    conn.unref();
    const read = conn.read(buffer).catch((error: Error) => error);
    const idle: _Idle = { conn, buffer, read, since: performance.now() };
    this.#idle.push(idle);
    read.then(() => {
      // Anything while idle (the server closing it, an error, stray bytes) ends it.
      const index = this.#idle.indexOf(idle);
      if (index < 0) return; // taken by a request: the result is that response's first read
      this.#idle.splice(index, 1);
      _closeQuietly(conn);
    });
  }

  #take(): _Idle | undefined {
    const now = performance.now();
    for (;;) {
      const idle = this.#idle.pop();
      if (!idle) return undefined;
      if (now - idle.since > (this.#target.idleReuseMs ?? _IDLE_REUSE_MS)) {
        _closeQuietly(idle.conn); // its server may be closing it right now
        continue;
      }
      idle.conn.ref();
      return idle;
    }
  }

  /** Sends one request and reads its whole response. */
  async request(
    method: string,
    target: string,
    headers: Headers,
    body: readonly Uint8Array[] = [],
    observe?: (headers: Headers) => BodyObserver | undefined,
    signal?: AbortSignal,
    onSent?: (sent: number, total: number) => void,
    watch?: (headers: Headers) => ((piece: Uint8Array) => void) | undefined,
  ): Promise<TransportResponse> {
    signal?.throwIfAborted();
    let length = 0;
    for (const chunk of body) length += chunk.length;
    let head = `${method} ${target} HTTP/1.1\r\nhost: ${this.#target.host}\r\n`;
    // `forEach`, not `for…of`: Deno's `Headers` iterator costs about six times as much.
    headers.forEach((value, name) => {
      if (name !== "host" && name !== "content-length" && name !== "connection") {
        head += `${name}: ${value}\r\n`;
      }
    });
    if (length > 0 || method === "POST" || method === "PUT") {
      head += `content-length: ${length}\r\n`;
    }
    head += "\r\n";
    // Header values are byte strings (read as latin1): one byte per character, so a value echoed
    // from a response (X-KCoral-Node) goes back with the very bytes it came with.
    const headBytes = new Uint8Array(head.length);
    for (let i = 0; i < head.length; i++) headBytes[i] = head.charCodeAt(i);
    const pieces = length <= _SMALL_BODY
      ? [concatBytes([headBytes, ...body])] // one write, one packet
      : [headBytes, ...body];
    for (let attempt = 0;; attempt++) {
      // The retry always opens a new connection: another pooled one may be just as stale.
      const pooled = attempt === 0 ? this.#take() : undefined;
      const conn = pooled?.conn ?? await connectTcp(this.#target, signal);
      // Aborting closes the connection: whatever is pending on it fails at once.
      const abort = () => _closeQuietly(conn);
      signal?.addEventListener("abort", abort, { once: true });
      if (signal?.aborted) abort(); // aborted while connecting: the listener came too late
      // After a large response the next one is likely as large (the same program again): one
      // request at a time prepares a buffer for it (each of many concurrent ones would hold one).
      const prepare = this.#prefault.begin();
      try {
        const { response, reusable, allocated } = await _exchange(
          conn,
          pieces,
          method,
          observe,
          pooled,
          prepare,
          onSent,
          watch,
        ).finally(() => this.#prefault.end(prepare));
        this.#prefault.record(allocated.bytes, allocated.prefaulted);
        if (reusable && !this.#closed) this.#park(conn);
        else _closeQuietly(conn);
        return response;
      } catch (error) {
        _closeQuietly(conn);
        signal?.throwIfAborted();
        // A server may close an idle keep-alive connection just as a request is sent on it
        // (closings noticed earlier never get here): the request goes again on a new connection
        // if it cannot have run. A POST that was all sent may have (the server can take it,
        // run it and drop the connection): that is the caller's TransportError, never a rerun.
        if (
          pooled && attempt === 0 && error instanceof NothingReceived &&
          (method === "GET" || method === "HEAD" || !error.sent)
        ) continue;
        throw error instanceof NothingReceived
          ? new Error("the server closed the connection without answering", { cause: error.cause })
          : error;
      } finally {
        signal?.removeEventListener("abort", abort);
      }
    }
  }
}

async function _exchange(
  conn: Deno.TcpConn,
  pieces: Uint8Array[],
  method: string,
  observe: ((headers: Headers) => BodyObserver | undefined) | undefined,
  pooled: _Idle | undefined,
  expectedBody: number,
  onSent?: (sent: number, total: number) => void,
  watch?: (headers: Headers) => ((piece: Uint8Array) => void) | undefined,
): Promise<{ response: TransportResponse; reusable: boolean; allocated: Allocation }> {
  // The body is written while the response is read: a server may answer early (413) without
  // reading the rest, and that answer must not be lost behind a blocked write.
  let written = false;
  let writeFailed = false;
  // Once the request is out, a buffer of the expected answer's size is touched while waiting.
  let spare: Prefault | null = null;
  const writing = (async () => {
    try {
      if (onSent) {
        const total = pieces.reduce((n, piece) => n + piece.length, 0);
        let sent = 0;
        for (const piece of pieces) {
          await _writeAll(conn, piece, (n) => onSent(sent += n, total));
        }
      } else {
        for (const piece of pieces) await _writeAll(conn, piece);
      }
      written = true;
      if (expectedBody > 0) spare = new Prefault(expectedBody + PREFAULT_SLACK);
    } catch {
      writeFailed = true;
    }
  })();
  const reader = new ResponseReader(conn, pooled, (total?: number) => spare?.take(total) ?? null);
  let parsed;
  try {
    parsed = await readResponse(reader, method, observe, watch);
  } catch (error) {
    _closeQuietly(conn);
    await writing;
    if (error instanceof NothingReceived) error.sent = written && !writeFailed;
    throw error;
  } finally {
    (spare as Prefault | null)?.stop();
  }
  if (!written) {
    _closeQuietly(conn); // the server answered without taking the whole body
    await writing;
  }
  return {
    response: parsed.response,
    reusable: written && !writeFailed && parsed.keepAlive && reader.drained,
    allocated: reader.allocated,
  };
}

async function _writeAll(
  conn: Deno.TcpConn,
  bytes: Uint8Array,
  wrote?: (bytes: number) => void,
): Promise<void> {
  let view = bytes;
  while (view.length > 0) {
    const n = await conn.write(view);
    wrote?.(n);
    view = view.subarray(n);
  }
}

function _closeQuietly(conn: Deno.TcpConn): void {
  try {
    conn.close();
  } catch {
    // already closed
  }
}

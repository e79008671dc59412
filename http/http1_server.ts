/**
 * HTTP/1.1 served over connections this module owns (`Deno.listen` / `Deno.listenTls`), for
 * what `Deno.serve` cannot do (docs/decisions/0001-own-http1-connections.md): notice a client
 * that left while its request waits, cut connections that stall, bound how many are open, and
 * answer malformed framing with an ERROR body.
 *
 * ```
 *  accept ─▶ over maxConnections? ─▶ overflow: one GET of an overflow path (/health), else 503
 *  connection ─▶ idle (keepAliveTimeoutMs: closed quietly) ─▶ head (headerTimeoutMs from its
 *    first byte: 408; malformed: 400/431/505 ERROR body; then closed)
 *  ─▶ Request (body: a byte stream read straight into the reader's buffer; no progress for
 *    bodyTimeoutMs: 408 written here, connection closed, the stream fails with
 *    BodyTimeoutError) ─▶ body read whole ─▶ a read stays pending on the socket: the end of the
 *    connection aborts `request.signal` (the client has gone)
 *  ─▶ handler's Response ─▶ written (Content-Length, or chunked) ─▶ keep-alive or close
 *  accept fails (no descriptor left) ─▶ logged once, retried with backoff, logged when it works
 * ```
 *
 * @module
 */
import { errorBody } from "../protocol/errors.ts";
import { concatBytes } from "../protocol/bytes.ts";
import {
  type BodyFraming,
  headEnd,
  HeadError,
  parseRequestHead,
  type RequestHead,
} from "./http1_head.ts";
import { BodyReadError, BodyTimeoutError } from "./request_body.ts";

/** Limits on the connections of one listener. */
export interface ConnectionLimits {
  /** A request head must arrive whole within this many ms of its first byte (then 408). */
  headerTimeoutMs: number;
  /** A connection with no request begun is closed after this many ms. */
  keepAliveTimeoutMs: number;
  /** A request body that makes no progress for this many ms is cut (408). */
  bodyTimeoutMs: number;
  /** Connections served at once; beyond, only the overflow paths are answered. */
  maxConnections: number;
}

/**
 * The defaults of {@linkcode ConnectionLimits}: heads within 10 s, idle connections 30 s (above
 * the 4 s the TypeScript client reuses one for, and uvicorn's 5 s), bodies 30 s without a byte,
 * 1024 connections.
 */
export const DEFAULT_CONNECTION_LIMITS: Readonly<ConnectionLimits> = Object.freeze({
  headerTimeoutMs: 10_000,
  keepAliveTimeoutMs: 30_000,
  bodyTimeoutMs: 30_000,
  maxConnections: 1024,
});

/** Why a connection was cut or refused (`connection_cut`'s `reason`). */
export type ConnectionCut =
  | "header_timeout"
  | "body_timeout"
  | "malformed_request"
  | "too_many_connections";

/** What {@linkcode serveHttp1} serves and reports. */
export interface Http1ServeOptions {
  /** Bind address. */
  hostname: string;
  /** Port (0: any free one). */
  port: number;
  /** HTTPS with this certificate and key. */
  tls?: { cert: string; key: string } | null;
  /** Connection limits (default {@linkcode DEFAULT_CONNECTION_LIMITS}). */
  limits?: Partial<ConnectionLimits>;
  /** Handles one request. */
  handler: (request: Request, info: Deno.ServeHandlerInfo<Deno.NetAddr>) => Promise<Response>;
  /** Paths a connection beyond `maxConnections` may still GET (default `/health`). */
  overflowPaths?: readonly string[];
  /** A connection was cut or refused. */
  onCut?: (reason: ConnectionCut, fields: Record<string, unknown>) => void;
  /** The listener could not accept (`exhausted`, with the error) or can again (`recovered`). */
  onListener?: (state: "exhausted" | "recovered", fields: Record<string, unknown>) => void;
}

/** A listener serving HTTP/1.1. */
export interface Http1Server {
  /** The bound address. */
  readonly addr: Deno.NetAddr;
  /** Resolves once stopped and every connection has closed. */
  readonly finished: Promise<void>;
  /** Connections open now (overflow ones included). */
  readonly connections: number;
  /**
   * Stops accepting, closes connections between requests, lets requests in progress be
   * answered (their connections close after); resolves like `finished`.
   */
  shutdown(): Promise<void>;
}

const _HEAD_LIMIT = 64 * 1024;
const _FIRST_BUFFER = 4 * 1024;
/** What a connection reads ahead (pipelined requests) while watching for its client's end. */
const _LOOKAHEAD_LIMIT = 64 * 1024;
/** Connections beyond the bound served at once; more are closed unread. */
const _OVERFLOW_LIMIT = 64;
/** How long a refused or cut connection's unread input is drained before it closes. */
const _LINGER_MS = 1000;
const _LINGER_BYTES = 4 * 1024 * 1024;
const _ACCEPT_RETRY_FIRST_MS = 10;
const _ACCEPT_RETRY_MAX_MS = 1000;
const _BODY_CHUNK = 64 * 1024;
const _encoder = new TextEncoder();
const _TIMEOUT = Symbol("timeout");
const _HOP_BY_HOP = new Set(["connection", "keep-alive", "transfer-encoding", "upgrade"]);

/** The client's connection ended while its request was in progress. */
export class ClientGoneError extends Error {
  /** `"ClientGoneError"`. */
  override name = "ClientGoneError";
}

/**
 * Listens on `hostname:port` and serves `handler` over HTTP/1.1.
 *
 * @example
 * ```ts
 * import { serveHttp1 } from "./http1_server.ts";
 *
 * const server = serveHttp1({
 *   hostname: "127.0.0.1",
 *   port: 0,
 *   handler: (request) => Promise.resolve(new Response(`hello ${new URL(request.url).pathname}`)),
 * });
 * const response = await fetch(`http://127.0.0.1:${server.addr.port}/x`);
 * if ((await response.text()) !== "hello /x") throw new Error();
 * await server.shutdown();
 * ```
 */
export function serveHttp1(options: Http1ServeOptions): Http1Server {
  return new _Server(options);
}

class _Server implements Http1Server {
  readonly addr: Deno.NetAddr;
  readonly finished: Promise<void>;
  readonly #o: Http1ServeOptions;
  readonly #limits: ConnectionLimits;
  readonly #overflowPaths: readonly string[];
  readonly #listener: Deno.Listener;
  readonly #open = new Set<_Connection>();
  readonly #overflow = new Set<_Connection>();
  #closing = false;
  readonly #allClosed = Promise.withResolvers<void>();
  /** One timer for every connection's head and idle deadlines (none per request). */
  readonly #sweep: ReturnType<typeof setInterval>;

  constructor(options: Http1ServeOptions) {
    this.#o = options;
    this.#limits = { ...DEFAULT_CONNECTION_LIMITS, ...options.limits };
    this.#overflowPaths = options.overflowPaths ?? ["/health"];
    const where = { hostname: options.hostname, port: options.port, transport: "tcp" as const };
    this.#listener = options.tls
      ? Deno.listenTls({ ...where, ...options.tls, alpnProtocols: ["http/1.1"] })
      : Deno.listen(where);
    this.addr = this.#listener.addr as Deno.NetAddr;
    const { headerTimeoutMs, keepAliveTimeoutMs } = this.#limits;
    const tick = Math.min(Math.max(Math.min(headerTimeoutMs, keepAliveTimeoutMs) / 4, 10), 250);
    this.#sweep = setInterval(() => {
      const now = performance.now();
      for (const connection of this.#open) connection.checkDeadline(now);
      for (const connection of this.#overflow) connection.checkDeadline(now);
    }, tick);
    Deno.unrefTimer(this.#sweep);
    const accepting = this.#accept();
    this.finished = accepting.then(() => this.#allClosed.promise).finally(() =>
      clearInterval(this.#sweep)
    );
  }

  get connections(): number {
    return this.#open.size + this.#overflow.size;
  }

  shutdown(): Promise<void> {
    if (!this.#closing) {
      this.#closing = true;
      try {
        this.#listener.close();
      } catch {
        // already closed
      }
      for (const connection of this.#open) connection.stop();
      for (const connection of this.#overflow) connection.stop();
      this.#settle();
    }
    return this.finished;
  }

  #settle(): void {
    if (this.#closing && this.#open.size === 0 && this.#overflow.size === 0) {
      this.#allClosed.resolve();
    }
  }

  async #accept(): Promise<void> {
    let failures = 0;
    let delay = _ACCEPT_RETRY_FIRST_MS;
    for (;;) {
      let conn: Deno.Conn;
      try {
        conn = await this.#listener.accept();
      } catch (error) {
        if (this.#closing || error instanceof Deno.errors.BadResource) return;
        // Out of descriptors (EMFILE, ENFILE) or a connection aborted before it was taken:
        // the listener stays; accepting resumes once a descriptor is free.
        if (failures++ === 0) {
          this.#o.onListener?.("exhausted", { error: _message(error) });
        }
        await new Promise((resolve) => setTimeout(resolve, delay));
        delay = Math.min(2 * delay, _ACCEPT_RETRY_MAX_MS);
        continue;
      }
      if (failures > 0) {
        this.#o.onListener?.("recovered", { failed_accepts: failures });
        failures = 0;
        delay = _ACCEPT_RETRY_FIRST_MS;
      }
      if (this.#closing) {
        _close(conn);
        continue;
      }
      // Answers go out whole in one write: Nagle's algorithm would only delay them.
      try {
        (conn as Deno.TcpConn).setNoDelay?.(true);
      } catch {
        // a TLS connection offers no setNoDelay: its answers still go out in one write each
      }
      if (this.#open.size >= this.#limits.maxConnections) {
        this.#serveOverflow(conn);
        continue;
      }
      const connection = new _Connection(conn, this.#o, this.#limits, false, this.#overflowPaths);
      this.#open.add(connection);
      connection.run().finally(() => {
        this.#open.delete(connection);
        this.#settle();
      });
    }
  }

  /** A connection beyond the bound: an overflow path answered once; anything else 503. */
  #serveOverflow(conn: Deno.Conn): void {
    if (this.#overflow.size >= _OVERFLOW_LIMIT) {
      this.#o.onCut?.("too_many_connections", { answered: false });
      _close(conn);
      return;
    }
    const connection = new _Connection(conn, this.#o, this.#limits, true, this.#overflowPaths);
    this.#overflow.add(connection);
    connection.run().finally(() => {
      this.#overflow.delete(connection);
      this.#settle();
    });
  }
}

/** Bytes received on a connection and not yet consumed; at most one read pending. */
class _Input {
  buffer: Uint8Array = new Uint8Array(_FIRST_BUFFER);
  start = 0;
  end = 0;
  /** The connection ended (or failed) on the read side. */
  ended = false;
  #pending: Promise<boolean> | null = null;

  constructor(readonly conn: Deno.Conn) {}

  get buffered(): number {
    return this.end - this.start;
  }

  get reading(): boolean {
    return this.#pending !== null;
  }

  /** Reads more into the buffer: `true`, or `false` once the connection's input has ended. */
  more(): Promise<boolean> {
    if (this.#pending) return this.#pending;
    if (this.ended) return Promise.resolve(false);
    if (this.end === this.buffer.length) this.#makeRoom();
    this.#pending = this.conn.read(this.buffer.subarray(this.end)).then((n) => {
      this.#pending = null;
      if (n === null) this.ended = true;
      else this.end += n;
      return n !== null;
    }, () => {
      this.#pending = null;
      this.ended = true;
      return false;
    });
    return this.#pending;
  }

  /** Moves unread bytes to the front, or grows the buffer (only while no read is pending). */
  #makeRoom(): void {
    if (this.start > 0) {
      this.buffer.copyWithin(0, this.start, this.end);
      this.end -= this.start;
      this.start = 0;
    } else {
      const grown = new Uint8Array(this.buffer.length * 2);
      grown.set(this.buffer.subarray(0, this.end));
      this.buffer = grown;
    }
  }

  /** Takes up to `n` buffered bytes into `target`; how many. */
  take(target: Uint8Array, n: number): number {
    const k = Math.min(n, this.buffered);
    target.set(this.buffer.subarray(this.start, this.start + k));
    this.start += k;
    return k;
  }

  /** The buffered bytes up to `length` bytes, consumed. */
  takeBytes(length: number): Uint8Array {
    const bytes = this.buffer.slice(this.start, this.start + length);
    this.start += length;
    return bytes;
  }
}

/** One client connection: requests in turn until it closes. */
class _Connection {
  readonly #conn: Deno.Conn;
  readonly #input: _Input;
  readonly #o: Http1ServeOptions;
  readonly #limits: ConnectionLimits;
  readonly #overflow: boolean;
  readonly #overflowPaths: readonly string[];
  /** Between requests (closing it loses nothing). */
  #idle = true;
  #stopping = false;
  #closed = false;
  /** Something was written on the current exchange (an interim 100, or the answer). */
  #answered = false;
  /** When the idle wait or the head being read times out (`performance.now()`; 0: never). */
  #deadline = 0;
  /** Whether {@linkcode _Connection.#deadline} is a head's (408) or an idle wait's (closed). */
  #deadlineForHead = false;
  /** The deadline passed: the connection is being closed. */
  #expired = false;
  /** A stalled head's 408 being written. */
  #expiring: Promise<void> | null = null;

  constructor(
    conn: Deno.Conn,
    options: Http1ServeOptions,
    limits: ConnectionLimits,
    overflow: boolean,
    overflowPaths: readonly string[],
  ) {
    this.#conn = conn;
    this.#input = new _Input(conn);
    this.#o = options;
    this.#limits = limits;
    this.#overflow = overflow;
    this.#overflowPaths = overflowPaths;
  }

  /** The sweep's look at this connection's deadline. */
  checkDeadline(now: number): void {
    if (this.#deadline === 0 || now < this.#deadline || this.#expired) return;
    this.#expired = true;
    this.#deadline = 0;
    if (!this.#deadlineForHead) {
      this.#close(); // idle: closed quietly (the pending read ends)
      return;
    }
    this.#expiring = this.#refuse(
      408,
      "timeout",
      "request head not received in time",
      "header_timeout",
    )
      .finally(() => this.#close());
  }

  /** Closes the connection now if it is between requests, else after the current answer. */
  stop(): void {
    this.#stopping = true;
    if (this.#idle) this.#close();
  }

  async run(): Promise<void> {
    try {
      for (;;) {
        this.#idle = true;
        const head = await this.#readHead();
        if (head === null) return;
        this.#idle = false;
        if (!await this.#exchange(head) || this.#stopping || this.#overflow) return;
      }
    } catch {
      // a write to a connection its client closed: nothing to answer
    } finally {
      await this.#expiring;
      this.#close();
    }
  }

  #close(): void {
    if (this.#closed) return;
    this.#closed = true;
    _close(this.#conn);
  }

  /**
   * The next request head; `null` once the connection should close (ended, idle too long, or
   * a head refused and answered).
   */
  async #readHead(): Promise<RequestHead | null> {
    const input = this.#input;
    this.#deadline = 0;
    for (;;) {
      // Empty lines before a request line are skipped (RFC 9112 §2.2).
      while (
        input.buffered > 0 &&
        (input.buffer[input.start] === 13 || input.buffer[input.start] === 10)
      ) input.start++;
      if (input.buffered > 0) {
        const end = headEnd(input.buffer, input.start, input.end);
        if (end !== -1) {
          this.#deadline = 0;
          const bytes = input.buffer.subarray(input.start, end);
          input.start = end;
          try {
            return parseRequestHead(bytes);
          } catch (error) {
            if (!(error instanceof HeadError)) throw error;
            await this.#refuse(error.status, "parse", error.message, "malformed_request");
            return null;
          }
        }
        if (input.buffered >= _HEAD_LIMIT) {
          const message = `request head larger than ${_HEAD_LIMIT} bytes`;
          await this.#refuse(431, "parse", message, "malformed_request");
          return null;
        }
        // The head began: it has the header timeout from its first byte.
        if (!this.#deadlineForHead || this.#deadline === 0) {
          this.#deadlineForHead = true;
          this.#deadline = performance.now() + this.#headerTimeout;
        }
      } else if (this.#deadline === 0) {
        this.#deadlineForHead = false;
        this.#deadline = performance.now() +
          (this.#overflow ? this.#headerTimeout : this.#limits.keepAliveTimeoutMs);
      }
      if (this.#stopping) return null;
      const more = await input.more();
      // The sweep closes a connection whose deadline passed (answering a stalled head 408).
      if (this.#expired || !more) return null;
    }
  }

  get #headerTimeout(): number {
    return this.#overflow
      ? Math.min(this.#limits.headerTimeoutMs, _LINGER_MS * 2)
      : this.#limits.headerTimeoutMs;
  }

  /** Answers a request the connection cannot go on after, then closes (after a short drain). */
  async #refuse(status: number, kind: string, message: string, cut: ConnectionCut): Promise<void> {
    const id = crypto.randomUUID();
    this.#o.onCut?.(cut, { request_id: id, status, message });
    await this.#writeError(status, id, kind, message);
    await this.#linger();
  }

  async #writeError(status: number, id: string, kind: string, message: string): Promise<void> {
    const body = _encoder.encode(errorBody(id, kind, message));
    const head = `HTTP/1.1 ${status} ${_reason(status)}\r\ncontent-type: application/json\r\n` +
      `x-request-id: ${id}\r\ncontent-length: ${body.length}\r\n` +
      (status === 503 ? "retry-after: 1\r\n" : "") +
      `date: ${_date()}\r\nconnection: close\r\n\r\n`;
    this.#answered = true;
    await _writeAll(this.#conn, concatBytes([_encoder.encode(head), body])).catch(() => {});
  }

  /**
   * Ends the write side and reads what the client still sends for a moment, so that closing
   * does not reset a connection whose answer the client has not read yet.
   */
  async #linger(): Promise<void> {
    try {
      await this.#conn.closeWrite();
    } catch {
      return;
    }
    const input = this.#input;
    const timer = setTimeout(() => this.#close(), _LINGER_MS);
    try {
      let drained = 0;
      while (drained < _LINGER_BYTES && await input.more()) {
        drained += input.buffered;
        input.start = input.end = 0;
      }
    } finally {
      clearTimeout(timer);
    }
  }

  /** One request and its answer; whether the connection may carry another. */
  async #exchange(head: RequestHead): Promise<boolean> {
    this.#answered = false;
    const path = head.target.split("?")[0];
    if (
      this.#overflow &&
      !((head.method === "GET" || head.method === "HEAD") && this.#overflowPaths.includes(path))
    ) {
      await this.#refuse(503, "busy", "server saturated", "too_many_connections");
      return false;
    }
    const gone = new AbortController();
    const watch = new _ClientWatch(this.#input, gone);
    const noBody = head.framing.kind === "none" || head.method === "GET" ||
      head.method === "HEAD";
    // A small body that came with its head is given whole (no stream to pull it through).
    const whole = !noBody && head.framing.kind === "length" &&
        head.framing.length <= _BODY_CHUNK && head.framing.length <= this.#input.buffered
      ? this.#input.takeBytes(head.framing.length)
      : null;
    const body = noBody || whole ? null : new _Body(
      this.#input,
      head.framing,
      this.#limits.bodyTimeoutMs,
      {
        started: () => {
          if (head.expectContinue && !this.#answered) {
            return _writeAll(this.#conn, _CONTINUE).catch(() => {});
          }
        },
        ended: () => watch.start(),
        failed: (error) => {
          if (error instanceof ClientGoneError) gone.abort(error);
        },
        stalled: () => void this.#cutStalledBody(head),
      },
    );
    if (head.framing.kind === "none" || whole) watch.start();
    let request: Request;
    try {
      const host = head.fields.find(([name]) => name === "host")?.[1] ?? "localhost";
      const url = head.target[0] === "/"
        ? `${this.#o.tls ? "https" : "http"}://${host}${head.target}`
        : head.target === "*"
        ? `http://${host}/`
        : head.target;
      request = new Request(url, {
        method: head.method,
        headers: head.fields,
        body: whole ?? body?.stream ?? null,
        signal: gone.signal,
        duplex: "half",
      } as RequestInit);
    } catch {
      watch.stop();
      await this.#refuse(
        400,
        "parse",
        "invalid Host header or request target",
        "malformed_request",
      );
      return false;
    }
    const completed = Promise.withResolvers<void>();
    let response: Response;
    try {
      response = await this.#o.handler(request, {
        remoteAddr: this.#conn.remoteAddr as Deno.NetAddr,
        completed: completed.promise,
      });
    } catch (error) {
      const id = crypto.randomUUID();
      console.error(`request ${id} failed in its handler: ${_message(error)}`);
      response = new Response(errorBody(id, "engine", "internal server error"), {
        status: 500,
        headers: { "content-type": "application/json", "x-request-id": id },
      });
    }
    if (body?.cut) {
      // The stalled body was answered (408) and the connection closed.
      await response.body?.cancel().catch(() => {});
      watch.stop();
      completed.resolve();
      return false;
    }
    // A body not read to its end leaves the connection unusable for another request.
    const bodyDone = head.framing.kind === "none" || whole !== null ||
      (body !== null && body.dropBuffered());
    const keepAlive = head.keepAlive && bodyDone && !this.#stopping && !head.upgrade;
    let written = false;
    try {
      written = await _writeResponse(this.#conn, head, response, keepAlive && !this.#overflow);
    } finally {
      watch.stop();
      completed.resolve();
    }
    if (!written) {
      gone.abort(new ClientGoneError("the client's connection closed during the answer"));
      return false;
    }
    if (!bodyDone) await this.#linger();
    return keepAlive && bodyDone && !this.#input.ended;
  }

  /** A body that stopped arriving: 408 here, then the connection closes (the read ends). */
  async #cutStalledBody(head: RequestHead): Promise<void> {
    const seconds = this.#limits.bodyTimeoutMs / 1000;
    const message = `request body not received in time: no bytes for ${seconds} s`;
    const id = crypto.randomUUID();
    this.#o.onCut?.("body_timeout", { request_id: id, status: 408, method: head.method });
    if (!this.#answered) await this.#writeError(408, id, "timeout", message);
    this.#close();
  }
}

const _CONTINUE = _encoder.encode("HTTP/1.1 100 Continue\r\n\r\n");

/**
 * Watches a request's connection once its body has arrived: a read stays pending (what comes,
 * a pipelined request, is kept for later), and the end of the connection aborts `gone`.
 */
class _ClientWatch {
  #on = false;
  #stopped = false;

  constructor(readonly input: _Input, readonly gone: AbortController) {}

  start(): void {
    if (this.#on || this.#stopped) return;
    this.#on = true;
    void this.#run();
  }

  stop(): void {
    this.#stopped = true;
  }

  async #run(): Promise<void> {
    const input = this.input;
    while (!this.#stopped && input.buffered < _LOOKAHEAD_LIMIT) {
      if (!await input.more()) {
        if (!this.#stopped) {
          this.gone.abort(new ClientGoneError("the client's connection closed"));
        }
        return;
      }
    }
  }
}

/** What a {@linkcode _Body} tells its connection. */
interface _BodyEvents {
  /** The first read was asked for (an `Expect: 100-continue` is answered then). */
  started(): Promise<void> | void;
  /** The body was read to its end. */
  ended(): void;
  /** The body failed (cut short, framed wrongly, the client gone). */
  failed(error: Error): void;
  /** No byte came for the body timeout while a read waited. */
  stalled(): void;
}

/** A request body as a byte stream read straight into its reader's buffers. */
class _Body {
  readonly stream: ReadableStream<Uint8Array>;
  /** Read to its end. */
  ended = false;
  /** Cut for making no progress (answered 408 by the connection). */
  cut = false;
  readonly #input: _Input;
  readonly #framing: BodyFraming;
  readonly #timeoutMs: number;
  readonly #events: _BodyEvents;
  #remaining: number;
  /** Chunked: bytes left of the current chunk (0: a size line comes next). */
  #chunkLeft = 0;
  #started = false;
  /** When a read began waiting on the connection (0: none waits). */
  #waitingSince = 0;
  #lastProgress = 0;
  #watchdog: ReturnType<typeof setTimeout> | undefined;

  constructor(input: _Input, framing: BodyFraming, timeoutMs: number, events: _BodyEvents) {
    this.#input = input;
    this.#framing = framing;
    this.#timeoutMs = timeoutMs;
    this.#events = events;
    this.#remaining = framing.kind === "length" ? framing.length : 0;
    this.stream = new ReadableStream({
      type: "bytes",
      autoAllocateChunkSize: _BODY_CHUNK,
      pull: (controller) => this.#pull(controller),
      cancel: () => {
        clearTimeout(this.#watchdog);
      },
    });
  }

  /** A Content-Length body whose rest is already buffered is dropped: whether it was. */
  dropBuffered(): boolean {
    if (this.ended || this.#framing.kind !== "length") return this.ended;
    if (this.#input.buffered < this.#remaining) return false;
    this.#input.start += this.#remaining;
    this.#remaining = 0;
    this.ended = true;
    return true;
  }

  async #pull(controller: ReadableByteStreamController): Promise<void> {
    const request = controller.byobRequest!;
    const view = request.view!;
    const target = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
    if (!this.#started) {
      this.#started = true;
      await this.#events.started();
    }
    let n: number;
    try {
      n = this.#framing.kind === "chunked"
        ? await this.#readChunked(target)
        : await this.#readLength(target);
    } catch (error) {
      clearTimeout(this.#watchdog);
      const failure = this.cut ? new BodyTimeoutError(this.#timeoutMs) : error as Error;
      this.#events.failed(failure);
      controller.error(failure);
      return;
    }
    if (this.cut) {
      // A read that completed as the body was cut: its bytes are not given out.
      controller.error(new BodyTimeoutError(this.#timeoutMs));
      return;
    }
    if (n === 0) {
      this.#end();
      controller.close();
      request.respond(0);
      return;
    }
    request.respond(n);
    if (this.#framing.kind === "length" && this.#remaining === 0) {
      this.#end();
      controller.close();
    }
  }

  #end(): void {
    if (this.ended) return;
    this.ended = true;
    clearTimeout(this.#watchdog);
    this.#events.ended();
  }

  async #readLength(target: Uint8Array): Promise<number> {
    if (this.#remaining === 0) return 0;
    const want = Math.min(target.length, this.#remaining);
    const input = this.#input;
    let n = input.take(target, want);
    if (n === 0) {
      // Straight into the reader's buffer: nothing else reads this connection now.
      const got = await this.#wait(input.conn.read(target.subarray(0, want)));
      if (got === null) {
        input.ended = true;
        throw new ClientGoneError(
          "the request body ended before its Content-Length (the client closed the connection)",
        );
      }
      n = got;
    }
    this.#remaining -= n;
    return n;
  }

  async #readChunked(target: Uint8Array): Promise<number> {
    const input = this.#input;
    for (;;) {
      if (this.#chunkLeft > 0) {
        if (input.buffered === 0) await this.#fill();
        const n = input.take(target, Math.min(target.length, this.#chunkLeft));
        this.#chunkLeft -= n;
        if (this.#chunkLeft === 0) this.#chunkLeft = -1; // its CRLF comes next
        return n;
      }
      if (this.#chunkLeft === -1) {
        const line = await this.#line();
        if (line !== "") throw new BodyReadError("invalid chunked encoding: no CRLF after a chunk");
        this.#chunkLeft = 0;
        continue;
      }
      const line = await this.#line();
      const size = line.split(";")[0].trim();
      if (!/^[0-9a-fA-F]{1,12}$/.test(size)) {
        throw new BodyReadError(
          `invalid chunked encoding: chunk size ${JSON.stringify(size.slice(0, 20))}`,
        );
      }
      const length = parseInt(size, 16);
      if (length > 0) {
        this.#chunkLeft = length;
        continue;
      }
      // The last chunk: trailer fields (ignored) up to an empty line.
      for (let fields = 0; (await this.#line()) !== ""; fields++) {
        if (fields > 100) throw new BodyReadError("invalid chunked encoding: too many trailers");
      }
      return 0;
    }
  }

  /** One CRLF-terminated line of a chunked body (at most 4 KiB). */
  async #line(): Promise<string> {
    const input = this.#input;
    for (;;) {
      const at = input.buffer.subarray(input.start, input.end).indexOf(10);
      if (at !== -1) {
        const bytes = input.takeBytes(at + 1);
        const line = String.fromCharCode(...bytes.subarray(0, at));
        return line.endsWith("\r") ? line.slice(0, -1) : line;
      }
      if (input.buffered > 4096) throw new BodyReadError("invalid chunked encoding: line too long");
      await this.#fill();
    }
  }

  async #fill(): Promise<void> {
    if (!await this.#wait(this.#input.more())) {
      throw new ClientGoneError("the request body ended early (the client closed the connection)");
    }
  }

  /** A read of the connection under the progress watchdog. */
  async #wait<T>(read: Promise<T>): Promise<T> {
    const now = performance.now();
    this.#waitingSince = now;
    if (this.#lastProgress === 0) this.#lastProgress = now;
    if (this.#watchdog === undefined) this.#arm(this.#timeoutMs);
    try {
      return await read;
    } finally {
      this.#waitingSince = 0;
      this.#lastProgress = performance.now();
    }
  }

  /** One timer per body: it looks at the last progress when it fires, and re-arms. */
  #arm(ms: number): void {
    this.#watchdog = setTimeout(() => {
      if (this.ended) return;
      const since = this.#waitingSince === 0 ? 0 : performance.now() - this.#lastProgress;
      if (this.#waitingSince !== 0 && since >= this.#timeoutMs) {
        this.cut = true;
        this.#events.stalled();
        return;
      }
      this.#arm(this.#waitingSince === 0 ? this.#timeoutMs : this.#timeoutMs - since);
    }, Math.max(1, ms));
  }
}

/**
 * Writes `response` to `conn` for a request with `head`; whether it was written whole (false:
 * the connection failed, or the body did; the connection must close).
 */
async function _writeResponse(
  conn: Deno.Conn,
  head: RequestHead,
  response: Response,
  keepAlive: boolean,
): Promise<boolean> {
  const status = response.status;
  let lines = `HTTP/1.1 ${status} ${_reason(status)}\r\n`;
  const seen = { length: null as string | null, date: false };
  response.headers.forEach((value, name) => {
    if (_HOP_BY_HOP.has(name)) return;
    if (name === "content-length") seen.length = value;
    else if (name === "date") seen.date = true;
    lines += `${name}: ${value}\r\n`;
  });
  const declared = seen.length;
  if (!seen.date) lines += `date: ${_date()}\r\n`;
  if (!keepAlive) lines += "connection: close\r\n";
  const bodyless = head.method === "HEAD" || status === 204 || status === 304 || status < 200;
  if (!bodyless && declared !== null && Number(declared) <= _BODY_CHUNK) {
    // A small answer of declared length: its bytes (a string's or bytes' without a stream).
    try {
      const bytes = await response.bytes();
      await _writeAll(conn, concatBytes([_encoder.encode(`${lines}\r\n`), bytes]));
      return bytes.length === Number(declared);
    } catch {
      return false;
    }
  }
  const body = response.body;
  if (bodyless || !body) {
    await body?.cancel().catch(() => {});
    if (declared === null && !bodyless) lines += "content-length: 0\r\n";
    return await _writeAll(conn, _encoder.encode(`${lines}\r\n`)).then(() => true, () => false);
  }
  const reader = body.getReader();
  let ok = false;
  try {
    let first: ReadableStreamReadResult<Uint8Array> = await reader.read();
    if (declared === null) {
      // A body whose stream has already ended (a string or bytes) goes with its length; one
      // still coming (live output) chunked.
      const chunks: Uint8Array[] = [];
      while (!first.done) {
        chunks.push(first.value);
        const next = reader.read();
        const settled = await Promise.race([next, _macrotask()]);
        if (settled === _TIMEOUT) {
          first = { done: false, value: concatBytes(chunks) };
          chunks.length = 0;
          ok = await _writeChunked(conn, lines, first.value, reader, next);
          return ok;
        }
        first = settled as ReadableStreamReadResult<Uint8Array>;
      }
      const bytes = chunks.length === 1 ? chunks[0] : concatBytes(chunks);
      lines += `content-length: ${bytes.length}\r\n\r\n`;
      await _writeAll(conn, concatBytes([_encoder.encode(lines), bytes]));
      ok = true;
      return ok;
    }
    const length = Number(declared);
    let sent = 0;
    const headBytes = _encoder.encode(`${lines}\r\n`);
    if (!first.done && first.value.length <= _BODY_CHUNK) {
      await _writeAll(conn, concatBytes([headBytes, first.value]));
      sent += first.value.length;
      first = await reader.read();
    } else await _writeAll(conn, headBytes);
    while (!first.done) {
      await _writeAll(conn, first.value);
      sent += first.value.length;
      first = await reader.read();
    }
    ok = sent === length;
    return ok;
  } catch {
    return false;
  } finally {
    if (!ok) await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

async function _writeChunked(
  conn: Deno.Conn,
  lines: string,
  first: Uint8Array,
  reader: ReadableStreamDefaultReader<Uint8Array>,
  pending: Promise<ReadableStreamReadResult<Uint8Array>>,
): Promise<boolean> {
  await _writeAll(
    conn,
    concatBytes([_encoder.encode(`${lines}transfer-encoding: chunked\r\n\r\n`), _chunk(first)]),
  );
  for (let next = await pending; !next.done; next = await reader.read()) {
    if (next.value.length > 0) await _writeAll(conn, _chunk(next.value));
  }
  await _writeAll(conn, _encoder.encode("0\r\n\r\n"));
  return true;
}

function _chunk(bytes: Uint8Array): Uint8Array {
  if (bytes.length === 0) return bytes;
  return concatBytes([_encoder.encode(`${bytes.length.toString(16)}\r\n`), bytes, _CRLF]);
}

const _CRLF = _encoder.encode("\r\n");

async function _writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let offset = 0; offset < bytes.length;) offset += await conn.write(bytes.subarray(offset));
}

/** Resolves with {@linkcode _TIMEOUT} after the microtasks already queued have run. */
function _macrotask(): Promise<typeof _TIMEOUT> {
  return new Promise((resolve) => setTimeout(() => resolve(_TIMEOUT), 0));
}

function _close(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // already closed
  }
}

function _message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

let _dateSecond = 0;
let _dateText = "";

/** The `Date` header's value (RFC 9110 §5.6.7), made once a second. */
function _date(): string {
  const second = Math.floor(Date.now() / 1000);
  if (second !== _dateSecond) {
    _dateSecond = second;
    _dateText = new Date(second * 1000).toUTCString();
  }
  return _dateText;
}

const _REASONS: Record<number, string> = {
  100: "Continue",
  200: "OK",
  204: "No Content",
  304: "Not Modified",
  400: "Bad Request",
  401: "Unauthorized",
  404: "Not Found",
  405: "Method Not Allowed",
  408: "Request Timeout",
  413: "Content Too Large",
  426: "Upgrade Required",
  431: "Request Header Fields Too Large",
  500: "Internal Server Error",
  502: "Bad Gateway",
  503: "Service Unavailable",
  504: "Gateway Timeout",
  505: "HTTP Version Not Supported",
};

function _reason(status: number): string {
  return _REASONS[status] ?? "Unknown";
}

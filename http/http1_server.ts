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
 *    connection aborts `request.signal` (the client has gone) and cancels an answer's stream
 *  ─▶ handler's Response ─▶ written (Content-Length, or chunked) ─▶ keep-alive or close
 *     (a switchProtocols answer to an upgrade: 101 written, the connection handed over)
 *  accept fails (no descriptor left) ─▶ logged once, retried with backoff, logged when it works
 * ```
 *
 * @module
 */
import { errorBody } from "../protocol/errors.ts";
import { concatBytes } from "../protocol/bytes.ts";
import { ClientGoneError, ConnectionInput, RequestBody } from "./http1_input.ts";
import { httpDate, reasonPhrase, writeAll, writeResponse } from "./http1_response.ts";
import { headEnd, HeadError, parseRequestHead, type RequestHead } from "./http1_head.ts";

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
/** What a connection reads ahead (pipelined requests) while watching for its client's end. */
const _LOOKAHEAD_LIMIT = 64 * 1024;
/** Connections beyond the bound served at once; more are closed unread. */
const _OVERFLOW_LIMIT = 64;
/** How long a refused or cut connection's unread input is drained before it closes. */
const _LINGER_MS = 1000;
const _LINGER_BYTES = 4 * 1024 * 1024;
/** Connections a sweep closes before it lets the event loop go. */
const _EXPIRE_BATCH = 64;
const _ACCEPT_RETRY_FIRST_MS = 10;
const _ACCEPT_RETRY_MAX_MS = 1000;
const _BODY_CHUNK = 64 * 1024;
const _encoder = new TextEncoder();

export { ClientGoneError } from "./http1_input.ts";

/** A connection handed over after its `101 Switching Protocols` (see {@linkcode switchProtocols}). */
export interface SwitchedConnection {
  /** The connection, now the new protocol's: nothing of this server reads, writes or closes it. */
  conn: Deno.Conn;
  /** What the client sent after its request head (the new protocol's first bytes), if anything. */
  buffered: Uint8Array;
}

/** The `101`'s header fields and who takes the connection, per answer of `switchProtocols`. */
const _switches = new WeakMap<
  Response,
  { fields: readonly [string, string][]; take: (switched: SwitchedConnection) => void }
>();

/**
 * An answer to an upgrade request (`Connection: upgrade`, no body) that switches protocols:
 * {@linkcode serveHttp1} writes `101 Switching Protocols` with `fields`, then hands the
 * connection to `take`. The connection leaves the server then: no timeout, no place in
 * `maxConnections`, no close at a stop. Served by anything else, or for a request that is no
 * upgrade, the answer is a 500 (`Response` cannot carry a 101 itself).
 *
 * @example
 * ```ts
 * import { serveHttp1, switchProtocols } from "./http1_server.ts";
 *
 * const server = serveHttp1({
 *   hostname: "127.0.0.1",
 *   port: 0,
 *   handler: () =>
 *     Promise.resolve(switchProtocols([["upgrade", "echo"], ["connection", "upgrade"]], ({ conn }) => {
 *       conn.write(new TextEncoder().encode("switched")).finally(() => conn.close());
 *     })),
 * });
 * const conn = await Deno.connect({ hostname: "127.0.0.1", port: server.addr.port });
 * await conn.write(new TextEncoder().encode(
 *   "GET / HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: echo\r\n\r\n",
 * ));
 * let text = "";
 * const buffer = new Uint8Array(1024);
 * for (let n; (n = await conn.read(buffer)) !== null;) text += new TextDecoder().decode(buffer.subarray(0, n));
 * conn.close();
 * if (!text.startsWith("HTTP/1.1 101 ") || !text.endsWith("\r\n\r\nswitched")) throw new Error(text);
 * await server.shutdown();
 * ```
 */
export function switchProtocols(
  fields: readonly [string, string][],
  take: (switched: SwitchedConnection) => void,
): Response {
  const response = new Response("a protocol switch needs an upgrade request served by serveHttp1", {
    status: 500,
  });
  _switches.set(response, { fields, take });
  return response;
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
  /** A sweep is closing connections (the next waits for it). */
  #expiring = false;

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
    this.#sweep = setInterval(() => void this.#expireDue(), tick);
    Deno.unrefTimer(this.#sweep);
    const accepting = this.#accept();
    this.finished = accepting.then(() => this.#allClosed.promise).finally(() =>
      clearInterval(this.#sweep)
    );
  }

  get connections(): number {
    return this.#open.size + this.#overflow.size;
  }

  /**
   * Closes the connections whose deadline passed (answering stalled heads 408), a batch at a
   * time with the event loop let go between batches: thousands timing out together must not
   * hold `/health` for the length of the burst.
   */
  async #expireDue(): Promise<void> {
    if (this.#expiring) return;
    this.#expiring = true;
    try {
      const now = performance.now();
      const due = [...this.#open, ...this.#overflow].filter((c) => c.due(now));
      for (const [index, connection] of due.entries()) {
        connection.expire();
        if (index % _EXPIRE_BATCH === _EXPIRE_BATCH - 1) {
          await new Promise((resolve) => setTimeout(resolve, 0));
        }
      }
    } finally {
      this.#expiring = false;
    }
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

/** One client connection: requests in turn until it closes. */
class _Connection {
  readonly #conn: Deno.Conn;
  readonly #input: ConnectionInput;
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
  /** Handed over after a 101 (switchProtocols): this server no longer closes it. */
  #switched = false;

  constructor(
    conn: Deno.Conn,
    options: Http1ServeOptions,
    limits: ConnectionLimits,
    overflow: boolean,
    overflowPaths: readonly string[],
  ) {
    this.#conn = conn;
    this.#input = new ConnectionInput(conn);
    this.#o = options;
    this.#limits = limits;
    this.#overflow = overflow;
    this.#overflowPaths = overflowPaths;
  }

  /** Whether this connection's deadline has passed at `now`. */
  due(now: number): boolean {
    return this.#deadline !== 0 && now >= this.#deadline && !this.#expired;
  }

  /** Its deadline passed: closed (idle), or answered 408 and closed (a head that stalled). */
  expire(): void {
    if (this.#expired) return;
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
    if (this.#closed || this.#switched) return;
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
    const head =
      `HTTP/1.1 ${status} ${reasonPhrase(status)}\r\ncontent-type: application/json\r\n` +
      `x-request-id: ${id}\r\ncontent-length: ${body.length}\r\n` +
      (status === 503 ? "retry-after: 1\r\n" : "") +
      `date: ${httpDate()}\r\nconnection: close\r\n\r\n`;
    this.#answered = true;
    await writeAll(this.#conn, concatBytes([_encoder.encode(head), body])).catch(() => {});
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
    const body = noBody || whole ? null : new RequestBody(
      this.#input,
      head.framing,
      this.#limits.bodyTimeoutMs,
      {
        started: () => {
          if (head.expectContinue && !this.#answered) {
            return writeAll(this.#conn, _CONTINUE).catch(() => {});
          }
        },
        ended: () => watch.start(),
        failed: (error) => {
          if (error instanceof ClientGoneError) gone.abort(error);
        },
        stalled: () => void this.#cutStalledBody(head),
      },
    );
    // An upgrade's connection may be handed over: no read of ours may be pending on it then.
    if ((head.framing.kind === "none" || whole) && !head.upgrade) watch.start();
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
    const switching = _switches.get(response);
    if (switching) {
      watch.stop();
      completed.resolve();
      return await this.#switch(head, switching.fields, switching.take, response);
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
      written = await writeResponse(
        this.#conn,
        head,
        response,
        keepAlive && !this.#overflow,
        gone.signal,
      );
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

  /**
   * Writes the 101 of a switchProtocols answer and hands the connection to `take` (an answer
   * to a request that is no bodyless upgrade is written as it is: a 500); whether the
   * connection carries another request (never).
   */
  async #switch(
    head: RequestHead,
    fields: readonly [string, string][],
    take: (switched: SwitchedConnection) => void,
    response: Response,
  ): Promise<false> {
    if (!head.upgrade || head.framing.kind !== "none" || this.#input.reading) {
      await writeResponse(this.#conn, head, response, false);
      return false;
    }
    await response.body?.cancel().catch(() => {});
    let lines = "HTTP/1.1 101 Switching Protocols\r\n";
    for (const [name, value] of fields) lines += `${name}: ${value}\r\n`;
    lines += `date: ${httpDate()}\r\n\r\n`;
    try {
      await writeAll(this.#conn, _encoder.encode(lines));
    } catch {
      return false; // the client left: the connection closes
    }
    const input = this.#input;
    const buffered = input.buffer.slice(input.start, input.end);
    input.start = input.end = 0;
    this.#switched = true;
    take({ conn: this.#conn, buffered });
    return false;
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

  constructor(readonly input: ConnectionInput, readonly gone: AbortController) {}

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

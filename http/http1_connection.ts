/**
 * One client connection of http1_server.ts: request heads in turn under their deadlines (idle:
 * closed quietly; a stalled head: 408), each request handed to the handler with its body as a byte
 * stream, the answer written, keep-alive or close; malformed framing answered with an ERROR body; a
 * read left pending after the body so the client's end aborts `request.signal`; a `101` handing the
 * connection over.
 *
 * @module
 */
import { errorBody, errorMessage } from "../protocol/errors.ts";
import { concatBytes } from "../protocol/bytes.ts";
import { ClientGoneError, ConnectionInput, RequestBody } from "./http1_input.ts";
import { httpDate, reasonPhrase, writeAll, writeResponse } from "./http1_response.ts";
import { withWholeBody } from "./whole_body.ts";
import { headEnd, HeadError, parseRequestHead, type RequestHead } from "./http1_head.ts";
import { protocolSwitchOf, type SwitchedConnection, switchingHead } from "./http1_switch.ts";

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
 * The defaults of {@linkcode ConnectionLimits}: heads within 10 s, idle connections 30 s (above the
 * 4 s the TypeScript client reuses one for, and uvicorn's 5 s), bodies 30 s without a byte, 1024
 * connections.
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

/** What every connection of one listener is served with. */
export interface ConnectionSettings {
  /** Handles one request. */
  handler: (request: Request, info: Deno.ServeHandlerInfo<Deno.NetAddr>) => Promise<Response>;
  /** A connection was cut or refused. */
  onCut?: (reason: ConnectionCut, fields: Record<string, unknown>) => void;
  /** The listener is HTTPS (requests' URLs are `https:` ones). */
  tls: boolean;
  /** The limits, defaults filled in. */
  limits: ConnectionLimits;
  /** Paths a connection beyond `maxConnections` may still GET. */
  overflowPaths: readonly string[];
}

const _HEAD_LIMIT = 64 * 1024;
/** What a connection reads ahead (pipelined requests) while watching for its client's end. */
const _LOOKAHEAD_LIMIT = 64 * 1024;
/** How long a refused or cut connection's unread input is drained before it closes. */
const _LINGER_MS = 1000;
const _LINGER_BYTES = 4 * 1024 * 1024;
const _BODY_CHUNK = 64 * 1024;
const _encoder = new TextEncoder();

/** One client connection: requests in turn until it closes. */
export class Http1Connection {
  readonly #conn: Deno.Conn;
  readonly #input: ConnectionInput;
  readonly #settings: ConnectionSettings;
  readonly #limits: ConnectionLimits;
  readonly #overflow: boolean;
  /** Between requests (closing it loses nothing). */
  #idle = true;
  #stopping = false;
  #closed = false;
  /** Something was written on the current exchange (an interim 100, or the answer). */
  #answered = false;
  /** When the idle wait or the head being read times out (`performance.now()`; 0: never). */
  #deadline = 0;
  /** Whether {@linkcode Http1Connection.#deadline} is a head's (408) or an idle wait's (closed). */
  #deadlineForHead = false;
  /** The deadline passed: the connection is being closed. */
  #expired = false;
  /** A stalled head's 408 being written. */
  #expiring: Promise<void> | null = null;
  /** Handed over after a 101 (switchProtocols): this server no longer closes it. */
  #switched = false;

  /** `conn` served with `settings`; `overflow`: beyond `maxConnections` (one overflow path). */
  constructor(conn: Deno.Conn, settings: ConnectionSettings, overflow: boolean) {
    this.#conn = conn;
    this.#input = new ConnectionInput(conn);
    this.#settings = settings;
    this.#limits = settings.limits;
    this.#overflow = overflow;
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
    closeConnection(this.#conn);
  }

  /**
   * The next request head; `null` once the connection should close (ended, idle too long, or a head
   * refused and answered).
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
    this.#settings.onCut?.(cut, { request_id: id, status, message });
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
   * Ends the write side and reads what the client still sends for a moment, so that closing does
   * not reset a connection whose answer the client has not read yet.
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
      !((head.method === "GET" || head.method === "HEAD") &&
        this.#settings.overflowPaths.includes(path))
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
        ? `${this.#settings.tls ? "https" : "http"}://${host}${head.target}`
        : head.target === "*"
        ? `http://${host}/`
        : head.target;
      request = new _ConnectionRequest(url, head, whole ?? body?.stream ?? null, gone.signal);
      if (whole) withWholeBody(request, whole);
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
      response = await this.#settings.handler(request, {
        remoteAddr: this.#conn.remoteAddr as Deno.NetAddr,
        completed: completed.promise,
      });
    } catch (error) {
      const id = crypto.randomUUID();
      console.error(`request ${id} failed in its handler: ${errorMessage(error)}`);
      response = new Response(errorBody(id, "engine", "internal server error"), {
        status: 500,
        headers: { "content-type": "application/json", "x-request-id": id },
      });
    }
    const switching = protocolSwitchOf(response);
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
   * Writes the 101 of a switchProtocols answer and hands the connection to `take` (an answer to a
   * request that is no bodyless upgrade is written as it is: a 500); whether the connection carries
   * another request (never).
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
    try {
      await writeAll(this.#conn, switchingHead(fields));
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
    this.#settings.onCut?.("body_timeout", { request_id: id, status: 408, method: head.method });
    if (!this.#answered) await this.#writeError(408, id, "timeout", message);
    this.#close();
  }
}

const _CONTINUE = _encoder.encode("HTTP/1.1 100 Continue\r\n\r\n");

/**
 * A request read from a connection: its `signal` is its connection's own, aborted when the client's
 * end comes, where a `signal` in the init would make a second, dependent one per request (two weak
 * references and two weak sets; ~5 µs of a 12 µs `Request` in a loop, most of it the collector's).
 * Its header fields are appended once it is made, sparing the init's conversion of them into new
 * arrays (the same checks, the same list). A copy of it (`new Request(request)`, `clone()`) has a
 * signal of its own that nothing aborts.
 */
class _ConnectionRequest extends Request {
  readonly #signal: AbortSignal;

  constructor(
    url: string,
    head: RequestHead,
    body: Uint8Array | ReadableStream<Uint8Array> | null,
    signal: AbortSignal,
  ) {
    super(
      url,
      { method: head.method, body: body as BodyInit | null, duplex: "half" } as RequestInit,
    );
    this.#signal = signal;
    const headers = this.headers;
    for (const [name, value] of head.fields) headers.append(name, value);
  }

  override get signal(): AbortSignal {
    return this.#signal;
  }
}

/**
 * Watches a request's connection once its body has arrived: a read stays pending (what comes, a
 * pipelined request, is kept for later), and the end of the connection aborts `gone`.
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

/** Closes `conn`, already closed or not. */
export function closeConnection(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // already closed
  }
}

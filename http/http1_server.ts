/**
 * HTTP/1.1 on connections this server owns, for what `Deno.serve` cannot do
 * (docs/decisions/own-http1-connections.md): notice a client that left, cut stalled connections,
 * bound how many are open, answer malformed framing with an ERROR body. This module is the listener
 * (accept, the bound, one sweep timer for deadlines, the stop); a connection's requests are
 * http1_connection.ts's, a protocol switch http1_switch.ts's. A failing accept (no descriptor left)
 * is logged once and retried with backoff.
 *
 * @module
 */
import { errorMessage } from "../protocol/errors.ts";
import {
  closeConnection,
  type ConnectionCut,
  type ConnectionLimits,
  type ConnectionSettings,
  DEFAULT_CONNECTION_LIMITS,
  Http1Connection,
} from "./http1_connection.ts";

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
   * Stops accepting, closes connections between requests, lets requests in progress be answered
   * (their connections close after); resolves like `finished`.
   */
  shutdown(): Promise<void>;
}

/** Connections beyond the bound served at once; more are closed unread. */
const _OVERFLOW_LIMIT = 64;
/** Connections a sweep closes before it lets the event loop go. */
const _EXPIRE_BATCH = 64;
const _ACCEPT_RETRY_FIRST_MS = 10;
const _ACCEPT_RETRY_MAX_MS = 1000;

export { ClientGoneError } from "./http1_input.ts";
export {
  type ConnectionCut,
  type ConnectionLimits,
  DEFAULT_CONNECTION_LIMITS,
} from "./http1_connection.ts";
export { type SwitchedConnection, switchProtocols } from "./http1_switch.ts";

/** Listens on `hostname:port` and serves `handler` over HTTP/1.1. */
export function serveHttp1(options: Http1ServeOptions): Http1Server {
  return new _Server(options);
}

class _Server implements Http1Server {
  readonly addr: Deno.NetAddr;
  readonly finished: Promise<void>;
  readonly #o: Http1ServeOptions;
  readonly #limits: ConnectionLimits;
  readonly #settings: ConnectionSettings;
  readonly #listener: Deno.Listener;
  readonly #open = new Set<Http1Connection>();
  readonly #overflow = new Set<Http1Connection>();
  #closing = false;
  readonly #allClosed = Promise.withResolvers<void>();
  /** One timer for every connection's head and idle deadlines (none per request). */
  readonly #sweep: ReturnType<typeof setInterval>;
  /** A sweep is closing connections (the next waits for it). */
  #expiring = false;

  constructor(options: Http1ServeOptions) {
    this.#o = options;
    this.#limits = { ...DEFAULT_CONNECTION_LIMITS, ...options.limits };
    this.#settings = {
      handler: options.handler,
      onCut: options.onCut,
      tls: !!options.tls,
      limits: this.#limits,
      overflowPaths: options.overflowPaths ?? ["/health"],
    };
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
   * Closes the connections whose deadline passed (answering stalled heads 408), a batch at a time
   * with the event loop let go between batches: thousands timing out together must not hold
   * `/health` for the length of the burst.
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
          this.#o.onListener?.("exhausted", { error: errorMessage(error) });
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
        closeConnection(conn);
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
      this.#run(conn, this.#open, false);
    }
  }

  /** Serves `conn`, counted in `set` while it runs. */
  #run(conn: Deno.Conn, set: Set<Http1Connection>, overflow: boolean): void {
    const connection = new Http1Connection(conn, this.#settings, overflow);
    set.add(connection);
    connection.run().finally(() => {
      set.delete(connection);
      this.#settle();
    });
  }

  /** A connection beyond the bound: an overflow path answered once; anything else 503. */
  #serveOverflow(conn: Deno.Conn): void {
    if (this.#overflow.size >= _OVERFLOW_LIMIT) {
      this.#o.onCut?.("too_many_connections", { answered: false });
      closeConnection(conn);
      return;
    }
    this.#run(conn, this.#overflow, true);
  }
}

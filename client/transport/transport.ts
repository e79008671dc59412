/**
 * The interface between the `Client` and the wire: one request in, one complete
 * response out. Two implementations exist: `fetch` (the reference, for `https://` and proxied
 * servers) and the client's own HTTP/1.1 (faster for large bodies on plain `http://`).
 *
 * @module
 */

/**
 * Watches a Content-Length response body as it arrives: `pad` picks how many bytes to leave in
 * front of the body buffer (to align a payload inside it), `update` sees each new stretch.
 */
export interface BodyObserver {
  /** Bytes of padding before the body, given the first bytes of the body. */
  pad(prefix: Uint8Array): number;
  /** `body[0, received)` has arrived (reading goes on once a returned promise resolves). */
  update(body: Uint8Array, received: number): void | Promise<void>;
}

/** One request to a server or router. */
export interface TransportRequest {
  /** `GET` or `POST`. */
  method: string;
  /** The endpoint, e.g. `/execute`; the transport puts the base URL's path prefix before it. */
  path: string;
  /** Every header to send (the transport adds `host` and framing headers). */
  headers: Headers;
  /** The body's pieces, in order (written as they are, never modified). */
  body?: readonly Uint8Array[];
  /**
   * Called with the response headers before a Content-Length or chunked body is read; the
   * observer it returns sees the body arrive. Transports that cannot watch a body (`fetch`)
   * never call it.
   */
  observe?: (headers: Headers) => BodyObserver | undefined;
  /**
   * Called with the response headers before any body is read; the function it returns sees
   * every piece of the body as it arrives (every transport calls it; the whole body is still
   * the response's `body`). Live output reads its chunks this way.
   */
  watch?: (headers: Headers) => ((piece: Uint8Array) => void) | undefined;
  /** Aborting closes the connection; the request then rejects with the signal's reason. */
  signal?: AbortSignal;
  /**
   * Called as the request goes out with the bytes written so far and the request's total size
   * (head included). Transports that cannot watch their writes (`fetch`) never call it.
   */
  onSent?: (sent: number, total: number) => void;
}

/** A complete response. */
export interface TransportResponse {
  /** HTTP status code. */
  status: number;
  /** Response headers. */
  headers: Headers;
  /** The whole body. */
  body: Uint8Array;
}

/**
 * Sends requests and reads their whole responses. A request that gets no response rejects
 * with a `TransportError` (or, when aborted, the signal's reason); any response, whatever
 * its status, resolves.
 */
export interface Transport {
  /** Sends one request and reads its whole response. */
  request(request: TransportRequest): Promise<TransportResponse>;
  /** Releases pooled connections; requests in flight finish. */
  close(): void;
}

/**
 * The `fetch` transport: the reference one, used for `https://` servers, servers reached
 * through a proxy, and whenever `transport: "fetch"` is asked for.
 *
 * Connect timeout: Deno's fetch has no separate connect timeout, and a
 * timer covering the wait for response headers would also cover the whole
 * execution (the server answers only when the program is done). So before
 * each request the transport opens a TCP connection to the server's host and
 * port (or to the HTTP(S)_PROXY fetch will use) itself, bounded by the
 * connect timeout, closes it, and then sends the request with no
 * timeout at all. An unreachable or refusing server is a `TransportError`
 * within the limit; reading the response is never timed. The cost is one
 * extra TCP handshake per request.
 *
 * @module
 */

import { concatBytes } from "../../protocol/bytes.ts";
import { TransportError } from "../errors.ts";
import { ConnectError, connectTcp, type Endpoint } from "./connect.ts";
import type { Transport, TransportRequest, TransportResponse } from "./transport.ts";
import { describeTlsFailure } from "../../protocol/tls_failure.ts";

/** Bodies larger than this are streamed from their pieces instead of joined first. */
const _STREAM_BODY_BYTES = 8 * 1024 * 1024;

/** Options of {@linkcode FetchTransport}. */
export interface FetchTransportOptions {
  /** Origin and path prefix of the server: a request goes to `base + path`. */
  base: string;
  /** Where the connect probe connects: the server, or the proxy `fetch` will use. */
  probe: Endpoint;
  /** Limit of the connect probe; `null`: no probe. */
  connectTimeoutMs: number | null;
  /** Extra trusted certificate authorities (PEM), besides the system's. */
  caCerts?: readonly string[];
}

/** {@linkcode Transport} over `fetch`, with a connect probe before every request. */
export class FetchTransport implements Transport {
  readonly #base: string;
  readonly #probe: Endpoint;
  readonly #connectTimeoutMs: number | null;
  /** `fetch`'s client for GET: pooled connections. */
  readonly #http: Deno.HttpClient;
  /**
   * `fetch`'s client for POST: a new connection each time, because `fetch` sends a request
   * again when a reused connection ends without an answer, and a program that was all sent may
   * have run (it must fail with `TransportError`, never run twice).
   */
  readonly #httpOnce: Deno.HttpClient;

  /** A transport to `options.base`. */
  constructor(options: FetchTransportOptions) {
    this.#base = options.base;
    this.#probe = options.probe;
    this.#connectTimeoutMs = options.connectTimeoutMs;
    const caCerts = [...(options.caCerts ?? [])];
    this.#http = Deno.createHttpClient({ caCerts });
    this.#httpOnce = Deno.createHttpClient({ caCerts, poolMaxIdlePerHost: 0 });
  }

  /** Closes both `fetch` clients. */
  close(): void {
    this.#http.close();
    this.#httpOnce.close();
  }

  async #connectProbe(abort?: AbortSignal): Promise<void> {
    // The probe bounds the time to reach the server, before every request: `fetch` has no
    // connect timeout of its own, and a pooled connection may be gone by now (POSTs never use
    // one).
    if (this.#connectTimeoutMs === null) return;
    const target = { ...this.#probe, connectTimeoutMs: this.#connectTimeoutMs };
    try {
      (await connectTcp(target, abort, false)).close();
    } catch (error) {
      if (error instanceof ConnectError) {
        throw new TransportError(error.message, { cause: error.cause });
      }
      throw error; // the caller's abort reason
    }
  }

  /** Sends one request; failures are `TransportError`s (or the abort reason). */
  async request(request: TransportRequest): Promise<TransportResponse> {
    const { method, path, headers, body, signal } = request;
    await this.#connectProbe(signal);
    let requestBody: BodyInit | undefined;
    if (body) {
      let length = 0;
      for (const chunk of body) length += chunk.length;
      // Large bodies stream their pieces (the blobs are not copied into one buffer first).
      requestBody = length > _STREAM_BODY_BYTES ? ReadableStream.from(body) : concatBytes(body);
    }
    try {
      const response = await fetch(this.#base + path, {
        method,
        headers,
        body: requestBody,
        redirect: "manual", // like upstream (httpx): a redirect is a non-200 answer
        client: method === "GET" || method === "HEAD" ? this.#http : this.#httpOnce,
        signal,
      });
      const sink = request.watch?.(response.headers);
      const responseBody = sink && response.body
        ? await _watched(response.body, sink)
        : new Uint8Array(await response.arrayBuffer());
      return { status: response.status, headers: response.headers, body: responseBody };
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      const tls = describeTlsFailure(error);
      throw new TransportError(`${method} ${path} failed: ${tls ?? (error as Error).message}`, {
        cause: error,
      });
    }
  }
}

/** A body read piece by piece, each shown to `sink` as it arrives. */
async function _watched(
  body: ReadableStream<Uint8Array>,
  sink: (piece: Uint8Array) => void,
): Promise<Uint8Array> {
  const pieces: Uint8Array[] = [];
  for await (const piece of body) {
    pieces.push(piece);
    sink(piece);
  }
  return concatBytes(pieces);
}

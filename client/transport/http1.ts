/**
 * The HTTP/1.1 transport: requests through a pool of keep-alive connections
 * ({@linkcode Http1Agent}), for plain `http://` servers reached without a proxy.
 *
 * @module
 */

import { TransportError } from "../errors.ts";
import { ConnectError } from "./connect.ts";
import { Http1Agent, type Http1Target } from "./http1_agent.ts";
import type { Transport, TransportRequest, TransportResponse } from "./transport.ts";

/** {@linkcode Transport} over the client's own HTTP/1.1 (bodies written and read in place). */
export class Http1Transport implements Transport {
  readonly #agent: Http1Agent;
  readonly #pathPrefix: string;

  /** A transport to `target`; every request path is put after `pathPrefix`. */
  constructor(target: Http1Target, pathPrefix: string) {
    this.#agent = new Http1Agent(target);
    this.#pathPrefix = pathPrefix;
  }

  /** Closes idle connections. */
  close(): void {
    this.#agent.close();
  }

  /** Sends one request; failures are `TransportError`s (or the abort reason). */
  async request(request: TransportRequest): Promise<TransportResponse> {
    const { method, path, signal } = request;
    try {
      return await this.#agent.request(
        method,
        this.#pathPrefix + path,
        request.headers,
        request.body,
        request.observe,
        signal,
        request.onSent,
        request.watch,
      );
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      if (error instanceof ConnectError) {
        throw new TransportError(error.message, { cause: error.cause });
      }
      throw new TransportError(`${method} ${path} failed: ${(error as Error).message}`, {
        cause: error,
      });
    }
  }
}

/**
 * Choosing a {@linkcode Transport} for a base URL, in one place: plain `http://` servers
 * reached without a proxy use the client's own HTTP/1.1 (unless `fetch` is asked for);
 * `https://` and proxied servers use `fetch`.
 *
 * @module
 */

import { FetchTransport } from "./fetch.ts";
import { Http1Transport } from "./http1.ts";
import { endpointOf, proxyFor } from "./proxy.ts";
import type { Transport } from "./transport.ts";

/** Options of {@linkcode openTransport}. */
export interface OpenTransportOptions {
  /** `"auto"`: HTTP/1.1 where it can be used, else `fetch`; `"fetch"`: always `fetch`. */
  kind: "auto" | "fetch";
  /** Limit for opening a TCP connection, in milliseconds; `null`: none. */
  connectTimeoutMs: number | null;
  /** Extra trusted certificate authorities (PEM) for `https://` (default: the system's). */
  caCerts?: readonly string[];
}

/**
 * The transport for a server at `url` (`http:` or `https:`; a path prefix is kept, a query or
 * fragment is not part of the endpoints' paths). Creating it contacts nothing.
 *
 * @example
 * ```ts
 * import { openTransport } from "./open.ts";
 *
 * const transport = openTransport(new URL("http://127.0.0.1:8000/kcoral"), {
 *   kind: "fetch",
 *   connectTimeoutMs: 10_000,
 * });
 * transport.close();
 * ```
 */
export function openTransport(url: URL, options: OpenTransportOptions): Transport {
  const { connectTimeoutMs } = options;
  const proxy = proxyFor(url);
  const pathPrefix = url.pathname.replace(/\/+$/, "");
  if (url.protocol === "http:" && proxy === undefined && options.kind !== "fetch") {
    return new Http1Transport({ ...endpointOf(url), host: url.host, connectTimeoutMs }, pathPrefix);
  }
  return new FetchTransport({
    base: url.origin + pathPrefix,
    probe: proxy ?? endpointOf(url),
    connectTimeoutMs,
    caCerts: options.caCerts ?? [],
  });
}

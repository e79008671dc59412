/**
 * The TCP endpoint a base URL names, and the proxy `fetch` will connect to instead (from
 * `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY`, minus `NO_PROXY`), so the transport is chosen and
 * the connect probe aimed at the connection that is really used.
 *
 * @module
 */

import type { Endpoint } from "./connect.ts";

/**
 * The host and port of `url` (the scheme's default port when none is given).
 *
 * @example
 * ```ts
 * import { endpointOf } from "./proxy.ts";
 *
 * const { hostname, port } = endpointOf(new URL("http://[::1]/x"));
 * if (hostname !== "::1" || port !== 80) throw new Error();
 * ```
 */
export function endpointOf(url: URL): Endpoint {
  return {
    hostname: url.hostname.replace(/^\[(.*)\]$/, "$1"),
    port: url.port !== "" ? Number(url.port) : url.protocol === "https:" ? 443 : 80,
  };
}

function _env(name: string): string | undefined {
  return _read(name) || _read(name.toLowerCase()) || undefined;
}

// A variable only where the permission is granted already: asking would prompt on a terminal
// (a client run with --allow-net=HOST:PORT alone must not), and without it fetch cannot see a
// proxy either.
function _read(name: string): string | undefined {
  try {
    if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") {
      return undefined;
    }
    return Deno.env.get(name);
  } catch {
    return undefined;
  }
}

/**
 * The proxy fetch will connect to for `url` (HTTP_PROXY/HTTPS_PROXY/ALL_PROXY,
 * minus NO_PROXY), or `undefined` when it connects to the server itself.
 *
 * @example
 * ```ts
 * import { proxyFor } from "./proxy.ts";
 *
 * const proxy = proxyFor(new URL("http://127.0.0.1:8000"));
 * console.log(proxy ?? "direct");
 * ```
 */
export function proxyFor(url: URL): Endpoint | undefined {
  const proxy = url.protocol === "https:"
    ? _env("HTTPS_PROXY") ?? _env("ALL_PROXY")
    : _env("HTTP_PROXY") ?? _env("ALL_PROXY");
  if (proxy === undefined) return undefined;
  const host = url.hostname.replace(/^\[(.*)\]$/, "$1").toLowerCase();
  for (const entry of (_env("NO_PROXY") ?? "").split(",")) {
    const pattern = entry.trim().toLowerCase().replace(/:\d+$/, "").replace(/^\*?\./, "");
    if (pattern === "*" || (pattern !== "" && (host === pattern || host.endsWith("." + pattern)))) {
      return undefined;
    }
  }
  try {
    const proxyUrl = new URL(proxy.includes("://") ? proxy : `http://${proxy}`);
    const endpoint = endpointOf(proxyUrl);
    if (proxyUrl.port === "" && proxyUrl.protocol.startsWith("socks")) endpoint.port = 1080;
    return endpoint;
  } catch {
    return undefined;
  }
}

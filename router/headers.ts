/**
 * Which headers cross the Router (spec router §2.2 items 5 and 8): hop-by-hop headers never do
 * (`connection`, `keep-alive`, `proxy-*`, `te`, `trailer`, `transfer-encoding`, `upgrade`, and
 * any header `Connection` names), nor the ones the Router sets itself. Nor does a client's
 * `Authorization`: a client token is the Router's to check, never a node's to see (the node
 * link has its own token). Repeated `set-cookie` headers stay separate entries.
 *
 * @module
 */
import type { HeaderEntry } from "../protocol/node_link.ts";

const _HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-authenticate",
  "proxy-authorization",
  "proxy-connection",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

/** Request headers the Router drops besides the hop-by-hop ones. */
export const DROPPED_REQUEST_HEADERS: readonly string[] = [
  "host",
  "expect",
  "content-length",
  "x-kcoral-node",
  "x-request-id",
  "authorization",
];

/** Response headers the Router drops besides the hop-by-hop ones. */
export const DROPPED_RESPONSE_HEADERS: readonly string[] = [
  "x-kcoral-node",
  "x-request-id",
  "content-length",
];

/**
 * `headers` as entries, less hop-by-hop headers, those `Connection` names and `drop`.
 *
 * @example
 * ```ts
 * import { forwardedHeaders } from "./headers.ts";
 *
 * const headers = new Headers({ connection: "x-private", "x-private": "1", "x-keep": "2" });
 * headers.append("set-cookie", "a=1");
 * headers.append("set-cookie", "b=2");
 * const out = forwardedHeaders(headers, ["host"]);
 * if (JSON.stringify(out) !== '[["set-cookie","a=1"],["set-cookie","b=2"],["x-keep","2"]]') {
 *   throw new Error(JSON.stringify(out));
 * }
 * ```
 */
export function forwardedHeaders(headers: Headers, drop: readonly string[]): HeaderEntry[] {
  const named = new Set(drop);
  for (const token of (headers.get("connection") ?? "").split(",")) {
    const name = token.trim().toLowerCase();
    if (name) named.add(name);
  }
  const out: HeaderEntry[] = [];
  for (const [name, value] of headers) {
    if (_HOP_BY_HOP.has(name) || named.has(name)) continue;
    if (name === "set-cookie") continue; // below, one entry each
    out.push([name, value]);
  }
  if (!named.has("set-cookie")) {
    for (const cookie of headers.getSetCookie()) out.push(["set-cookie", cookie]);
  }
  out.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  return out;
}

/**
 * A node's response header entries as the `Headers` the client gets: less hop-by-hop headers,
 * those its `Connection` entries name and `drop`, with names compared case-insensitively and
 * repeated names appended (each `set-cookie` stays its own). The same headers as
 * {@linkcode forwardedHeaders} of the entries' `Headers`, built once instead of three times (a
 * trivial routed request's answer is mostly headers). An entry `Headers` refuses is a
 * `TypeError`.
 *
 * @example
 * ```ts
 * import { forwardedResponseHeaders } from "./headers.ts";
 *
 * const h = forwardedResponseHeaders([
 *   ["Connection", "x-private"], ["x-private", "1"], ["set-cookie", "a=1"],
 *   ["set-cookie", "b=2"], ["Content-Length", "5"], ["x-a", "1"],
 * ], ["content-length"]);
 * if (h.getSetCookie().length !== 2 || h.get("x-a") !== "1") throw new Error();
 * if (h.has("x-private") || h.has("connection") || h.has("content-length")) throw new Error();
 * ```
 */
export function forwardedResponseHeaders(
  entries: readonly HeaderEntry[],
  drop: readonly string[],
): Headers {
  let named: Set<string> | null = null;
  for (const [name, value] of entries) {
    if (name.toLowerCase() !== "connection") continue;
    named ??= new Set();
    for (const token of value.split(",")) {
      const listed = token.trim().toLowerCase();
      if (listed) named.add(listed);
    }
  }
  const headers = new Headers();
  for (const [name, value] of entries) {
    const lower = name.toLowerCase();
    if (_HOP_BY_HOP.has(lower) || drop.includes(lower) || named?.has(lower)) continue;
    headers.append(name, value);
  }
  return headers;
}

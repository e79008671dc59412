/**
 * Which headers cross the Router (spec router §2.2 items 5 and 8): hop-by-hop headers never do
 * (`connection`, `keep-alive`, `proxy-*`, `te`, `trailer`, `transfer-encoding`, `upgrade`, and
 * any header `Connection` names), nor the ones the Router sets itself. Nor does a client's
 * `Authorization`: a client token is the Router's to check, never a node's to see (the node
 * link has its own token). A node's repeated response headers stay separate entries and
 * separate lines to the client. A client's repeated request headers reach the node as one entry
 * joined with ", " (a request's `Headers` give them only that way), except `set-cookie`.
 *
 * @module
 */
import type { HeaderEntry } from "../link/messages.ts";

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

/** `headers` as entries, less hop-by-hop headers, those `Connection` names and `drop`. */
export function forwardedHeaders(headers: Headers, drop: readonly string[]): HeaderEntry[] {
  const connection = headers.get("connection");
  const named = connection === null ? _dropped(drop) : _withConnectionNames(drop, [connection]);
  // `forEach` visits what iterating visits, several times faster than Deno's `Headers` iterator.
  const out: HeaderEntry[] = [];
  headers.forEach((value, name) => {
    if (!named.has(name)) out.push([name, value]);
  });
  return out;
}

/**
 * A node's response header entries as the client gets them, as {@linkcode forwardedHeaders}
 * filters them but without building a `Headers`; repeated names stay separate entries.
 */
export function forwardedResponseEntries(
  entries: readonly HeaderEntry[],
  drop: readonly string[],
): HeaderEntry[] {
  const connection: string[] = [];
  for (const [name, value] of entries) {
    if (name.toLowerCase() === "connection") connection.push(value);
  }
  const named = connection.length === 0 ? _dropped(drop) : _withConnectionNames(drop, connection);
  return entries.filter(([name]) => !named.has(name.toLowerCase()));
}

/** The hop-by-hop names and `drop`, one set per `drop` list (these are the module's constants). */
const _droppedSets = new Map<readonly string[], ReadonlySet<string>>();

function _dropped(drop: readonly string[]): ReadonlySet<string> {
  let named = _droppedSets.get(drop);
  if (named === undefined) {
    named = new Set([..._HOP_BY_HOP, ...drop]);
    // Bounded: a caller passing a new array each time gets a set each time, not a growing map.
    if (_droppedSets.size < 8) _droppedSets.set(drop, named);
  }
  return named;
}

/** The hop-by-hop names, `drop` and the header names the `Connection` values list (lower case). */
function _withConnectionNames(drop: readonly string[], values: readonly string[]): Set<string> {
  const named = new Set([..._HOP_BY_HOP, ...drop]);
  for (const value of values) {
    for (const token of value.split(",")) {
      const name = token.trim().toLowerCase();
      if (name) named.add(name);
    }
  }
  return named;
}

/** A header name `Headers` takes: an HTTP token. */
const _TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** What a value `Headers` takes cannot hold as it is (a value with it is checked by `Headers`). */
// deno-lint-ignore no-control-regex -- NUL is one of the characters looked for
const _SUSPECT_VALUE = /[\0\r\n]|[^\x00-\xff]/;

/**
 * Whether an HTTP answer can carry every entry, as `Headers` decides; only a value with NUL, CR
 * or LF is given to a `Headers` to check.
 */
export function validHeaderEntries(entries: readonly HeaderEntry[]): boolean {
  for (const [name, value] of entries) {
    if (!_TOKEN.test(name)) return false;
    if (_SUSPECT_VALUE.test(value)) {
      try {
        new Headers([[name, value]]);
      } catch {
        return false;
      }
    }
  }
  return true;
}

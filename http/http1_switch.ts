/**
 * A protocol switch on a connection of http/http1_server.ts: {@linkcode switchProtocols} makes the
 * answer a handler returns to an upgrade request; the connection (http1_connection.ts) finds it
 * with {@linkcode protocolSwitchOf}, writes {@linkcode switchingHead} (`101 Switching Protocols`)
 * and hands itself over (the Router's node links, link/websocket_server.ts).
 *
 * @module
 */
import { httpDate } from "./http1_response.ts";

/** A connection handed over after its `101 Switching Protocols` (see {@linkcode switchProtocols}). */
export interface SwitchedConnection {
  /** The connection, now the new protocol's: nothing of this server reads, writes or closes it. */
  conn: Deno.Conn;
  /** What the client sent after its request head (the new protocol's first bytes), if anything. */
  buffered: Uint8Array;
}

/** The `101`'s header fields and who takes the connection, of one switchProtocols answer. */
export interface ProtocolSwitch {
  /** The `101`'s header fields. */
  fields: readonly [string, string][];
  /** Takes the connection once the `101` is written. */
  take: (switched: SwitchedConnection) => void;
}

const _switches = new WeakMap<Response, ProtocolSwitch>();
const _encoder = new TextEncoder();

/**
 * An answer to an upgrade request (`Connection: upgrade`, no body) that switches protocols:
 * `serveHttp1` (http1_server.ts) writes `101 Switching Protocols` with `fields`, then hands the
 * connection to `take`. The connection leaves the server then: no timeout, no place in
 * `maxConnections`, no close at a stop. Served by anything else, or for a request that is no
 * upgrade, the answer is a 500 (`Response` cannot carry a 101 itself).
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
 * The switch `response` asks for, if {@linkcode switchProtocols} made it.
 */
export function protocolSwitchOf(response: Response): ProtocolSwitch | undefined {
  return _switches.get(response);
}

/** The head of a `101 Switching Protocols` with `fields` and a `Date`. */
export function switchingHead(fields: readonly [string, string][]): Uint8Array {
  let lines = "HTTP/1.1 101 Switching Protocols\r\n";
  for (const [name, value] of fields) lines += `${name}: ${value}\r\n`;
  return _encoder.encode(lines + `date: ${httpDate()}\r\n\r\n`);
}

/**
 * An outbound WebSocket (RFC 6455) over a TCP connection with `TCP_NODELAY` set, for the node's
 * slot links: Deno's `WebSocket` turns Nagle's algorithm on, which delays a tunnelled answer's
 * second message by up to 40 ms (docs/decisions/node-link-websocket-client.md). What both ends
 * do alike is websocket_connection.ts's.
 *
 * ```
 *  connect ─▶ GET + Upgrade (request headers, Sec-WebSocket-Key) ─▶ 101 + Sec-WebSocket-Accept
 *  send(data)  ─▶ one masked frame, written in order, one write each
 *  sendParts(parts) ─▶ the same for one binary message given in pieces (masked piece by piece)
 *  a masked frame from the server: 1002 · a message over maxMessageBytes: 1009 · a failure:
 *    onerror, then onclose with 1006
 * ```
 *
 * @module
 */
import { describeTlsFailure } from "../protocol/tls_failure.ts";
import { concatBytes } from "../protocol/bytes.ts";
import { errorMessage } from "../protocol/errors.ts";
import { writeAll } from "../http/http1_response.ts";
import { FrameReader } from "./websocket_frames.ts";
import { WebSocketConnection } from "./websocket_connection.ts";
import { acceptKey } from "./websocket_handshake.ts";

export type { WebSocketCloseInfo } from "./websocket_frames.ts";

/** What {@linkcode WebSocketClient} accepts besides the URL. */
export interface WebSocketClientOptions {
  /** Request headers of the opening handshake (e.g. `authorization`). */
  headers?: Record<string, string>;
  /** The largest message accepted, in bytes (larger: closed with 1009). Default 16 MiB. */
  maxMessageBytes?: number;
  /** Extra trusted certificate authorities (PEM) for `wss:` (default: the system's only). */
  caCerts?: readonly string[];
}

const _HEAD_LIMIT = 16 * 1024;
const _encoder = new TextEncoder();

/** A client WebSocket with `TCP_NODELAY` on; the subset of the `WebSocket` interface above. */
export class WebSocketClient extends WebSocketConnection {
  /** Called when the connection fails (before `onclose`). */
  onerror: ((event: { message: string }) => void) | null = null;

  readonly #maxMessage: number;
  readonly #caCerts: string[];

  /** Opens a connection to `url` (`ws:` or `wss:`). */
  constructor(url: string | URL, options: WebSocketClientOptions = {}) {
    super(true, "invalid UTF-8");
    this.#maxMessage = options.maxMessageBytes ?? 16 * 1024 * 1024;
    this.#caCerts = [...(options.caCerts ?? [])];
    this.#run(new URL(url), options.headers ?? {});
  }

  /**
   * Sends one binary message made of `parts` in order, masked from each part into the frame:
   * a data frame's header and a slice of a larger body go out without being joined first.
   * Ignored unless open. The parts are copied before this returns.
   */
  sendParts(parts: readonly Uint8Array[]): void {
    if (this.readyState === WebSocketClient.OPEN) this.write(2, parts);
  }

  /** The connection is dialed, handshaken, then read until it ends; any failure is reported. */
  async #run(url: URL, headers: Record<string, string>): Promise<void> {
    try {
      const conn = await this.#open(url);
      if (this.readyState !== WebSocketClient.CONNECTING) return conn.close();
      this.attach(conn);
      const rest = await this.#handshake(conn, url, headers);
      if (this.readyState !== WebSocketClient.CONNECTING) return;
      this.opened();
      await this.readFrames(new FrameReader(conn, rest));
    } catch (error) {
      this.#failedConnection(error);
    }
  }

  /** The connection failed (`onerror`), unless it ended already or after its closing handshake. */
  #failedConnection(error: unknown): void {
    if (this.readyState === WebSocketClient.CLOSED) return;
    // Our own close of the connection (after the closing handshake) ends the read too.
    if (!this.closeInfo) {
      this.onerror?.({ message: describeTlsFailure(error) ?? errorMessage(error) });
    }
    this.end();
  }

  protected override ended(readError: unknown): void {
    if (readError === null) this.end();
    else this.#failedConnection(readError);
  }

  protected oversize(_kind: number, bytes: number): string | null {
    return bytes > this.#maxMessage ? "message too big" : null;
  }

  protected failed(_code: number, reason: string): void {
    this.onerror?.({ message: reason });
    this.closeInfo = { code: 1006, reason, wasClean: false };
  }

  async #open(url: URL): Promise<Deno.Conn> {
    const secure = url.protocol === "wss:" || url.protocol === "https:";
    const hostname = url.hostname.replace(/^\[|\]$/g, "");
    const port = Number(url.port) || (secure ? 443 : 80);
    const tcp = await Deno.connect({ hostname, port });
    tcp.setNoDelay(true);
    if (!secure) return tcp;
    const tls = await Deno.startTls(tcp, { hostname, caCerts: this.#caCerts });
    try {
      await tls.handshake(); // certificate problems surface here, not at the first read
    } catch (error) {
      tls.close();
      throw error;
    }
    return tls;
  }

  /** Sends the upgrade request and checks the answer; returns bytes read past the head. */
  async #handshake(
    conn: Deno.Conn,
    url: URL,
    headers: Record<string, string>,
  ): Promise<Uint8Array> {
    const key = btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(16))));
    const lines = [
      `GET ${url.pathname}${url.search} HTTP/1.1`,
      `Host: ${url.host}`,
      "Upgrade: websocket",
      "Connection: Upgrade",
      `Sec-WebSocket-Key: ${key}`,
      "Sec-WebSocket-Version: 13",
    ];
    for (const [name, value] of Object.entries(headers)) {
      if (/[\r\n]/.test(name + value)) throw new Error(`invalid header ${name}`);
      lines.push(`${name}: ${value}`);
    }
    await writeAll(conn, _encoder.encode(lines.join("\r\n") + "\r\n\r\n"));
    let buffer: Uint8Array = new Uint8Array(0);
    let end = -1;
    while (end < 0) {
      const chunk = new Uint8Array(4096);
      const n = await conn.read(chunk);
      if (n === null) throw new Error("the connection closed during the handshake");
      buffer = concatBytes([buffer, chunk.subarray(0, n)]);
      end = _indexOfHeadEnd(buffer);
      if (end < 0 && buffer.length > _HEAD_LIMIT) throw new Error("handshake answer too long");
    }
    const head = new TextDecoder().decode(buffer.subarray(0, end)).split("\r\n");
    const status = /^HTTP\/1\.1 (\d{3})/.exec(head[0])?.[1];
    if (status !== "101") throw new Error(`unexpected server response: ${status ?? head[0]}`);
    const fields = new Map<string, string>();
    for (const line of head.slice(1)) {
      const colon = line.indexOf(":");
      if (colon > 0) {
        fields.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
      }
    }
    const accept = acceptKey(key);
    if (
      fields.get("upgrade")?.toLowerCase() !== "websocket" ||
      !/\bupgrade\b/i.test(fields.get("connection") ?? "") ||
      fields.get("sec-websocket-accept") !== accept
    ) {
      throw new Error("invalid WebSocket handshake answer");
    }
    return buffer.subarray(end + 4);
  }
}

function _indexOfHeadEnd(bytes: Uint8Array): number {
  for (let i = 3; i < bytes.length; i++) {
    if (bytes[i] === 10 && bytes[i - 1] === 13 && bytes[i - 2] === 10 && bytes[i - 3] === 13) {
      return i - 3;
    }
  }
  return -1;
}

/**
 * An outbound WebSocket (RFC 6455) over a TCP connection with Nagle's algorithm off, for the
 * node's data links to the Router.
 *
 * Why not the platform's `WebSocket`: Deno's client turns `TCP_NODELAY` off on the socket it
 * opens (seen with `strace`: `setsockopt(fd, SOL_TCP, TCP_NODELAY, [0])`) and offers no way to
 * turn it back on. A tunnelled answer is several small messages in a row (response head, data,
 * end); with Nagle on, the second waits for the Router's delayed ACK, up to 40 ms, whenever the
 * first is still unacknowledged — measured as p75 54 ms instead of 10 ms for a trivial request
 * with 4 clients through a Router (docs/decisions/node-link-websocket-client.md). This client sets `TCP_NODELAY` and keeps
 * the subset of the `WebSocket` interface the node link uses: `onopen`, `onmessage` (text as
 * `string`, binary as `ArrayBuffer`), `onerror`, `onclose`, `send`, `close`, `readyState`.
 *
 * ```
 *  connect ─▶ GET + Upgrade (request headers, Sec-WebSocket-Key) ─▶ 101 + Sec-WebSocket-Accept
 *  send(data)  ─▶ one masked frame, written in order, one write each
 *  sendParts(parts) ─▶ the same for one binary message given in pieces (masked piece by piece)
 *  frames in   ─▶ text/binary messages (fragments joined) · ping ─▶ pong · close ─▶ close back
 * ```
 *
 * Frames are read and written by websocket_frames.ts, as the Router's end (websocket_server.ts)
 * does.
 *
 * @module
 */
import { describeTlsFailure } from "../protocol/tls_failure.ts";
import { concatBytes } from "../protocol/bytes.ts";
import { errorMessage } from "../protocol/errors.ts";
import { decodeUtf8 } from "../protocol/utf8.ts";
import {
  closePayload,
  closeQuietly,
  frameProblem,
  FrameReader,
  FrameWriter,
  messageData,
  type WebSocketCloseInfo,
} from "./websocket_frames.ts";
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

const _CLOSE_WAIT_MS = 2000;
const _HEAD_LIMIT = 16 * 1024;
const _encoder = new TextEncoder();

/**
 * A client WebSocket with `TCP_NODELAY` on; the subset of the `WebSocket` interface above.
 *
 * @example
 * ```ts
 * import { WebSocketClient } from "./websocket_client.ts";
 *
 * const server = Deno.serve({ port: 0, onListen() {} }, (request) => {
 *   const { socket, response } = Deno.upgradeWebSocket(request);
 *   socket.onmessage = (event) => socket.send(`echo ${event.data}`);
 *   return response;
 * });
 * const socket = new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/`);
 * const answer = await new Promise<string>((resolve) => {
 *   socket.onopen = () => socket.send("hello");
 *   socket.onmessage = (event) => resolve(event.data as string);
 * });
 * if (answer !== "echo hello") throw new Error(answer);
 * socket.close(1000, "done");
 * await new Promise((resolve) => (socket.onclose = resolve));
 * await server.shutdown();
 * ```
 */
export class WebSocketClient {
  /** `readyState` while connecting. */
  static readonly CONNECTING = 0;
  /** `readyState` while open. */
  static readonly OPEN = 1;
  /** `readyState` after a close frame went out, before the connection ended. */
  static readonly CLOSING = 2;
  /** `readyState` once the connection ended. */
  static readonly CLOSED = 3;

  /** Called once the handshake completed. */
  onopen: (() => void) | null = null;
  /** Called for each message: text as `string`, binary as `ArrayBuffer`. */
  onmessage: ((event: { data: string | ArrayBuffer }) => void) | null = null;
  /** Called when the connection fails (before `onclose`). */
  onerror: ((event: { message: string }) => void) | null = null;
  /** Called once when the connection has ended. */
  onclose: ((event: WebSocketCloseInfo) => void) | null = null;

  #state = WebSocketClient.CONNECTING;
  #conn: Deno.Conn | null = null;
  /** The connection's frames out, once it is connected. */
  #writer: FrameWriter | null = null;
  #closeSent = false;
  #closeTimer: ReturnType<typeof setTimeout> | undefined;
  #closeInfo: WebSocketCloseInfo | null = null;
  readonly #maxMessage: number;
  readonly #caCerts: string[];

  /** Opens a connection to `url` (`ws:` or `wss:`). */
  constructor(url: string | URL, options: WebSocketClientOptions = {}) {
    this.#maxMessage = options.maxMessageBytes ?? 16 * 1024 * 1024;
    this.#caCerts = [...(options.caCerts ?? [])];
    this.#run(new URL(url), options.headers ?? {});
  }

  /** The connection's state (`CONNECTING`, `OPEN`, `CLOSING`, `CLOSED`). */
  get readyState(): number {
    return this.#state;
  }

  /** Bytes handed to `send` and not yet written to the connection. */
  get bufferedAmount(): number {
    return this.#writer?.buffered ?? 0;
  }

  /** Sends one message: a `string` as text, bytes as binary. Ignored unless open. */
  send(data: string | Uint8Array | ArrayBuffer): void {
    if (this.#state !== WebSocketClient.OPEN) return;
    if (typeof data === "string") this.#write(1, _encoder.encode(data));
    else this.#write(2, data instanceof Uint8Array ? data : new Uint8Array(data));
  }

  /**
   * Sends one binary message made of `parts` in order, masked from each part into the frame:
   * a data frame's header and a slice of a larger body go out without being joined first.
   * Ignored unless open. The parts are copied before this returns.
   */
  sendParts(parts: readonly Uint8Array[]): void {
    if (this.#state !== WebSocketClient.OPEN) return;
    this.#write(2, parts);
  }

  /** Starts the closing handshake (or gives up connecting). */
  close(code = 1000, reason = ""): void {
    if (this.#state === WebSocketClient.CONNECTING) {
      this.#finish({ code: 1006, reason: "closed before the connection opened", wasClean: false });
      return;
    }
    if (this.#state !== WebSocketClient.OPEN) return;
    this.#sendClose(code, reason);
  }

  async #run(url: URL, headers: Record<string, string>): Promise<void> {
    try {
      const conn = await this.#open(url);
      if (this.#state !== WebSocketClient.CONNECTING) {
        conn.close();
        return;
      }
      this.#conn = conn;
      this.#writer = new FrameWriter(conn, true);
      const rest = await this.#handshake(conn, url, headers);
      if (this.#state !== WebSocketClient.CONNECTING) return;
      this.#state = WebSocketClient.OPEN;
      this.onopen?.();
      await this.#readFrames(conn, rest);
    } catch (error) {
      if (this.#state === WebSocketClient.CLOSED) return;
      // Our own close of the connection (after the closing handshake) ends the read too.
      if (this.#closeInfo) return this.#finish(this.#closeInfo);
      this.onerror?.({ message: describeTlsFailure(error) ?? errorMessage(error) });
      this.#finish({ code: 1006, reason: "", wasClean: false });
    }
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
    await _writeAll(conn, _encoder.encode(lines.join("\r\n") + "\r\n\r\n"));
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

  async #readFrames(conn: Deno.Conn, initial: Uint8Array): Promise<void> {
    const reader = new FrameReader(conn, initial);
    let parts: Uint8Array[] = [];
    let partsBytes = 0;
    let partsOpcode = 0;
    for (;;) {
      const header = await reader.header();
      const problem = header && frameProblem(header, partsOpcode, false);
      if (problem) return this.#protocolError(1002, problem);
      if (header && header.opcode < 8 && partsBytes + header.length > this.#maxMessage) {
        return this.#protocolError(1009, "message too big");
      }
      const payload = header && await reader.payload(header.length, header.key);
      if (!header || !payload) {
        // A failed read goes to #run's catch, as the connection's failure.
        if (reader.readError !== null) throw reader.readError;
        return this.#finish(this.#closeInfo ?? { code: 1006, reason: "", wasClean: false });
      }
      const { fin, opcode } = header;
      if (opcode >= 8) {
        if (opcode === 8) this.#onCloseFrame(payload);
        else if (opcode === 9 && this.#state === WebSocketClient.OPEN) this.#write(10, payload);
        continue;
      }
      if (opcode !== 0) partsOpcode = opcode;
      parts.push(payload);
      partsBytes += payload.length;
      if (!fin) continue;
      const whole = parts.length === 1 ? parts[0] : concatBytes(parts);
      const type = partsOpcode;
      parts = [];
      partsBytes = 0;
      partsOpcode = 0;
      if (this.#state !== WebSocketClient.OPEN) continue;
      let data: string | ArrayBuffer;
      try {
        data = messageData(whole, type);
      } catch {
        return this.#protocolError(1007, "invalid UTF-8");
      }
      this.onmessage?.({ data });
    }
  }

  #onCloseFrame(payload: Uint8Array): void {
    const code = payload.length >= 2 ? (payload[0] << 8) | payload[1] : 1005;
    let reason = "";
    try {
      reason = decodeUtf8(payload.subarray(2));
    } catch {
      // an invalid reason is dropped
    }
    this.#closeInfo = { code, reason, wasClean: true };
    if (!this.#closeSent) this.#sendClose(code === 1005 ? 1000 : code, "");
    // The server closes the TCP connection after its close frame; ours follows the write.
    this.#afterWrites(() => this.#conn?.close());
  }

  #protocolError(code: number, reason: string): void {
    this.onerror?.({ message: reason });
    if (!this.#closeSent && this.#state === WebSocketClient.OPEN) this.#sendClose(code, reason);
    const info = { code: 1006, reason, wasClean: false };
    this.#closeInfo = info;
    this.#afterWrites(() => this.#finish(info));
  }

  #sendClose(code: number, reason: string): void {
    this.#write(8, closePayload(code, reason));
    this.#closeSent = true;
    this.#state = WebSocketClient.CLOSING;
    // A server that never answers the close is not waited for.
    this.#closeTimer = setTimeout(() => closeQuietly(this.#conn), _CLOSE_WAIT_MS);
  }

  /** Queues one frame (masked, as RFC 6455 requires of clients); frames go out in order. */
  #write(opcode: number, payload: Uint8Array | readonly Uint8Array[]): void {
    this.#writer?.write(opcode, payload);
  }

  /** Runs `then` once the frames queued so far are written. */
  #afterWrites(then: () => void): void {
    (this.#writer?.written ?? Promise.resolve()).finally(then).catch(() => {});
  }

  #finish(info: WebSocketCloseInfo): void {
    if (this.#state === WebSocketClient.CLOSED) return;
    this.#state = WebSocketClient.CLOSED;
    clearTimeout(this.#closeTimer);
    this.#writer?.close();
    closeQuietly(this.#conn);
    this.onclose?.(info);
  }
}

async function _writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let at = 0; at < bytes.length;) at += await conn.write(bytes.subarray(at));
}

function _indexOfHeadEnd(bytes: Uint8Array): number {
  for (let i = 3; i < bytes.length; i++) {
    if (bytes[i] === 10 && bytes[i - 1] === 13 && bytes[i - 2] === 10 && bytes[i - 3] === 13) {
      return i - 3;
    }
  }
  return -1;
}

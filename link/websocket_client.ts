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
 * @module
 */
import { describeTlsFailure } from "../protocol/tls_failure.ts";
import { releaseBuffer } from "../protocol/bytes.ts";
import { maskInto } from "./websocket_mask.ts";
import { decodeUtf8 } from "../protocol/utf8.ts";

/** What {@linkcode WebSocketClient} accepts besides the URL. */
export interface WebSocketClientOptions {
  /** Request headers of the opening handshake (e.g. `authorization`). */
  headers?: Record<string, string>;
  /** The largest message accepted, in bytes (larger: closed with 1009). Default 16 MiB. */
  maxMessageBytes?: number;
  /** Extra trusted certificate authorities (PEM) for `wss:` (default: the system's only). */
  caCerts?: readonly string[];
}

/** The close event's fields, as the platform's `CloseEvent` has them. */
export interface WebSocketCloseInfo {
  /** The close code (1006 when the connection ended without a closing handshake). */
  code: number;
  /** The close reason. */
  reason: string;
  /** Whether the closing handshake completed. */
  wasClean: boolean;
}

const _GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const _CLOSE_WAIT_MS = 2000;
const _HEAD_LIMIT = 16 * 1024;
/** Frames of at least this many bytes reuse the buffers of written ones. */
const _REUSE_BYTES = 64 * 1024;
/** Written frames' buffers kept per connection for reuse (4 × 256 KiB data frames). */
const _SPARES = 4;
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
  #writing: Promise<void> = Promise.resolve();
  #buffered = 0;
  readonly #spares: ArrayBuffer[] = [];
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
    return this.#buffered;
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
      const rest = await this.#handshake(conn, url, headers);
      if (this.#state !== WebSocketClient.CONNECTING) return;
      this.#state = WebSocketClient.OPEN;
      this.onopen?.();
      await this.#readFrames(conn, rest);
    } catch (error) {
      if (this.#state === WebSocketClient.CLOSED) return;
      // Our own close of the connection (after the closing handshake) ends the read too.
      if (this.#closeInfo) return this.#finish(this.#closeInfo);
      const message = describeTlsFailure(error) ??
        (error instanceof Error ? error.message : String(error));
      this.onerror?.({ message });
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
      buffer = _concat(buffer, chunk.subarray(0, n));
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
    const digest = await crypto.subtle.digest("SHA-1", _encoder.encode(key + _GUID));
    const accept = btoa(String.fromCharCode(...new Uint8Array(digest)));
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
    const reader = new _FrameReader(conn, initial);
    let parts: Uint8Array[] = [];
    let partsBytes = 0;
    let partsOpcode = 0;
    for (;;) {
      const frame = await reader.next(this.#maxMessage);
      if (frame === null) {
        this.#finish(this.#closeInfo ?? { code: 1006, reason: "", wasClean: false });
        return;
      }
      if (typeof frame === "number") {
        this.#protocolError(frame, frame === 1009 ? "message too big" : "invalid frame");
        return;
      }
      const { fin, opcode, payload } = frame;
      if (opcode >= 8) {
        if (opcode === 8) {
          this.#onCloseFrame(payload);
          continue;
        }
        if (opcode === 9 && this.#state === WebSocketClient.OPEN) this.#write(10, payload);
        continue;
      }
      if (opcode === 0 ? partsOpcode === 0 : partsOpcode !== 0) {
        this.#protocolError(1002, "unexpected continuation");
        return;
      }
      if (opcode !== 0) partsOpcode = opcode;
      parts.push(payload);
      partsBytes += payload.length;
      if (partsBytes > this.#maxMessage) {
        this.#protocolError(1009, "message too big");
        return;
      }
      if (!fin) continue;
      const whole = parts.length === 1 ? parts[0] : _concat(...parts);
      const type = partsOpcode;
      parts = [];
      partsBytes = 0;
      partsOpcode = 0;
      if (this.#state !== WebSocketClient.OPEN) continue;
      let data: string | ArrayBuffer;
      if (type === 1) {
        try {
          data = decodeUtf8(whole);
        } catch {
          this.#protocolError(1007, "invalid UTF-8");
          return;
        }
      } else {
        data = whole.byteOffset === 0 && whole.byteLength === whole.buffer.byteLength
          ? whole.buffer as ArrayBuffer
          : whole.slice().buffer;
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
    this.#writing.finally(() => this.#conn?.close()).catch(() => {});
  }

  #protocolError(code: number, reason: string): void {
    this.onerror?.({ message: reason });
    if (!this.#closeSent && this.#state === WebSocketClient.OPEN) this.#sendClose(code, reason);
    const info = { code: 1006, reason, wasClean: false };
    this.#closeInfo = info;
    this.#writing.finally(() => this.#finish(info)).catch(() => {});
  }

  #sendClose(code: number, reason: string): void {
    const reasonBytes = _encoder.encode(reason).subarray(0, 123);
    const payload = new Uint8Array(2 + reasonBytes.length);
    payload[0] = code >> 8;
    payload[1] = code & 0xff;
    payload.set(reasonBytes, 2);
    this.#write(8, payload);
    this.#closeSent = true;
    this.#state = WebSocketClient.CLOSING;
    // A server that never answers the close is not waited for.
    this.#closeTimer = setTimeout(() => {
      try {
        this.#conn?.close();
      } catch {
        // already closed
      }
    }, _CLOSE_WAIT_MS);
  }

  /** Queues one frame (masked, as RFC 6455 requires of clients); frames go out in order. */
  #write(opcode: number, payload: Uint8Array | readonly Uint8Array[]): void {
    const conn = this.#conn;
    if (!conn) return;
    const frame = _maskedFrame(opcode, payload, this.#spares);
    this.#buffered += frame.length;
    this.#writing = this.#writing.then(async () => {
      try {
        await _writeAll(conn, frame);
      } catch {
        // The connection failed: the read loop sees it end.
      } finally {
        this.#buffered -= frame.length;
        this.#recycle(frame);
      }
    });
  }

  /**
   * A written frame's buffer: a large one is kept for the next frames of its size (a body goes
   * out as many frames of one size); beyond {@linkcode _SPARES} of them, the oldest is given back
   * at once (protocol/bytes.ts).
   * Left to the collector, each new 256 KiB frame lands on freshly mapped pages: page faults on
   * every byte the mask writes (docs/decisions/router-large-bodies.md).
   */
  #recycle(frame: Uint8Array): void {
    if (frame.buffer.byteLength < _REUSE_BYTES) return;
    if (this.#state === WebSocketClient.CLOSED) return releaseBuffer(frame);
    this.#spares.push(frame.buffer as ArrayBuffer);
    // The oldest goes first: the spares follow the size of the frames sent lately.
    if (this.#spares.length > _SPARES) releaseBuffer(new Uint8Array(this.#spares.shift()!));
  }

  #finish(info: WebSocketCloseInfo): void {
    if (this.#state === WebSocketClient.CLOSED) return;
    this.#state = WebSocketClient.CLOSED;
    clearTimeout(this.#closeTimer);
    for (const spare of this.#spares.splice(0)) releaseBuffer(new Uint8Array(spare));
    try {
      this.#conn?.close();
    } catch {
      // already closed
    }
    this.onclose?.(info);
  }
}

/** A frame read from the connection. */
interface _Frame {
  fin: boolean;
  opcode: number;
  payload: Uint8Array;
}

/** Reads frames; a large payload is read straight into its own buffer. */
class _FrameReader {
  readonly #conn: Deno.Conn;
  #buffer: Uint8Array;
  #start = 0;
  #end: number;

  constructor(conn: Deno.Conn, initial: Uint8Array) {
    this.#conn = conn;
    this.#buffer = new Uint8Array(Math.max(65536, initial.length));
    this.#buffer.set(initial);
    this.#end = initial.length;
  }

  /** The next frame; `null` at the end of the connection; a close code for a bad frame. */
  async next(maxMessage: number): Promise<_Frame | number | null> {
    if (!(await this.#fill(2))) return null;
    const b0 = this.#buffer[this.#start];
    const b1 = this.#buffer[this.#start + 1];
    const opcode = b0 & 0x0f;
    const fin = (b0 & 0x80) !== 0;
    if ((b0 & 0x70) !== 0 || (b1 & 0x80) !== 0) return 1002; // RSV bits, or a masked server frame
    if ((opcode > 2 && opcode < 8) || opcode > 10) return 1002;
    let length = b1 & 0x7f;
    let header = 2;
    if (opcode >= 8 && (length > 125 || !fin)) return 1002;
    if (length === 126) {
      if (!(await this.#fill(4))) return null;
      length = (this.#buffer[this.#start + 2] << 8) | this.#buffer[this.#start + 3];
      header = 4;
    } else if (length === 127) {
      if (!(await this.#fill(10))) return null;
      const view = new DataView(this.#buffer.buffer, this.#start + 2, 8);
      const big = view.getBigUint64(0);
      if (big > BigInt(maxMessage)) return 1009;
      length = Number(big);
      header = 10;
    }
    if (length > maxMessage) return 1009;
    this.#start += header;
    const payload = await this.#take(length);
    if (payload === null) return null;
    return { fin, opcode, payload };
  }

  /** Ensures `n` bytes are buffered from `#start`; false at the end of the connection. */
  async #fill(n: number): Promise<boolean> {
    while (this.#end - this.#start < n) {
      if (this.#start > 0 && this.#buffer.length - this.#start < n) {
        this.#buffer.copyWithin(0, this.#start, this.#end);
        this.#end -= this.#start;
        this.#start = 0;
      }
      if (this.#end === this.#buffer.length) {
        const grown = new Uint8Array(this.#buffer.length * 2);
        grown.set(this.#buffer.subarray(0, this.#end));
        this.#buffer = grown;
      }
      const read = await this.#conn.read(this.#buffer.subarray(this.#end));
      if (read === null) return false;
      this.#end += read;
    }
    return true;
  }

  /** `length` bytes as their own buffer. */
  async #take(length: number): Promise<Uint8Array | null> {
    const have = this.#end - this.#start;
    if (have >= length) {
      const out = this.#buffer.slice(this.#start, this.#start + length);
      this.#start += length;
      return out;
    }
    const out = new Uint8Array(length);
    out.set(this.#buffer.subarray(this.#start, this.#end));
    this.#start = this.#end = 0;
    let filled = have;
    while (filled < length) {
      const read = await this.#conn.read(out.subarray(filled));
      if (read === null) return null;
      filled += read;
    }
    return out;
  }
}

/**
 * A client frame: header, masking key, the payload (one array, or parts in order) masked
 * (link/websocket_mask.ts), in a spare buffer of the same size when `spares` has one (taken from
 * it), a new one otherwise.
 */
function _maskedFrame(
  opcode: number,
  payload: Uint8Array | readonly Uint8Array[],
  spares: ArrayBuffer[],
): Uint8Array {
  const parts = payload instanceof Uint8Array ? [payload] : payload;
  let length = 0;
  for (const part of parts) length += part.length;
  const header = length < 126 ? 2 : length < 65536 ? 4 : 10;
  const size = header + 4 + length;
  const spare = spares.findLastIndex((b) => b.byteLength === size);
  const frame = spare >= 0 ? new Uint8Array(spares.splice(spare, 1)[0]) : new Uint8Array(size);
  frame[0] = 0x80 | opcode;
  if (header === 2) frame[1] = 0x80 | length;
  else if (header === 4) {
    frame[1] = 0x80 | 126;
    frame[2] = length >> 8;
    frame[3] = length & 0xff;
  } else {
    frame[1] = 0x80 | 127;
    new DataView(frame.buffer, 2, 8).setBigUint64(0, BigInt(length));
  }
  const key = frame.subarray(header, header + 4);
  crypto.getRandomValues(key);
  let at = 0;
  for (const part of parts) {
    maskInto(part, key, frame.subarray(header + 4 + at), at);
    at += part.length;
  }
  return frame;
}

async function _writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let at = 0; at < bytes.length;) at += await conn.write(bytes.subarray(at));
}

function _concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) (out.set(part, at), at += part.length);
  return out;
}

function _indexOfHeadEnd(bytes: Uint8Array): number {
  for (let i = 3; i < bytes.length; i++) {
    if (bytes[i] === 10 && bytes[i - 1] === 13 && bytes[i - 2] === 10 && bytes[i - 3] === 13) {
      return i - 3;
    }
  }
  return -1;
}

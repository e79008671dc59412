/**
 * The server's end of a WebSocket (RFC 6455) on a connection of its own, for the Router's node
 * links: the handshake answered through http/http1_server.ts's `switchProtocols`, then frames
 * read here. Why not `Deno.upgradeWebSocket`: it receives every message whole (up to 64 MiB)
 * before its size can be looked at, so a peer's oversized message costs the Router that much
 * memory first (six peers at 60 MiB raised a Router's RSS by about 500 MiB). Here each frame's
 * declared length, added to the message's fragments so far, is checked against the limit of the
 * message's kind as soon as the frame's header has arrived: past it, the connection is closed
 * with 1009 and the payload is never read (docs/decisions/router-own-connections.md).
 *
 * ```
 *  upgradeWebSocket(request, limits) ─▶ handshake checked (GET, Upgrade: websocket, Connection:
 *    upgrade, Sec-WebSocket-Version 13, a 16-byte Sec-WebSocket-Key; else WebSocketHandshakeError)
 *    ─▶ { socket (CONNECTING), response: 101 with Sec-WebSocket-Accept }
 *  the 101 written, the connection handed over ─▶ OPEN, onopen
 *  a frame's header (FIN, RSV, opcode, MASK, length, key)
 *    ─▶ reserved bits, unmasked, unknown opcode, control frame fragmented or over 125 bytes,
 *       continuation out of turn: 1002
 *    ─▶ the message so far + this length over the limit of its kind (text, binary): 1009, the
 *       payload left unread, the connection closed
 *    ─▶ payload read (a large one straight into its own buffer) and unmasked in place
 *  text (UTF-8, else 1007) / binary (an ArrayBuffer) ─▶ onmessage; fragments joined
 *  ping ─▶ pong · pong ─▶ nothing · close ─▶ close echoed, the connection closed (the server's
 *    end first, RFC 6455 §7.1.1) ─▶ onclose
 *  nothing received for idleTimeoutMs ─▶ ping; still nothing that long after it ─▶ closed (1001);
 *    one timer (a look a second) for every socket, which also gives back the spare frame
 *    buffers of a socket that sent nothing for a second
 *  send(data) ─▶ one unmasked frame, copied and written in order (bufferedAmount until written)
 *  close(code, reason) ─▶ close frame; the peer's close awaited at most 2 s, then the connection
 * ```
 *
 * It keeps the subset of the `WebSocket` interface the Router's node links use: `onopen`,
 * `onmessage` (text as `string`, binary as `ArrayBuffer`), `onerror`, `onclose`, `send`,
 * `close`, `readyState`, `bufferedAmount`.
 *
 * @module
 */
import { createHash } from "node:crypto";
import { type SwitchedConnection, switchProtocols } from "../http/http1_server.ts";
import { releaseBuffer } from "../protocol/bytes.ts";
import { decodeUtf8 } from "../protocol/utf8.ts";
import { maskInto } from "./websocket_mask.ts";

/** The largest messages a socket takes, and how long it lets a peer stay silent. */
export interface WebSocketLimits {
  /** The largest text message, in bytes (larger: closed with 1009). */
  maxTextBytes: number;
  /** The largest binary message, in bytes (larger: closed with 1009). */
  maxBinaryBytes: number;
  /**
   * With nothing received for this many ms a ping goes out (looked at once a second); with
   * nothing received this long after the ping, the connection is closed (1001). Default 30 000;
   * 0: never.
   */
  idleTimeoutMs?: number;
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

/**
 * What the Router's node links need of a socket: a message sent (text or binary), a close with
 * a code and a reason. {@linkcode ServerWebSocket} is one.
 */
export interface MessageSocket {
  /** Sends one message: a `string` as text, bytes as binary. */
  send(data: string | Uint8Array): void;
  /** Closes with `code` and `reason`. */
  close(code?: number, reason?: string): void;
}

/**
 * The upgrade request is not a WebSocket handshake this endpoint takes; `status` is what to
 * answer (400, or 426 for another `Sec-WebSocket-Version`).
 */
export class WebSocketHandshakeError extends Error {
  /** `"WebSocketHandshakeError"`. */
  override name = "WebSocketHandshakeError";
  /** The status to answer with. */
  readonly status: number;

  /**
   * A refused handshake, answered with `status`.
   *
   * @example
   * ```ts
   * import { WebSocketHandshakeError } from "./websocket_server.ts";
   *
   * if (new WebSocketHandshakeError("no key").status !== 400) throw new Error();
   * ```
   */
  constructor(message: string, status = 400) {
    super(message);
    this.status = status;
  }
}

const _GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const _DEFAULT_IDLE_MS = 30_000;
const _CLOSE_WAIT_MS = 2000;
/**
 * The read buffer's first size: enough for a frame header and the small messages (hello,
 * credit, status); grown while reads fill it, up to {@linkcode _READ_BUFFER_MAX}. A payload
 * larger than what is buffered gets its own buffer. A Router holds one per node connection
 * (hundreds): their memory counts against the collector's budget.
 */
const _READ_BUFFER = 4 * 1024;
const _READ_BUFFER_MAX = 64 * 1024;
/** Frames whose buffers are kept for the next ones of their size (a body goes as many). */
const _REUSE_BYTES = 64 * 1024;
const _SPARES = 4;
const _encoder = new TextEncoder();

/**
 * Answers `request`, an upgrade served by http/http1_server.ts, with a WebSocket: the socket
 * (open once the `101` has gone out) and the response to return. Throws
 * {@linkcode WebSocketHandshakeError} for a request that is not a WebSocket handshake.
 *
 * @example
 * ```ts
 * import { serveHttp1 } from "../http/http1_server.ts";
 * import { upgradeWebSocket } from "./websocket_server.ts";
 * import { WebSocketClient } from "./websocket_client.ts";
 *
 * const server = serveHttp1({
 *   hostname: "127.0.0.1",
 *   port: 0,
 *   handler: (request) => {
 *     const { socket, response } = upgradeWebSocket(request, {
 *       maxTextBytes: 1024,
 *       maxBinaryBytes: 1024,
 *     });
 *     socket.onmessage = (event) => socket.send(`echo ${event.data}`);
 *     return Promise.resolve(response);
 *   },
 * });
 * const client = new WebSocketClient(`ws://127.0.0.1:${server.addr.port}/`);
 * const answer = await new Promise<string>((resolve) => {
 *   client.onopen = () => client.send("hello");
 *   client.onmessage = (event) => resolve(event.data as string);
 * });
 * if (answer !== "echo hello") throw new Error(answer);
 * const closed = new Promise((resolve) => (client.onclose = resolve));
 * client.close(1000, "done");
 * await closed;
 * await server.shutdown();
 * ```
 */
export function upgradeWebSocket(
  request: Request,
  limits: WebSocketLimits,
): { socket: ServerWebSocket; response: Response } {
  const accept = websocketAccept(request);
  const socket = new ServerWebSocket(limits);
  const response = switchProtocols(
    [["upgrade", "websocket"], ["connection", "Upgrade"], ["sec-websocket-accept", accept]],
    (switched) => socket.open(switched),
  );
  return { socket, response };
}

/**
 * The `Sec-WebSocket-Accept` value for a WebSocket handshake `request` (RFC 6455 §4.2.1–§4.2.2);
 * throws {@linkcode WebSocketHandshakeError} naming what is wrong with it.
 *
 * @example
 * ```ts
 * import { websocketAccept } from "./websocket_server.ts";
 *
 * const request = new Request("http://router/kcoral/v1/slot", {
 *   headers: {
 *     upgrade: "websocket",
 *     connection: "Upgrade",
 *     "sec-websocket-version": "13",
 *     "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
 *   },
 * });
 * // RFC 6455 §1.3's example.
 * if (websocketAccept(request) !== "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") throw new Error();
 * ```
 */
export function websocketAccept(request: Request): string {
  const headers = request.headers;
  if (request.method !== "GET") {
    throw new WebSocketHandshakeError(`a WebSocket handshake is a GET, not ${request.method}`);
  }
  if (!_hasToken(headers.get("upgrade"), "websocket")) {
    throw new WebSocketHandshakeError("the Upgrade header does not name websocket");
  }
  if (!_hasToken(headers.get("connection"), "upgrade")) {
    throw new WebSocketHandshakeError("the Connection header does not name upgrade");
  }
  const key = headers.get("sec-websocket-key")?.trim() ?? "";
  let decoded = "";
  try {
    decoded = atob(key);
  } catch {
    // reported below
  }
  if (decoded.length !== 16) {
    throw new WebSocketHandshakeError("Sec-WebSocket-Key is not 16 bytes in base64");
  }
  const version = headers.get("sec-websocket-version");
  if (version?.trim() !== "13") {
    throw new WebSocketHandshakeError(
      `unsupported Sec-WebSocket-Version: ${JSON.stringify(version ?? "")} (13 is)`,
      426,
    );
  }
  return createHash("sha1").update(key + _GUID).digest("base64");
}

/** Whether the comma-separated `value` holds `token` (case-insensitive). */
function _hasToken(value: string | null, token: string): boolean {
  return value !== null && value.split(",").some((part) => part.trim().toLowerCase() === token);
}

/**
 * The server's end of one WebSocket; the subset of the `WebSocket` interface above. Made by
 * {@linkcode upgradeWebSocket}; open once its connection is handed over.
 *
 * @example
 * ```ts
 * import type { ServerWebSocket } from "./websocket_server.ts";
 *
 * function echo(socket: ServerWebSocket): void {
 *   socket.onmessage = (event) => socket.send(event.data as string);
 *   socket.onclose = (event) => console.log("closed", event.code, event.reason);
 * }
 * ```
 */
export class ServerWebSocket implements MessageSocket {
  /** `readyState` until the connection is handed over. */
  static readonly CONNECTING = 0;
  /** `readyState` while open. */
  static readonly OPEN = 1;
  /** `readyState` after a close frame went out, before the connection ended. */
  static readonly CLOSING = 2;
  /** `readyState` once the connection ended. */
  static readonly CLOSED = 3;

  /** Called once the connection is open. */
  onopen: (() => void) | null = null;
  /** Called for each message: text as `string`, binary as `ArrayBuffer`. */
  onmessage: ((event: { data: string | ArrayBuffer }) => void) | null = null;
  /** Called when the peer broke the protocol or sent too much (before `onclose`). */
  onerror: ((event: { message: string; code: number }) => void) | null = null;
  /** Called once when the connection has ended. */
  onclose: ((event: WebSocketCloseInfo) => void) | null = null;
  /** Resolves once the connection has ended (after `onclose`). */
  readonly closed: Promise<void>;

  readonly #limits: Required<WebSocketLimits>;
  #state = ServerWebSocket.CONNECTING;
  #conn: Deno.Conn | null = null;
  #writing: Promise<void> = Promise.resolve();
  #buffered = 0;
  readonly #spares: ArrayBuffer[] = [];
  #closeSent = false;
  #closeTimer: ReturnType<typeof setTimeout> | undefined;
  /** The peer's close frame, once it came. */
  #closeReceived: WebSocketCloseInfo | null = null;
  /** Why this end failed the connection, once it did. */
  #failure: WebSocketCloseInfo | null = null;
  /** When the last bytes came (`performance.now()`). */
  #lastReceived = 0;
  /** When the ping now unanswered went out (0: none). */
  #pingSentAt = 0;
  /** When a frame was last queued (`performance.now()`). */
  #lastWritten = 0;
  readonly #resolveClosed: () => void;

  /**
   * A socket under `limits`, waiting for its connection ({@linkcode upgradeWebSocket} makes
   * it).
   */
  constructor(limits: WebSocketLimits) {
    this.#limits = { idleTimeoutMs: _DEFAULT_IDLE_MS, ...limits };
    const { promise, resolve } = Promise.withResolvers<void>();
    this.closed = promise;
    this.#resolveClosed = resolve;
  }

  /** The connection's state (`CONNECTING`, `OPEN`, `CLOSING`, `CLOSED`). */
  get readyState(): number {
    return this.#state;
  }

  /** Bytes handed to `send` and not yet written to the connection. */
  get bufferedAmount(): number {
    return this.#buffered;
  }

  /**
   * The connection after its `101` (what `switchProtocols` hands over): the socket opens and
   * reads its frames. A socket closed meanwhile closes the connection at once.
   */
  open(switched: SwitchedConnection): void {
    const { conn, buffered } = switched;
    if (this.#state !== ServerWebSocket.CONNECTING) {
      _closeConn(conn);
      return;
    }
    this.#conn = conn;
    this.#state = ServerWebSocket.OPEN;
    this.#lastReceived = performance.now();
    _idleSweep.add(this);
    this.onopen?.();
    void this.#read(new _FrameReader(conn, buffered, () => this.#lastReceived = performance.now()));
  }

  /** Sends one message: a `string` as text, bytes as binary (copied first). Ignored unless open. */
  send(data: string | Uint8Array | ArrayBuffer): void {
    if (this.#state !== ServerWebSocket.OPEN) return;
    if (typeof data === "string") this.#write(1, _encoder.encode(data));
    else this.#write(2, data instanceof Uint8Array ? data : new Uint8Array(data));
  }

  /** Starts the closing handshake (a socket not open yet is closed at once). */
  close(code = 1000, reason = ""): void {
    if (this.#state === ServerWebSocket.CONNECTING) {
      this.#finish({ code: 1006, reason: "closed before the connection opened", wasClean: false });
      return;
    }
    if (this.#state !== ServerWebSocket.OPEN) return;
    this.#sendClose(code, reason);
    // A peer that never answers the close is not waited for.
    this.#closeTimer = setTimeout(() => this.#end(), _CLOSE_WAIT_MS);
  }

  /**
   * The sweep's look at this socket at `now`, once a second: spare buffers of a body sent a
   * while ago given back, a silent peer pinged, then closed.
   */
  idleCheck(now: number): void {
    if (this.#spares.length > 0 && this.#buffered === 0 && now - this.#lastWritten >= _SWEEP_MS) {
      for (const spare of this.#spares.splice(0)) releaseBuffer(new Uint8Array(spare));
    }
    if (this.#state !== ServerWebSocket.OPEN) return;
    const idle = this.#limits.idleTimeoutMs;
    if (idle <= 0) return;
    if (now - this.#lastReceived < idle) {
      this.#pingSentAt = 0;
      return;
    }
    if (this.#pingSentAt === 0) {
      this.#pingSentAt = now;
      this.#write(9, new Uint8Array(0));
    } else if (now - this.#pingSentAt >= idle) {
      this.#failure = { code: 1001, reason: "no answer to ping", wasClean: false };
      this.#sendClose(1001, "no answer to ping");
      this.#writing.finally(() => this.#end()).catch(() => {});
    }
  }

  async #read(reader: _FrameReader): Promise<void> {
    let parts: Uint8Array[] = [];
    let partsBytes = 0;
    let partsOpcode = 0;
    try {
      for (;;) {
        const header = await reader.header();
        if (header === null) return this.#end();
        const { fin, opcode, length } = header;
        const problem = _frameProblem(header, partsOpcode);
        if (problem) return this.#fail(1002, problem);
        if (opcode < 8) {
          const kind = opcode === 0 ? partsOpcode : opcode;
          const limit = kind === 1 ? this.#limits.maxTextBytes : this.#limits.maxBinaryBytes;
          if (partsBytes + length > limit) {
            const what = kind === 1 ? "text" : "binary";
            return this.#fail(
              1009,
              `${what} message of ${partsBytes + length} bytes or more, over the ${limit} allowed`,
            );
          }
        }
        const payload = await reader.payload(length, header.key);
        if (payload === null) return this.#end();
        if (opcode >= 8) {
          if (opcode === 8) {
            const problem = this.#onCloseFrame(payload);
            if (problem) return this.#fail(1002, problem);
            return;
          }
          if (opcode === 9 && this.#state === ServerWebSocket.OPEN) this.#write(10, payload);
          continue;
        }
        if (opcode !== 0) partsOpcode = opcode;
        parts.push(payload);
        partsBytes += length;
        if (!fin) continue;
        const whole = parts.length === 1 ? parts[0] : _concat(parts, partsBytes);
        const type = partsOpcode;
        parts = [];
        partsBytes = 0;
        partsOpcode = 0;
        // Once a close went out, messages still coming are dropped (RFC 6455 §5.5.1).
        if (this.#state !== ServerWebSocket.OPEN) continue;
        if (type === 1) {
          let text: string;
          try {
            text = decodeUtf8(whole);
          } catch {
            return this.#fail(1007, "a text message that is not UTF-8");
          }
          this.onmessage?.({ data: text });
        } else {
          this.onmessage?.({
            data: whole.byteOffset === 0 && whole.byteLength === whole.buffer.byteLength
              ? whole.buffer as ArrayBuffer
              : whole.slice().buffer,
          });
        }
      }
    } catch (error) {
      // A handler threw (a failed read is the connection's end, above): the connection ends,
      // and the error goes on as an uncaught one, as from the platform's WebSocket.
      this.#failure ??= { code: 1011, reason: _message(error), wasClean: false };
      this.#end();
      throw error;
    }
  }

  /** The peer's close frame: echoed unless this end sent one, then the connection ends. */
  #onCloseFrame(payload: Uint8Array): string | null {
    if (payload.length === 1) return "a close frame of one byte";
    const code = payload.length >= 2 ? (payload[0] << 8) | payload[1] : 1005;
    if (payload.length >= 2 && !_validCloseCode(code)) return `close code ${code} is not allowed`;
    let reason: string;
    try {
      reason = decodeUtf8(payload.subarray(2));
    } catch {
      return "a close reason that is not UTF-8";
    }
    this.#closeReceived = { code, reason, wasClean: true };
    if (!this.#closeSent) this.#sendClose(code === 1005 ? 1000 : code, "");
    // The server's end closes first (RFC 6455 §7.1.1), once the echo is written.
    this.#writing.finally(() => this.#end()).catch(() => {});
    return null;
  }

  /**
   * Fails the connection (RFC 6455 §7.1.7): `onerror`, a close frame with `code` unless one went
   * already, and the connection closed once it is written, without reading what still comes.
   */
  #fail(code: number, reason: string): void {
    this.#failure = { code, reason, wasClean: false };
    this.onerror?.({ message: reason, code });
    if (!this.#closeSent) this.#sendClose(code, reason);
    this.#writing.finally(() => this.#end()).catch(() => {});
  }

  #sendClose(code: number, reason: string): void {
    const reasonBytes = _encoder.encode(reason).subarray(0, 123);
    const payload = new Uint8Array(2 + reasonBytes.length);
    payload[0] = code >> 8;
    payload[1] = code & 0xff;
    payload.set(reasonBytes, 2);
    this.#write(8, payload);
    this.#closeSent = true;
    this.#state = ServerWebSocket.CLOSING;
  }

  /** Queues one frame (a copy of `payload` after its header); frames go out in order. */
  #write(opcode: number, payload: Uint8Array): void {
    const conn = this.#conn;
    if (!conn) return;
    const frame = _frame(opcode, payload, this.#spares);
    this.#buffered += frame.length;
    this.#lastWritten = performance.now();
    this.#writing = this.#writing.then(async () => {
      try {
        for (let at = 0; at < frame.length;) at += await conn.write(frame.subarray(at));
      } catch {
        // The connection failed: the read loop sees it end.
      } finally {
        this.#buffered -= frame.length;
        this.#recycle(frame);
      }
    });
  }

  /**
   * A written frame's buffer, kept for the next frame of its size (a body goes as many frames
   * of one size; a new buffer lands on fresh pages); a few at most, and none once the socket has
   * sent nothing for a second (the sweep gives them back: a Router has hundreds of sockets).
   */
  #recycle(frame: Uint8Array): void {
    if (frame.buffer.byteLength < _REUSE_BYTES) return;
    if (this.#state === ServerWebSocket.CLOSED) return releaseBuffer(frame);
    this.#spares.push(frame.buffer as ArrayBuffer);
    if (this.#spares.length > _SPARES) releaseBuffer(new Uint8Array(this.#spares.shift()!));
  }

  /** Ends the connection now. */
  #end(): void {
    _closeConn(this.#conn);
    this.#finish(
      this.#closeReceived ?? this.#failure ?? { code: 1006, reason: "", wasClean: false },
    );
  }

  #finish(info: WebSocketCloseInfo): void {
    if (this.#state === ServerWebSocket.CLOSED) return;
    this.#state = ServerWebSocket.CLOSED;
    clearTimeout(this.#closeTimer);
    _idleSweep.delete(this);
    for (const spare of this.#spares.splice(0)) releaseBuffer(new Uint8Array(spare));
    try {
      this.onclose?.(info);
    } finally {
      this.#resolveClosed();
    }
  }
}

/** A frame's header as read. */
interface _Header {
  fin: boolean;
  /** The RSV1–3 bits (0 without an extension, and none is negotiated). */
  rsv: number;
  opcode: number;
  masked: boolean;
  /** The payload's length (`Infinity` for a 64-bit length past 2^53). */
  length: number;
  /** The masking key (4 bytes; empty when unmasked). */
  key: Uint8Array;
}

/** What is wrong with a frame, by its header alone, after data frames of `partsOpcode`. */
function _frameProblem(header: _Header, partsOpcode: number): string | null {
  const { fin, rsv, opcode, masked, length } = header;
  if (rsv !== 0) return "reserved bits set without an extension";
  if (!masked) return "an unmasked frame from a client";
  if ((opcode > 2 && opcode < 8) || opcode > 10) return `unknown opcode ${opcode}`;
  if (opcode >= 8) {
    if (!fin) return "a fragmented control frame";
    if (length > 125) return "a control frame over 125 bytes";
    return null;
  }
  if (opcode === 0 && partsOpcode === 0) return "a continuation frame without a message";
  if (opcode !== 0 && partsOpcode !== 0) return "a new message inside a fragmented one";
  return null;
}

/** Close codes a peer may send (RFC 6455 §7.4.1; 4000–4999 private). */
function _validCloseCode(code: number): boolean {
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
    (code >= 3000 && code <= 4999);
}

/** Reads frame headers and payloads; a payload larger than what is buffered gets its own buffer. */
class _FrameReader {
  readonly #conn: Deno.Conn;
  readonly #received: () => void;
  #buffer: Uint8Array = new Uint8Array(_READ_BUFFER);
  #start = 0;
  #end = 0;

  constructor(conn: Deno.Conn, initial: Uint8Array, received: () => void) {
    this.#conn = conn;
    this.#received = received;
    if (initial.length > this.#buffer.length) this.#buffer = new Uint8Array(initial.length);
    this.#buffer.set(initial);
    this.#end = initial.length;
  }

  /** The next frame's header; `null` at the end of the connection. */
  async header(): Promise<_Header | null> {
    if (!(await this.#fill(2))) return null;
    const b0 = this.#buffer[this.#start];
    const b1 = this.#buffer[this.#start + 1];
    const masked = (b1 & 0x80) !== 0;
    let length = b1 & 0x7f;
    let size = 2;
    if (length === 126) size = 4;
    else if (length === 127) size = 10;
    if (masked) size += 4;
    if (!(await this.#fill(size))) return null;
    const at = this.#start;
    if (length === 126) length = (this.#buffer[at + 2] << 8) | this.#buffer[at + 3];
    else if (length === 127) {
      const view = new DataView(this.#buffer.buffer, this.#buffer.byteOffset + at + 2, 8);
      const big = view.getBigUint64(0);
      length = big > BigInt(Number.MAX_SAFE_INTEGER) ? Infinity : Number(big);
    }
    const key = masked ? this.#buffer.slice(at + size - 4, at + size) : new Uint8Array(0);
    this.#start += size;
    return {
      fin: (b0 & 0x80) !== 0,
      rsv: (b0 >> 4) & 0x07,
      opcode: b0 & 0x0f,
      masked,
      length,
      key,
    };
  }

  /** `length` payload bytes, unmasked with `key`, in a buffer of their own; `null` at the end. */
  async payload(length: number, key: Uint8Array): Promise<Uint8Array | null> {
    const have = this.#end - this.#start;
    let out: Uint8Array;
    if (have >= length) {
      out = new Uint8Array(length);
      maskInto(this.#buffer.subarray(this.#start, this.#start + length), key, out);
      this.#start += length;
      return out;
    }
    // Straight from the connection into the message's own buffer, then unmasked in place.
    out = new Uint8Array(length);
    out.set(this.#buffer.subarray(this.#start, this.#end));
    this.#start = this.#end = 0;
    for (let filled = have; filled < length;) {
      const read = await _read(this.#conn, out.subarray(filled));
      if (read === null) return null;
      this.#received();
      filled += read;
    }
    maskInto(out, key, out);
    return out;
  }

  /** Ensures `n` bytes are buffered from `#start`; false at the end of the connection. */
  async #fill(n: number): Promise<boolean> {
    while (this.#end - this.#start < n) {
      if (this.#start > 0) {
        this.#buffer.copyWithin(0, this.#start, this.#end);
        this.#end -= this.#start;
        this.#start = 0;
      }
      const read = await _read(this.#conn, this.#buffer.subarray(this.#end));
      if (read === null) return false;
      this.#received();
      this.#end += read;
      // A read that filled the buffer: messages come faster than one read a buffer.
      if (this.#end === this.#buffer.length && this.#buffer.length < _READ_BUFFER_MAX) {
        const grown = new Uint8Array(this.#buffer.length * 4);
        grown.set(this.#buffer.subarray(0, this.#end));
        this.#buffer = grown;
      }
    }
    return true;
  }
}

/**
 * A server frame (unmasked): header and a copy of `payload`, in a spare buffer of the same size
 * when `spares` has one (taken from it), a new one otherwise.
 */
function _frame(opcode: number, payload: Uint8Array, spares: ArrayBuffer[]): Uint8Array {
  const length = payload.length;
  const header = length < 126 ? 2 : length < 65536 ? 4 : 10;
  const size = header + length;
  const spare = spares.findLastIndex((b) => b.byteLength === size);
  const frame = spare >= 0 ? new Uint8Array(spares.splice(spare, 1)[0]) : new Uint8Array(size);
  frame[0] = 0x80 | opcode;
  if (header === 2) frame[1] = length;
  else if (header === 4) {
    frame[1] = 126;
    frame[2] = length >> 8;
    frame[3] = length & 0xff;
  } else {
    frame[1] = 127;
    new DataView(frame.buffer, 2, 8).setBigUint64(0, BigInt(length));
  }
  frame.set(payload, header);
  return frame;
}

/** One timer for every open socket's idle check, running while any is open. */
class _IdleSweep {
  readonly #sockets = new Set<ServerWebSocket>();
  #timer: ReturnType<typeof setInterval> | null = null;

  add(socket: ServerWebSocket): void {
    this.#sockets.add(socket);
    if (this.#timer !== null) return;
    this.#timer = setInterval(() => {
      const now = performance.now();
      for (const open of this.#sockets) open.idleCheck(now);
    }, _SWEEP_MS);
    Deno.unrefTimer(this.#timer);
  }

  delete(socket: ServerWebSocket): void {
    this.#sockets.delete(socket);
    if (this.#sockets.size === 0 && this.#timer !== null) {
      clearInterval(this.#timer);
      this.#timer = null;
    }
  }
}

/** How often the idle sweep looks (a ping goes out within this after the idle timeout). */
const _SWEEP_MS = 1000;
const _idleSweep = new _IdleSweep();

function _concat(parts: Uint8Array[], total: number): Uint8Array {
  const out = new Uint8Array(total);
  let at = 0;
  for (const part of parts) (out.set(part, at), at += part.length);
  return out;
}

function _closeConn(conn: Deno.Conn | null): void {
  try {
    conn?.close();
  } catch {
    // already closed
  }
}

/** A read of `conn`; `null` at its end, and when it failed (reset, or closed under the read). */
function _read(conn: Deno.Conn, into: Uint8Array): Promise<number | null> {
  return conn.read(into).catch(() => null);
}

function _message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * The server's end of a WebSocket (RFC 6455) on a connection of its own, for the Router's node
 * links: the handshake checked (websocket_handshake.ts) and answered through
 * http/http1_switch.ts's `switchProtocols`, then frames read and written (websocket_frames.ts)
 * and judged here. Why not `Deno.upgradeWebSocket`: it receives every message whole (up to 64
 * MiB) before its size can be looked at, so a peer's oversized message costs the Router that
 * much memory first (six peers at 60 MiB raised a Router's RSS by about 500 MiB). Here each frame's
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
import { type SwitchedConnection, switchProtocols } from "../http/http1_switch.ts";
import { concatBytes } from "../protocol/bytes.ts";
import { decodeUtf8 } from "../protocol/utf8.ts";
import { errorMessage } from "../protocol/errors.ts";
import {
  closePayload,
  closeQuietly,
  frameProblem,
  FrameReader,
  FrameWriter,
  messageData,
  type WebSocketCloseInfo,
} from "./websocket_frames.ts";
import { websocketAccept } from "./websocket_handshake.ts";

export type { WebSocketCloseInfo } from "./websocket_frames.ts";
export { websocketAccept, WebSocketHandshakeError } from "./websocket_handshake.ts";

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

const _DEFAULT_IDLE_MS = 30_000;
const _CLOSE_WAIT_MS = 2000;
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
  /** The connection's frames out, once it is open. */
  #writer: FrameWriter | null = null;
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
    return this.#writer?.buffered ?? 0;
  }

  /**
   * The connection after its `101` (what `switchProtocols` hands over): the socket opens and
   * reads its frames. A socket closed meanwhile closes the connection at once.
   */
  open(switched: SwitchedConnection): void {
    const { conn, buffered } = switched;
    if (this.#state !== ServerWebSocket.CONNECTING) {
      closeQuietly(conn);
      return;
    }
    this.#conn = conn;
    this.#writer = new FrameWriter(conn, false);
    this.#state = ServerWebSocket.OPEN;
    this.#lastReceived = performance.now();
    _idleSweep.add(this);
    this.onopen?.();
    void this.#read(new FrameReader(conn, buffered, () => this.#lastReceived = performance.now()));
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
    const writer = this.#writer;
    if (
      writer && writer.spares > 0 && writer.buffered === 0 && now - writer.lastQueued >= _SWEEP_MS
    ) {
      writer.releaseSpares();
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
      this.#afterWrites(() => this.#end());
    }
  }

  async #read(reader: FrameReader): Promise<void> {
    let parts: Uint8Array[] = [];
    let partsBytes = 0;
    let partsOpcode = 0;
    try {
      for (;;) {
        const header = await reader.header();
        if (header === null) return this.#end();
        const { fin, opcode, length } = header;
        const problem = frameProblem(header, partsOpcode, true);
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
        const whole = parts.length === 1 ? parts[0] : concatBytes(parts);
        const type = partsOpcode;
        parts = [];
        partsBytes = 0;
        partsOpcode = 0;
        // Once a close went out, messages still coming are dropped (RFC 6455 §5.5.1).
        if (this.#state !== ServerWebSocket.OPEN) continue;
        let data: string | ArrayBuffer;
        try {
          data = messageData(whole, type);
        } catch {
          return this.#fail(1007, "a text message that is not UTF-8");
        }
        this.onmessage?.({ data });
      }
    } catch (error) {
      // A handler threw (a failed read is the connection's end, above): the connection ends,
      // and the error goes on as an uncaught one, as from the platform's WebSocket.
      this.#failure ??= { code: 1011, reason: errorMessage(error), wasClean: false };
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
    this.#afterWrites(() => this.#end());
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
    this.#afterWrites(() => this.#end());
  }

  #sendClose(code: number, reason: string): void {
    this.#write(8, closePayload(code, reason));
    this.#closeSent = true;
    this.#state = ServerWebSocket.CLOSING;
  }

  /** Queues one frame (a copy of `payload` after its header); frames go out in order. */
  #write(opcode: number, payload: Uint8Array): void {
    this.#writer?.write(opcode, payload);
  }

  /** Runs `then` once the frames queued so far are written. */
  #afterWrites(then: () => void): void {
    (this.#writer?.written ?? Promise.resolve()).finally(then).catch(() => {});
  }

  /** Ends the connection now. */
  #end(): void {
    closeQuietly(this.#conn);
    this.#finish(
      this.#closeReceived ?? this.#failure ?? { code: 1006, reason: "", wasClean: false },
    );
  }

  #finish(info: WebSocketCloseInfo): void {
    if (this.#state === ServerWebSocket.CLOSED) return;
    this.#state = ServerWebSocket.CLOSED;
    clearTimeout(this.#closeTimer);
    _idleSweep.delete(this);
    this.#writer?.close();
    try {
      this.onclose?.(info);
    } finally {
      this.#resolveClosed();
    }
  }
}

/** Close codes a peer may send (RFC 6455 §7.4.1; 4000–4999 private). */
function _validCloseCode(code: number): boolean {
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
    (code >= 3000 && code <= 4999);
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

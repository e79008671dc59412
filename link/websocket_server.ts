/**
 * The server's end of a WebSocket (RFC 6455) on a connection of its own, for the Router's node
 * links: the handshake checked (websocket_handshake.ts) and answered through
 * http/http1_switch.ts's `switchProtocols`, then websocket_connection.ts with this end's limits.
 * Unlike `Deno.upgradeWebSocket`, a frame over the limit of its message's kind is refused (1009)
 * from its header, its payload never read (docs/decisions/router-own-connections.md).
 *
 * ```
 *  upgradeWebSocket(request, limits) ─▶ handshake checked (GET, Upgrade: websocket, Connection:
 *    upgrade, Sec-WebSocket-Version 13, a 16-byte Sec-WebSocket-Key; else WebSocketHandshakeError)
 *    ─▶ { socket (CONNECTING), response: 101 with Sec-WebSocket-Accept }
 *  the 101 written, the connection handed over ─▶ OPEN, onopen
 *  a frame unmasked: 1002 · the message so far + this length over the limit of its kind (text,
 *    binary): 1009, the payload left unread · a close frame of one byte, a code not allowed or a
 *    reason not UTF-8: 1002 · a handler's error: 1011, thrown on
 *  nothing received for idleTimeoutMs ─▶ ping; still nothing that long after it ─▶ closed (1001);
 *    one timer (a look a second) for every socket, which also gives back the spare frame
 *    buffers of a socket that sent nothing for a second
 *  send(data) ─▶ one unmasked frame · close(code, reason) ─▶ the peer's close awaited at most 2 s
 * ```
 *
 * @module
 */
import { type SwitchedConnection, switchProtocols } from "../http/http1_switch.ts";
import { decodeUtf8 } from "../protocol/utf8.ts";
import { errorMessage } from "../protocol/errors.ts";
import { closeQuietly, FrameReader, type WebSocketCloseInfo } from "./websocket_frames.ts";
import { WebSocketConnection } from "./websocket_connection.ts";
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
/**
 * Answers `request`, an upgrade served by http/http1_server.ts, with a WebSocket: the socket
 * (open once the `101` has gone out) and the response to return. Throws
 * {@linkcode WebSocketHandshakeError} for a request that is not a WebSocket handshake.
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
 */
export class ServerWebSocket extends WebSocketConnection implements MessageSocket {
  /** Called when the peer broke the protocol or sent too much (before `onclose`). */
  onerror: ((event: { message: string; code: number }) => void) | null = null;
  /** Resolves once the connection has ended (after `onclose`). */
  readonly closed: Promise<void>;

  readonly #limits: Required<WebSocketLimits>;
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
    super(false, "a text message that is not UTF-8");
    this.#limits = { idleTimeoutMs: _DEFAULT_IDLE_MS, ...limits };
    const { promise, resolve } = Promise.withResolvers<void>();
    this.closed = promise;
    this.#resolveClosed = resolve;
  }

  /**
   * The connection after its `101` (what `switchProtocols` hands over): the socket opens and
   * reads its frames. A socket closed meanwhile closes the connection at once.
   */
  open({ conn, buffered }: SwitchedConnection): void {
    if (this.readyState !== ServerWebSocket.CONNECTING) return closeQuietly(conn);
    this.attach(conn);
    this.#lastReceived = performance.now();
    _idleSweep.add(this);
    this.opened();
    const reader = new FrameReader(conn, buffered, () => this.#lastReceived = performance.now());
    this.readFrames(reader).catch((error) => {
      // A handler threw (a failed read is the connection's end): the connection ends, and the
      // error goes on as an uncaught one, as from the platform's WebSocket.
      this.closeInfo ??= { code: 1011, reason: errorMessage(error), wasClean: false };
      this.end();
      throw error;
    });
  }

  /**
   * The sweep's look at this socket at `now`, once a second: spare buffers of a body sent a
   * while ago given back, a silent peer pinged, then closed.
   */
  idleCheck(now: number): void {
    const writer = this.writer;
    if (
      writer && writer.spares > 0 && writer.buffered === 0 && now - writer.lastQueued >= _SWEEP_MS
    ) {
      writer.releaseSpares();
    }
    if (this.readyState !== ServerWebSocket.OPEN) return;
    const idle = this.#limits.idleTimeoutMs;
    if (idle <= 0) return;
    if (now - this.#lastReceived < idle) {
      this.#pingSentAt = 0;
      return;
    }
    if (this.#pingSentAt === 0) {
      this.#pingSentAt = now;
      this.write(9, new Uint8Array(0));
    } else if (now - this.#pingSentAt >= idle) {
      this.closeInfo = { code: 1001, reason: "no answer to ping", wasClean: false };
      this.closeFailed(1001, "no answer to ping");
    }
  }

  protected oversize(kind: number, bytes: number): string | null {
    const limit = kind === 1 ? this.#limits.maxTextBytes : this.#limits.maxBinaryBytes;
    if (bytes <= limit) return null;
    return `${
      kind === 1 ? "text" : "binary"
    } message of ${bytes} bytes or more, over the ${limit} allowed`;
  }

  protected failed(code: number, reason: string): void {
    this.closeInfo = { code, reason, wasClean: false };
    this.onerror?.({ message: reason, code });
  }

  protected override closeFrameProblem(payload: Uint8Array, code: number): string | null {
    if (payload.length === 1) return "a close frame of one byte";
    if (payload.length >= 2 && !_validCloseCode(code)) return `close code ${code} is not allowed`;
    try {
      decodeUtf8(payload.subarray(2));
      return null;
    } catch {
      return "a close reason that is not UTF-8";
    }
  }

  protected override finish(info: WebSocketCloseInfo): void {
    _idleSweep.delete(this);
    try {
      super.finish(info);
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

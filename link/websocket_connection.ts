/**
 * What both ends of a node link's WebSocket (RFC 6455) do alike once their handshake is done:
 * the `WebSocket` interface's subset the link uses (`onopen`, `onmessage` with text as `string`
 * and binary as `ArrayBuffer`, `onclose`, `send`, `close`, `readyState`, `bufferedAmount`), the
 * frames read and judged (websocket_frames.ts), fragments joined, pings answered, the closing
 * handshake and the connection's failure. The ends add what differs: websocket_client.ts (the
 * node's) dials, handshakes as a client and masks its frames; websocket_server.ts (the Router's)
 * answers the upgrade, takes masked frames only and refuses a message over its limit at the
 * frame's header.
 *
 * ```
 *  a frame's header ─▶ against the protocol (frameProblem): 1002 · over the end's limit: 1009
 *    (the payload left unread) ─▶ payload read and unmasked
 *  text (UTF-8, else 1007) / binary ─▶ onmessage; fragments joined; dropped once closing
 *  ping ─▶ pong · pong ─▶ nothing · close ─▶ close echoed, the connection ended once it is written
 *  send(data) ─▶ one frame, copied and written in order (bufferedAmount until written)
 *  close(code, reason) ─▶ close frame; the peer's end awaited at most 2 s, then the connection
 *  a failure (1002, 1007, 1009) ─▶ onerror (the end's), a close frame, the connection ended
 * ```
 *
 * @module
 */
import { concatBytes } from "../protocol/bytes.ts";
import { decodeUtf8 } from "../protocol/utf8.ts";
import {
  closePayload,
  closeQuietly,
  frameProblem,
  type FrameReader,
  FrameWriter,
  messageData,
  type WebSocketCloseInfo,
} from "./websocket_frames.ts";

const _CLOSE_WAIT_MS = 2000;
const _encoder = new TextEncoder();

/**
 * One end of a WebSocket over a connection of its own: what {@linkcode WebSocketClient} and
 * {@linkcode ServerWebSocket} share. An end hands its connection over with `attach`, opens with
 * `opened` and reads with `readFrames`.
 */
export abstract class WebSocketConnection {
  /** `readyState` until the connection is open. */
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
  /** Called once when the connection has ended. */
  onclose: ((event: WebSocketCloseInfo) => void) | null = null;

  /** How the connection ends: the peer's close frame or why this end failed it, the later. */
  protected closeInfo: WebSocketCloseInfo | null = null;
  readonly #client: boolean;
  /** The reason a text message that is not UTF-8 fails the connection with (1007). */
  readonly #notUtf8Reason: string;
  #state: number = WebSocketConnection.CONNECTING;
  #conn: Deno.Conn | null = null;
  /** The connection's frames out, once it is attached. */
  #writer: FrameWriter | null = null;
  #closeSent = false;
  #closeTimer: ReturnType<typeof setTimeout> | undefined;

  /**
   * An end not connected yet; `client`: the node's (masks its frames, takes unmasked ones);
   * `notUtf8Reason`: the reason a text message that is not UTF-8 fails the connection with.
   */
  constructor(client: boolean, notUtf8Reason: string) {
    this.#client = client;
    this.#notUtf8Reason = notUtf8Reason;
  }

  /** The connection's state (`CONNECTING`, `OPEN`, `CLOSING`, `CLOSED`). */
  get readyState(): number {
    return this.#state;
  }

  /** Bytes handed to `send` and not yet written to the connection. */
  get bufferedAmount(): number {
    return this.#writer?.buffered ?? 0;
  }

  /** Sends one message: a `string` as text, bytes as binary (copied first). Ignored unless open. */
  send(data: string | Uint8Array | ArrayBuffer): void {
    if (this.#state !== WebSocketConnection.OPEN) return;
    if (typeof data === "string") this.write(1, _encoder.encode(data));
    else this.write(2, data instanceof Uint8Array ? data : new Uint8Array(data));
  }

  /** Starts the closing handshake (one not open yet ends at once, 1006). */
  close(code = 1000, reason = ""): void {
    if (this.#state === WebSocketConnection.CONNECTING) {
      this.finish({ code: 1006, reason: "closed before the connection opened", wasClean: false });
      return;
    }
    if (this.#state !== WebSocketConnection.OPEN) return;
    this.#sendClose(code, reason);
  }

  /** The connection's frames out, once attached. */
  protected get writer(): FrameWriter | null {
    return this.#writer;
  }

  /** Frames go out on `conn` from now (masked by the client). */
  protected attach(conn: Deno.Conn): void {
    this.#conn = conn;
    this.#writer = new FrameWriter(conn, this.#client);
  }

  /** The connection is open: `OPEN`, then `onopen`. */
  protected opened(): void {
    this.#state = WebSocketConnection.OPEN;
    this.onopen?.();
  }

  /** Reads `reader`'s frames until the connection ends or fails; a handler's error is thrown. */
  protected async readFrames(reader: FrameReader): Promise<void> {
    let parts: Uint8Array[] = [];
    let partsBytes = 0;
    let partsOpcode = 0;
    for (;;) {
      const header = await reader.header();
      if (header === null) return this.ended(reader.readError);
      const { fin, opcode, length } = header;
      const problem = frameProblem(header, partsOpcode, !this.#client);
      if (problem) return this.#fail(1002, problem);
      const tooBig = opcode < 8 && this.oversize(opcode || partsOpcode, partsBytes + length);
      if (tooBig) return this.#fail(1009, tooBig);
      const payload = await reader.payload(length, header.key);
      if (payload === null) return this.ended(reader.readError);
      if (opcode === 8) {
        const code = payload.length >= 2 ? (payload[0] << 8) | payload[1] : 1005;
        const problem = this.closeFrameProblem(payload, code);
        if (problem) return this.#fail(1002, problem);
        this.closeInfo = { code, reason: _closeReason(payload), wasClean: true };
        if (!this.#closeSent) this.#sendClose(code === 1005 ? 1000 : code, "");
        // The server's end closes first (RFC 6455 §7.1.1), once the echo is written; the
        // client's ends then too, or when the server's end does, what comes first.
        this.afterWrites(() => this.end());
        if (this.#client) continue;
        return;
      }
      if (opcode >= 8) {
        if (opcode === 9 && this.#state === WebSocketConnection.OPEN) this.write(10, payload);
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
      if (this.#state !== WebSocketConnection.OPEN) continue;
      let data: string | ArrayBuffer;
      try {
        data = messageData(whole, type);
      } catch {
        return this.#fail(1007, this.#notUtf8Reason);
      }
      this.onmessage?.({ data });
    }
  }

  /** Why a message of `kind` (1 text, 2 binary) reaching `bytes` is refused (1009); null: not. */
  protected abstract oversize(kind: number, bytes: number): string | null;

  /** This end failed the connection with `code` and `reason`: `closeInfo` and `onerror` set. */
  protected abstract failed(code: number, reason: string): void;

  /** What is wrong with the peer's close frame, of `code` (1002); null: nothing (the default). */
  protected closeFrameProblem(_payload: Uint8Array, _code: number): string | null {
    return null;
  }

  /** The connection's reads ended (`readError`: the failure, if one): the connection ends. */
  protected ended(_readError: unknown): void {
    this.end();
  }

  /** Fails the connection (RFC 6455 §7.1.7): `failed`, then {@linkcode closeFailed}. */
  #fail(code: number, reason: string): void {
    this.failed(code, reason);
    this.closeFailed(code, reason);
  }

  /**
   * A close frame with `code` unless one went already, and the connection ended once it is
   * written, without reading what still comes.
   */
  protected closeFailed(code: number, reason: string): void {
    if (!this.#closeSent && this.#state === WebSocketConnection.OPEN) {
      this.#sendClose(code, reason);
    }
    this.afterWrites(() => this.end());
  }

  /**
   * A close frame out; the connection is closed if it has not ended 2 s later, whichever end
   * this is: a peer that never answers, or never reads what is queued before the close frame,
   * holds nothing beyond that.
   */
  #sendClose(code: number, reason: string): void {
    this.write(8, closePayload(code, reason));
    this.#closeSent = true;
    this.#state = WebSocketConnection.CLOSING;
    this.#closeTimer = setTimeout(() => closeQuietly(this.#conn), _CLOSE_WAIT_MS);
  }

  /** Queues one frame (a copy of `payload` after its header); frames go out in order. */
  protected write(opcode: number, payload: Uint8Array | readonly Uint8Array[]): void {
    this.#writer?.write(opcode, payload);
  }

  /** Runs `then` once the frames queued so far are written. */
  protected afterWrites(then: () => void): void {
    (this.#writer?.written ?? Promise.resolve()).finally(then).catch(() => {});
  }

  /** Ends the connection now, as `closeInfo` says (else 1006). */
  protected end(): void {
    this.finish(this.closeInfo ?? { code: 1006, reason: "", wasClean: false });
  }

  /** The connection ended with `info`: `CLOSED`, the connection closed, `onclose` (once). */
  protected finish(info: WebSocketCloseInfo): void {
    if (this.#state === WebSocketConnection.CLOSED) return;
    this.#state = WebSocketConnection.CLOSED;
    clearTimeout(this.#closeTimer);
    this.#writer?.close();
    closeQuietly(this.#conn);
    this.onclose?.(info);
  }
}

/** A close frame's reason; "" when it is not UTF-8. */
function _closeReason(payload: Uint8Array): string {
  try {
    return decodeUtf8(payload.subarray(2));
  } catch {
    return "";
  }
}

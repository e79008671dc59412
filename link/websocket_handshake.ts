/**
 * The WebSocket opening handshake (RFC 6455 §4): the `Sec-WebSocket-Accept` value both ends
 * compute from the client's key, and the server's check of an upgrade request
 * ({@linkcode websocketAccept}, refusing with {@linkcode WebSocketHandshakeError}).
 *
 * @module
 */
import { createHash } from "node:crypto";

/**
 * The upgrade request is not a WebSocket handshake this endpoint takes; `status` is what to
 * answer (400, or 426 for another `Sec-WebSocket-Version`).
 */
export class WebSocketHandshakeError extends Error {
  /** `"WebSocketHandshakeError"`. */
  override name = "WebSocketHandshakeError";
  /** The status to answer with. */
  readonly status: number;

  /** A refused handshake, answered with `status`. */
  constructor(message: string, status = 400) {
    super(message);
    this.status = status;
  }
}

const _GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/**
 * The `Sec-WebSocket-Accept` value for the client's `Sec-WebSocket-Key` `key` (RFC 6455 §4.2.2).
 */
export function acceptKey(key: string): string {
  return createHash("sha1").update(key + _GUID).digest("base64");
}

/**
 * The `Sec-WebSocket-Accept` value for a WebSocket handshake `request` (RFC 6455 §4.2.1–§4.2.2);
 * throws {@linkcode WebSocketHandshakeError} naming what is wrong with it.
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
  return acceptKey(key);
}

/** Whether the comma-separated `value` holds `token` (case-insensitive). */
function _hasToken(value: string | null, token: string): boolean {
  return value !== null && value.split(",").some((part) => part.trim().toLowerCase() === token);
}

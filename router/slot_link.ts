/**
 * One node slot at the Router: the WebSocket a node's server opened for one of its workers, and
 * the request it carries (spec router §1.5, over link/frames.ts and link/messages.ts).
 *
 * ```
 *   idle ──begin(request, body in hand)──▶ one frame: head, body, end ─▶ node
 *   idle ──begin(request)──▶ the head ─▶ node; upload: frames of bytes (within credit), end
 *                                                                     ◀─ credit
 *     answer: ◀─ frames: the head, bytes (Router grants credit as its client reads), the end
 *             (a small answer: one frame)
 *   both ends passed ──▶ idle again (the registry puts the slot back in its FIFO)
 *   cancel(reason) ──▶ cancel ─▶ node, connection closed (the node opens a new one)
 *   anything out of turn from the node ──▶ invalid_response, connection closed
 *   connection lost ──▶ tunnel_disconnected
 * ```
 *
 * @module
 */
import {
  type CancelReason,
  encodeMessage,
  type HeaderEntry,
  LINK_CLOSE,
  type LinkCloseName,
  LinkMessageError,
  parseSlotMessage,
  type ResponseHead,
  type SlotHello,
} from "../link/messages.ts";
import { type BodyFrame, decodeResponseFrame } from "../link/frames.ts";
import { BodyReceiver } from "../link/body_receiver.ts";
import { BodySender } from "../link/body_sender.ts";
import type { MessageSocket } from "../link/websocket_server.ts";
import { releaseBuffer } from "../protocol/bytes.ts";
import { errorMessage } from "../protocol/errors.ts";
import type { SlotHandle } from "./connections.ts";

/** Why an exchange failed: the node's answer was out of turn, or the connection went away. */
export type TunnelFailure = "invalid_response" | "tunnel_disconnected";

/** Closes a node link's `socket` with a node-link close code; one already closed is left be. */
export function closeLink(socket: MessageSocket, code: LinkCloseName, reason: string): void {
  try {
    socket.close(LINK_CLOSE[code], reason.slice(0, 120));
  } catch {
    // already closed
  }
}

/** The slot failed under a request. */
export class TunnelError extends Error {
  /** Which failure. */
  readonly reason: TunnelFailure;
  /** Creates the error. */
  constructor(reason: TunnelFailure, detail?: string) {
    super(detail ? `${reason}: ${detail}` : reason);
    this.name = "TunnelError";
    this.reason = reason;
  }
}

/** One request through a slot, the Router's side. */
export interface TunnelExchange {
  /** The Router's request id. */
  readonly requestId: string;
  /** The request body toward the node. */
  readonly upload: BodySender;
  /** The node's response head; rejects with {@linkcode TunnelError}. */
  readonly head: Promise<ResponseHead>;
  /** The response body (readable once `head` resolved). */
  readonly body: BodyReceiver;
  /** Resolves once the node's `end` came; rejects with {@linkcode TunnelError}. */
  readonly answered: Promise<void>;
  /** Discards the request and the slot (non-blocking). */
  cancel(reason: CancelReason): void;
}

class _Exchange implements TunnelExchange {
  readonly requestId: string;
  readonly upload: BodySender;
  readonly body: BodyReceiver;
  readonly #head = Promise.withResolvers<ResponseHead>();
  readonly #answered = Promise.withResolvers<void>();
  readonly head: Promise<ResponseHead> = this.#head.promise;
  readonly answered: Promise<void> = this.#answered.promise;
  headSeen = false;
  nodeEnded = false;
  readonly #cancel: (reason: CancelReason) => void;

  constructor(
    requestId: string,
    headers: HeaderEntry[],
    contentLength: number | null,
    send: (data: string | Uint8Array) => void,
    progress: (exchange: _Exchange) => void,
    cancel: (reason: CancelReason) => void,
  ) {
    this.#cancel = cancel;
    this.requestId = requestId;
    this.upload = new BodySender(
      requestId,
      { headers, content_length: contentLength },
      // The socket's send copied the frame: its memory goes back now (protocol/bytes.ts).
      (frame) => {
        send(frame);
        releaseBuffer(frame);
        if (this.upload.ended) progress(this);
      },
    );
    this.body = new BodyReceiver((frames) =>
      send(encodeMessage({ t: "credit", request_id: requestId, frames }))
    );
    // Whoever does not wait for these still must not see an unhandled rejection.
    this.head.catch(() => {});
    this.answered.catch(() => {});
  }

  cancel(reason: CancelReason): void {
    this.#cancel(reason);
  }

  /** The node's `credit`, the one text message it sends about a request. */
  onMessage(text: string): void {
    const message = parseSlotMessage(text);
    if (message.t !== "credit") throw new LinkMessageError(`'${message.t}' from a node`);
    if (message.request_id !== this.requestId) throw new LinkMessageError("credit out of turn");
    this.upload.credit(message.frames);
  }

  /**
   * A frame of the node's answer. Its head settles {@linkcode TunnelExchange.head} after this
   * returns: whoever awaits it finds the bytes and the end of the same frame already taken.
   */
  onFrame(frame: BodyFrame<ResponseHead>): void {
    if (frame.requestId !== this.requestId) throw new LinkMessageError("frame for another request");
    if (frame.head) {
      if (this.headSeen) throw new LinkMessageError("a second response head");
      this.headSeen = true;
      this.#head.resolve(frame.head);
    } else if (!this.headSeen) {
      throw new LinkMessageError("body before the response head");
    }
    this.body.receive(frame.bytes, frame.end);
    if (frame.end) {
      this.nodeEnded = true;
      this.#answered.resolve();
    }
  }

  fail(error: TunnelError): void {
    this.upload.fail(error);
    this.body.fail(error);
    this.#head.reject(error);
    if (!this.nodeEnded) this.#answered.reject(error);
  }
}

/** A registered slot's connection; the hub hands it every message after `hello`. */
export class RouterSlot implements SlotHandle {
  /** Unique per connection. */
  readonly connectionId: string = crypto.randomUUID();
  /** The slot id of the hello. */
  readonly slotId: string;
  /** The node. */
  readonly nodeId: string;
  /** The node's server instance the slot belongs to. */
  readonly serverInstanceId: string;
  readonly #socket: MessageSocket;
  readonly #onClosed: (slot: RouterSlot, reason: string) => void;
  #exchange: _Exchange | null = null;
  #closed = false;

  /** Wraps an open `socket` whose `hello` was accepted; `onClosed` runs once when it ends. */
  constructor(
    socket: MessageSocket,
    hello: SlotHello,
    onClosed: (slot: RouterSlot, reason: string) => void,
  ) {
    this.#socket = socket;
    this.slotId = hello.slot_id;
    this.nodeId = hello.node_id;
    this.serverInstanceId = hello.server_instance_id;
    this.#onClosed = onClosed;
  }

  /** Whether the connection has ended. */
  get isClosed(): boolean {
    return this.#closed;
  }

  /** Whether a request is on the slot. */
  get busy(): boolean {
    return this.#exchange !== null;
  }

  /**
   * Starts a request. With its whole `body` at hand (at most one frame's bytes), the head, the
   * body and the end go in one frame and the upload has ended; without, the head goes alone and
   * the body follows through the exchange's upload. Throws {@linkcode TunnelError} when the
   * connection is gone (nothing reached the node).
   */
  begin(
    requestId: string,
    headers: HeaderEntry[],
    contentLength: number | null,
    body: Uint8Array | null = null,
  ): TunnelExchange {
    if (this.#closed) throw new TunnelError("tunnel_disconnected", "slot closed");
    if (this.#exchange) throw new Error("slot already carries a request");
    const exchange = new _Exchange(
      requestId,
      headers,
      contentLength,
      (data) => this.#send(data),
      (x) => this.#progress(x),
      (reason) => this.cancel(requestId, reason),
    );
    this.#exchange = exchange;
    if (body) exchange.upload.sendComplete(body);
    else exchange.upload.sendHead();
    return exchange;
  }

  /** One WebSocket message from the node. */
  receive(data: unknown): void {
    if (this.#closed) return;
    try {
      const exchange = this.#exchange;
      if (data instanceof ArrayBuffer) {
        const frame = decodeResponseFrame(new Uint8Array(data));
        if (!exchange) throw new LinkMessageError("a frame on an idle slot");
        exchange.onFrame(frame);
        if (frame.end) this.#progress(exchange);
      } else if (typeof data === "string") {
        if (!exchange) throw new LinkMessageError(`'${parseSlotMessage(data).t}' on an idle slot`);
        exchange.onMessage(data);
      } else {
        throw new LinkMessageError("unexpected message type");
      }
    } catch (error) {
      if (!(error instanceof LinkMessageError)) throw error;
      this.#fail(new TunnelError("invalid_response", error.message));
      this.close("cancelled", "invalid_response");
    }
  }

  /** The exchange moved on: a finished one leaves the slot free. */
  #progress(exchange: _Exchange): void {
    if (this.#exchange === exchange && exchange.upload.ended && exchange.nodeEnded) {
      this.#exchange = null;
    }
  }

  /** Sends `cancel` for the request (if the socket takes it) and closes the connection. */
  cancel(requestId: string, reason: CancelReason): void {
    if (this.#closed) return;
    this.#send(encodeMessage({ t: "cancel", request_id: requestId, reason }));
    this.close("cancelled", reason);
  }

  /** Closes the connection (idempotent); a request on it fails with `tunnel_disconnected`. */
  close(code: LinkCloseName, reason: string): void {
    if (this.#closed) return;
    closeLink(this.#socket, code, reason);
    this.closedBySocket(reason);
  }

  /** The socket ended (its `close` event, or {@linkcode RouterSlot.close}). */
  closedBySocket(reason: string): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#fail(new TunnelError("tunnel_disconnected", reason));
    this.#onClosed(this, reason);
  }

  #fail(error: TunnelError): void {
    const exchange = this.#exchange;
    this.#exchange = null;
    exchange?.fail(error);
  }

  #send(data: string | Uint8Array): void {
    if (this.#closed) return;
    try {
      this.#socket.send(data);
    } catch (error) {
      this.closedBySocket(`send failed: ${errorMessage(error)}`);
    }
  }
}

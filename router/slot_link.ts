/**
 * One node slot at the Router: the WebSocket a node's server opened for one of its workers, and
 * the request it carries (spec router §1.5, over link/messages.ts).
 *
 * ```
 *   idle ──begin(request)──▶ request_head ─▶ node
 *     upload:   data* (within credit), end ─▶ node          ◀─ credit
 *     answer:   ◀─ response_head, data* (Router grants credit as its client reads), end
 *   idle ──beginWhole(request, body)──▶ one whole frame (head, body, end) ─▶ node
 *     answer:   as above, or ◀─ one whole frame (when the node's hello offered them)
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
  decodeDataFrame,
  decodeWholeFrame,
  encodeMessage,
  encodeWholeFrame,
  type HeaderEntry,
  isWholeFrame,
  LINK_CLOSE,
  type LinkCloseName,
  LinkMessageError,
  parseSlotMessage,
  type ResponseHead,
  type SlotHello,
  type SlotMessage,
  type WholeFrame,
} from "../link/messages.ts";
import { BodyReceiver, BodySender } from "../link/body.ts";
import { releaseBuffer } from "../protocol/bytes.ts";
import type { SlotHandle } from "./connections.ts";

/** Why an exchange failed: the node's answer was out of turn, or the connection went away. */
export type TunnelFailure = "invalid_response" | "tunnel_disconnected";

/** The slot failed under a request. */
export class TunnelError extends Error {
  /** Which failure. */
  readonly reason: TunnelFailure;
  /**
   * Creates the error.
   *
   * @example
   * ```ts
   * import { TunnelError } from "./slot_link.ts";
   *
   * if (new TunnelError("tunnel_disconnected").reason !== "tunnel_disconnected") throw new Error();
   * ```
   */
  constructor(reason: TunnelFailure, detail?: string) {
    super(detail ? `${reason}: ${detail}` : reason);
    this.name = "TunnelError";
    this.reason = reason;
  }
}

/**
 * One request through a slot, the Router's side.
 *
 * @example
 * ```ts
 * import type { TunnelExchange } from "./slot_link.ts";
 *
 * async function status(exchange: TunnelExchange): Promise<number> {
 *   await exchange.upload.end();
 *   return (await exchange.head).status;
 * }
 * ```
 */
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
  /**
   * The answer's body when the node sent its answer in one whole frame (head, body and end
   * together: the answer is complete once `head` resolves), else `null`. The same bytes are in
   * {@linkcode TunnelExchange.body} too.
   */
  readonly wholeBody: Uint8Array | null;
  /** Discards the request and the slot (non-blocking). */
  cancel(reason: CancelReason): void;
}

class _Exchange implements TunnelExchange {
  readonly requestId: string;
  readonly upload: BodySender;
  readonly body: BodyReceiver;
  readonly head: Promise<ResponseHead>;
  readonly answered: Promise<void>;
  headSeen = false;
  wholeBody: Uint8Array | null = null;
  uploadEnded = false;
  nodeEnded = false;
  #resolveHead!: (head: ResponseHead) => void;
  #rejectHead!: (error: TunnelError) => void;
  #resolveAnswered!: () => void;
  #rejectAnswered!: (error: TunnelError) => void;
  readonly #cancel: (reason: CancelReason) => void;
  readonly #progress: (exchange: _Exchange) => void;

  constructor(
    requestId: string,
    send: (data: string | Uint8Array) => void,
    progress: (exchange: _Exchange) => void,
    cancel: (reason: CancelReason) => void,
  ) {
    this.#progress = progress;
    this.#cancel = cancel;
    this.requestId = requestId;
    this.upload = new BodySender(
      requestId,
      // Each frame is a new buffer that the socket's send has taken: its memory goes back
      // now rather than at a collection (protocol/bytes.ts says why).
      (frame) => (send(frame), releaseBuffer(frame)),
      () => {
        send(encodeMessage({ t: "end", request_id: requestId }));
        this.uploadEnded = true;
        this.#progress(this);
      },
    );
    this.body = new BodyReceiver((frames) =>
      send(encodeMessage({ t: "credit", request_id: requestId, frames }))
    );
    this.head = new Promise((resolve, reject) => {
      this.#resolveHead = resolve;
      this.#rejectHead = reject;
    });
    this.answered = new Promise((resolve, reject) => {
      this.#resolveAnswered = resolve;
      this.#rejectAnswered = reject;
    });
    // Whoever does not wait for these still must not see an unhandled rejection.
    this.head.catch(() => {});
    this.answered.catch(() => {});
  }

  cancel(reason: CancelReason): void {
    this.#cancel(reason);
  }

  onMessage(message: SlotMessage): void {
    if (!("request_id" in message) || message.request_id !== this.requestId) {
      throw new LinkMessageError(`'${message.t}' out of turn`);
    }
    switch (message.t) {
      case "credit":
        this.upload.credit(message.frames);
        return;
      case "response_head":
        if (this.headSeen) throw new LinkMessageError("a second response_head");
        this.headSeen = true;
        this.#resolveHead(message);
        return;
      case "end":
        if (!this.headSeen) throw new LinkMessageError("end before response_head");
        this.body.end();
        this.nodeEnded = true;
        this.#resolveAnswered();
        return;
      default:
        throw new LinkMessageError(`'${message.t}' from a node`);
    }
  }

  /** A whole frame from the node: its response head, its body (if any) and its end. */
  onWhole(whole: WholeFrame): void {
    if (whole.head.t !== "response_head") throw new LinkMessageError("'request_head' from a node");
    // Set before the head's promise settles: whoever awaits it finds the answer complete.
    if (!this.headSeen) this.wholeBody = whole.bytes;
    this.onMessage(whole.head);
    if (whole.bytes.length > 0) this.onData(whole.head.request_id, whole.bytes);
    this.onMessage({ t: "end", request_id: whole.head.request_id });
  }

  onData(requestId: string, bytes: Uint8Array): void {
    if (requestId !== this.requestId) throw new LinkMessageError("data for another request");
    if (!this.headSeen) throw new LinkMessageError("data before response_head");
    this.body.push(bytes);
  }

  fail(error: TunnelError): void {
    this.upload.fail(error);
    this.body.fail(error);
    this.#rejectHead(error);
    if (!this.nodeEnded) this.#rejectAnswered(error);
  }
}

/**
 * A registered slot's connection; the hub hands it every message after `hello`.
 *
 * @example
 * ```ts
 * import { RouterSlot } from "./slot_link.ts";
 *
 * function free(slot: RouterSlot): boolean {
 *   return !slot.isClosed && !slot.busy;
 * }
 * ```
 */
export class RouterSlot implements SlotHandle {
  /** Unique per connection. */
  readonly connectionId: string = crypto.randomUUID();
  /** The slot id of the hello. */
  readonly slotId: string;
  /** The node. */
  readonly nodeId: string;
  /** The node's server instance the slot belongs to. */
  readonly serverInstanceId: string;
  readonly #socket: WebSocket;
  /** The node's hello offered whole frames (the Router's ack accepts them). */
  readonly takesWhole: boolean;
  readonly #onClosed: (slot: RouterSlot, reason: string) => void;
  #exchange: _Exchange | null = null;
  #closed = false;

  /**
   * Wraps an open `socket` whose `hello` was accepted; `onClosed` runs once when it ends.
   *
   * @example
   * ```ts
   * import { RouterSlot } from "./slot_link.ts";
   *
   * const make = (socket: WebSocket) =>
   *   new RouterSlot(socket, {
   *     t: "hello", node_id: "gpu-a", server_instance_id: "i1", slot_id: "s1", protocol_version: 1,
   *   }, () => {});
   * ```
   */
  constructor(
    socket: WebSocket,
    hello: SlotHello,
    onClosed: (slot: RouterSlot, reason: string) => void,
  ) {
    this.#socket = socket;
    this.slotId = hello.slot_id;
    this.nodeId = hello.node_id;
    this.serverInstanceId = hello.server_instance_id;
    this.takesWhole = hello.whole === true;
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
   * Starts a request: sends its head. Throws {@linkcode TunnelError} when the connection is gone.
   *
   * @example
   * ```ts
   * import type { RouterSlot } from "./slot_link.ts";
   *
   * function start(slot: RouterSlot) {
   *   return slot.begin(crypto.randomUUID(), [["content-type", "multipart/form-data"]], 0);
   * }
   * ```
   */
  begin(requestId: string, headers: HeaderEntry[], contentLength: number | null): TunnelExchange {
    const exchange = this.#start(requestId);
    this.#send(
      encodeMessage({
        t: "request_head",
        request_id: requestId,
        headers,
        content_length: contentLength,
      }),
    );
    return exchange;
  }

  /**
   * Starts a request whose whole body is at hand (at most one data frame) on a slot that
   * {@linkcode RouterSlot.takesWhole}: head, body and end go in one whole frame, and the
   * exchange's upload has ended. `null`, with nothing sent, when the frame would be longer than
   * a node takes in one message (`MAX_TEXT_BYTES`: a head of huge headers); the
   * request then goes as head, data and end. Throws {@linkcode TunnelError} when the connection
   * is gone.
   *
   * @example
   * ```ts
   * import type { RouterSlot } from "./slot_link.ts";
   *
   * function start(slot: RouterSlot, body: Uint8Array) {
   *   const id = crypto.randomUUID();
   *   return (slot.takesWhole ? slot.beginWhole(id, [], body.length, body) : null) ??
   *     slot.begin(id, [], body.length);
   * }
   * ```
   */
  beginWhole(
    requestId: string,
    headers: HeaderEntry[],
    contentLength: number | null,
    body: Uint8Array,
  ): TunnelExchange | null {
    if (!this.takesWhole) throw new Error("the node did not offer whole frames");
    const head = { t: "request_head" as const, request_id: requestId, headers };
    const frame = encodeWholeFrame({ ...head, content_length: contentLength }, body);
    if (!frame) return null;
    const exchange = this.#start(requestId);
    this.#send(frame);
    exchange.upload.sentWhole(body.length);
    exchange.uploadEnded = true;
    return exchange;
  }

  #start(requestId: string): _Exchange {
    if (this.#closed) throw new TunnelError("tunnel_disconnected", "slot closed");
    if (this.#exchange) throw new Error("slot already carries a request");
    const exchange = new _Exchange(
      requestId,
      (data) => this.#send(data),
      (x) => this.#progress(x),
      (reason) => this.cancel(requestId, reason),
    );
    this.#exchange = exchange;
    return exchange;
  }

  /**
   * One WebSocket message from the node.
   *
   * @example
   * ```ts
   * import type { RouterSlot } from "./slot_link.ts";
   *
   * function attach(socket: WebSocket, slot: RouterSlot) {
   *   socket.onmessage = (event) => slot.receive(event.data);
   * }
   * ```
   */
  receive(data: unknown): void {
    if (this.#closed) return;
    try {
      const exchange = this.#exchange;
      if (typeof data === "string") {
        const message = parseSlotMessage(data);
        if (!exchange) throw new LinkMessageError(`'${message.t}' on an idle slot`);
        exchange.onMessage(message);
        this.#progress(exchange);
      } else if (data instanceof ArrayBuffer) {
        const bytes = new Uint8Array(data);
        if (isWholeFrame(bytes)) {
          if (!this.takesWhole) throw new LinkMessageError("a whole frame its hello did not offer");
          const whole = decodeWholeFrame(bytes);
          if (!exchange) throw new LinkMessageError("a whole frame on an idle slot");
          exchange.onWhole(whole);
          this.#progress(exchange);
          return;
        }
        const frame = decodeDataFrame(bytes);
        if (!exchange) throw new LinkMessageError("data on an idle slot");
        exchange.onData(frame.requestId, frame.bytes);
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
    if (this.#exchange === exchange && exchange.uploadEnded && exchange.nodeEnded) {
      this.#exchange = null;
    }
  }

  /**
   * Sends `cancel` for the request (if the socket takes it) and closes the connection with the
   * reason; never waits.
   *
   * @example
   * ```ts
   * import type { RouterSlot } from "./slot_link.ts";
   *
   * function drop(slot: RouterSlot, requestId: string) {
   *   slot.cancel(requestId, "client_disconnected");
   * }
   * ```
   */
  cancel(requestId: string, reason: CancelReason): void {
    if (this.#closed) return;
    this.#send(encodeMessage({ t: "cancel", request_id: requestId, reason }));
    this.close("cancelled", reason);
  }

  /**
   * Closes the connection with a node-link close code and reason; idempotent. A request on it
   * fails with `tunnel_disconnected`.
   *
   * @example
   * ```ts
   * import type { RouterSlot } from "./slot_link.ts";
   *
   * function retire(slot: RouterSlot) {
   *   slot.close("unavailable", "KCoral Server instance changed");
   * }
   * ```
   */
  close(code: LinkCloseName, reason: string): void {
    if (this.#closed) return;
    try {
      this.#socket.close(LINK_CLOSE[code], reason.slice(0, 120));
    } catch {
      // already closing
    }
    this.closedBySocket(reason);
  }

  /**
   * The socket ended (its `close` event, or {@linkcode RouterSlot.close}).
   *
   * @example
   * ```ts
   * import type { RouterSlot } from "./slot_link.ts";
   *
   * function watch(socket: WebSocket, slot: RouterSlot) {
   *   socket.onclose = (event) => slot.closedBySocket(event.reason || "connection closed");
   * }
   * ```
   */
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
      this.#socket.send(data as string);
    } catch (error) {
      this.closedBySocket(`send failed: ${error instanceof Error ? error.message : error}`);
    }
  }
}

/**
 * A node's slot links (spec router §1.5, over link/frames.ts and link/messages.ts): one outbound
 * WebSocket per worker slot of the node's server; the requests the Router tunnels through them
 * go into the server's own `/execute` pipeline in-process (node/tunnelled_request.ts), and the
 * answers go back the same way. The node never accepts a connection.
 *
 * ```
 *  connect ─▶ hello ─▶ ack
 *    ◀─ a frame with a request head (and a small body and its end, or the first bytes):
 *       the request into the pipeline; later frames feed its body
 *    ─▶ frames: the response head, bytes (within the Router's credit), the end
 *       (an answer of one frame: head, body and end together)
 *    both ends passed ─▶ idle
 *    ◀─ cancel: the request aborted; reconnect at once
 *  connection lost or refused ─▶ reconnect after 1 s, doubling to 30 s, ±20 % jitter (the
 *  backoff starts over only after an acknowledged attempt; link/backoff.ts)
 *  stop: idle slots close at once; a busy one finishes its answer, then closes
 * ```
 *
 * @module
 */
import type { EventLog } from "../http/events.ts";
import { Backoff, sleepUnlessAborted, withJitter } from "../link/backoff.ts";
import { decodeRequestFrame, MAX_FRAME_BYTES } from "../link/frames.ts";
import {
  bearer,
  encodeMessage,
  LinkMessageError,
  parseSlotMessage,
  PROTOCOL_VERSION,
  type RequestHead,
  SLOT_PATH,
} from "../link/messages.ts";
import { WebSocketClient } from "../link/websocket_client.ts";
import type { WholeBodyRequest } from "../server/execute/intake.ts";
import { TunnelledRequest } from "./tunnelled_request.ts";
import { errorMessage } from "../protocol/errors.ts";

/** Where a node's server links to: the routing settings its supervisor hands it. */
export interface NodeLinkTarget {
  /** The Router's HTTP(S) origin. */
  routerEndpoint: string;
  /** This node's id. */
  nodeId: string;
  /** The node token, or `null`. */
  nodeToken: string | null;
  /** Extra trusted certificate authorities (PEM) for a `wss://` Router. */
  caCerts?: readonly string[];
}

/** How a node links to its Router: where, and what its slots carry requests to. */
export interface NodeLinkOptions extends NodeLinkTarget {
  /** The server's `instance_id`. */
  serverInstanceId: string;
  /** How many slots (the server's workers). */
  slots: number;
  /** Runs one tunnelled `/execute` request (the server's pipeline). */
  execute: (request: Request | WholeBodyRequest, client: string) => Promise<Response>;
  /** Where link events go. */
  events: EventLog;
  /** First reconnect delay in ms (default 1000); it doubles up to `reconnectMaxMs`. */
  reconnectMinMs?: number;
  /** Largest reconnect delay in ms before jitter (default 30000). */
  reconnectMaxMs?: number;
  /** How long to wait for the connection and the ack, in ms (default 10000). */
  connectTimeoutMs?: number;
}

/** The node's slots, connected and reconnected until {@linkcode NodeLink.stop}. */
export class NodeLink {
  readonly #options: NodeLinkOptions;
  readonly #slots: _Slot[] = [];

  /** Creates the link; nothing connects before {@linkcode NodeLink.start}. */
  constructor(options: NodeLinkOptions) {
    this.#options = options;
  }

  /** Slots whose hello the Router acknowledged and that are still connected. */
  get connectedSlots(): number {
    return this.#slots.filter((slot) => slot.acked).length;
  }

  /** Opens every slot. */
  start(): void {
    for (let i = 0; i < this.#options.slots; i++) {
      const slot = new _Slot(this.#options);
      this.#slots.push(slot);
      slot.run();
    }
  }

  /** Stops: idle slots close now, busy ones after their answer; resolves when all are closed. */
  async stop(): Promise<void> {
    await Promise.all(this.#slots.map((slot) => slot.stop()));
  }
}

/** How one connection attempt ended. */
interface _Attempt {
  /** The Router acknowledged the hello. */
  acked: boolean;
  /** Ended by a cancel the node expects (reconnect at once). */
  expected: boolean;
}

class _Slot {
  readonly #o: NodeLinkOptions;
  readonly #stop = new AbortController();
  #socket: WebSocketClient | null = null;
  #request: TunnelledRequest | null = null;
  #done: Promise<void> = Promise.resolve();
  readonly #scheme: "http" | "https";
  acked = false;

  constructor(options: NodeLinkOptions) {
    this.#o = options;
    this.#scheme = new URL(options.routerEndpoint).protocol === "https:" ? "https" : "http";
  }

  run(): void {
    this.#done = this.#loop();
  }

  async stop(): Promise<void> {
    this.#stop.abort();
    if (!this.#request) this.#close(1000, "node stopping");
    await this.#done;
  }

  async #loop(): Promise<void> {
    const backoff = new Backoff(this.#o.reconnectMinMs ?? 1000, this.#o.reconnectMaxMs ?? 30_000);
    while (!this.#stop.signal.aborted) {
      const attempt = await this.#connectOnce();
      if (this.#stop.signal.aborted) break;
      if (attempt.acked) backoff.reset();
      if (attempt.expected) continue;
      await sleepUnlessAborted(withJitter(backoff.next(), 0.2), this.#stop.signal);
    }
  }

  #connectOnce(): Promise<_Attempt> {
    const o = this.#o;
    const url = new URL(SLOT_PATH, o.routerEndpoint);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const headers: Record<string, string> = {};
    if (o.nodeToken !== null) headers.authorization = bearer(o.nodeToken);
    const attempt: _Attempt = { acked: false, expected: false };
    return new Promise<_Attempt>((resolve) => {
      let socket: WebSocketClient;
      try {
        // The token goes in a header, never into the URL; not the platform's WebSocket
        // (link/websocket_client.ts says why).
        socket = new WebSocketClient(url, {
          headers,
          maxMessageBytes: MAX_FRAME_BYTES,
          caCerts: o.caCerts ?? [],
        });
      } catch {
        resolve(attempt);
        return;
      }
      this.#socket = socket;
      const timer = setTimeout(
        () => this.#close(4004, "no ack in time"),
        o.connectTimeoutMs ?? 10_000,
      );
      socket.onopen = () => {
        socket.send(encodeMessage({
          t: "hello",
          node_id: o.nodeId,
          server_instance_id: o.serverInstanceId,
          slot_id: crypto.randomUUID(),
          protocol_version: PROTOCOL_VERSION,
        }));
      };
      socket.onmessage = (event) => {
        try {
          if (!this.acked) {
            const first = typeof event.data === "string" ? parseSlotMessage(event.data) : null;
            if (first?.t !== "ack") throw new LinkMessageError("the Router's first message is ack");
            this.acked = attempt.acked = true;
            clearTimeout(timer);
            if (this.#stop.signal.aborted) this.#close(1000, "node stopping");
            return;
          }
          this.#onMessage(event.data, attempt);
        } catch (error) {
          if (!(error instanceof LinkMessageError)) throw error;
          o.events.emit("WARNING", "tunnel_protocol_error", { error: error.message });
          this.#close(4003, error.message.slice(0, 120));
        }
      };
      socket.onerror = () => {};
      socket.onclose = (event) => {
        clearTimeout(timer);
        this.acked = false;
        this.#socket = null;
        const request = this.#request;
        if (request && !request.done) {
          // The Router discarded the slot (its cancel frame may not have come first).
          if (event.code === 4010) attempt.expected = true;
          this.#abort(request, event.reason || "tunnel_disconnected");
        }
        resolve(attempt);
      };
    });
  }

  #onMessage(data: unknown, attempt: _Attempt): void {
    if (data instanceof ArrayBuffer) {
      const frame = decodeRequestFrame(new Uint8Array(data));
      let request = this.#request;
      if (frame.head) {
        request = this.#requestHead(frame.requestId, frame.head);
        if (!request) return;
      } else if (!request || frame.requestId !== request.id) {
        throw new LinkMessageError("a frame for another request");
      }
      request.body.receive(frame.bytes, frame.end);
      if (frame.end) this.#settle(request);
      return;
    }
    if (typeof data !== "string") throw new LinkMessageError("unexpected message type");
    const message = parseSlotMessage(data);
    const request = this.#request;
    if (message.t !== "credit" && message.t !== "cancel") {
      throw new LinkMessageError(`'${message.t}' from the Router`);
    }
    if (!request || message.request_id !== request.id) {
      throw new LinkMessageError(`${message.t} for another request`);
    }
    if (message.t === "credit") {
      request.credit(message.frames);
      return;
    }
    attempt.expected = true;
    this.#o.events.emit("INFO", "tunnel_request_cancelled", {
      request_id: request.id,
      reason: message.reason,
    });
    this.#abort(request, message.reason);
    this.#close(1000, "cancelled");
  }

  /** A request begins with its head; `null` when the node is stopping (the slot closes). */
  #requestHead(id: string, head: RequestHead): TunnelledRequest | null {
    const previous = this.#request;
    if (previous && !previous.body.ended) {
      throw new LinkMessageError("a request head before the previous body ended");
    }
    if (this.#stop.signal.aborted) {
      this.#close(1001, "node stopping"); // the request has not reached the pipeline
      return null;
    }
    const request = new TunnelledRequest(id, this.#socket);
    this.#request = request;
    const input = request.input(head, this.#scheme);
    request.task = (async () => {
      await previous?.task;
      let response: Response;
      try {
        response = await this.#o.execute(input, "outbound-tunnel");
      } catch (error) {
        this.#o.events.emit("ERROR", "tunnel_request_failed", {
          request_id: request.id,
          error: errorMessage(error),
        });
        this.#close(1011, "request failed");
        return;
      }
      if (await request.answer(response)) this.#settle(request);
      // An answer that failed while the slot stayed: the connection ends, the Router answers 502.
      else if (this.#request === request) this.#close(1011, "answer failed");
    })();
    return request;
  }

  /** Both ends passed: the slot is idle again (or closes, when stopping). */
  #settle(request: TunnelledRequest): void {
    if (!request.done || this.#request !== request) return;
    this.#request = null;
    if (this.#stop.signal.aborted) this.#close(1000, "node stopping");
  }

  #abort(request: TunnelledRequest, reason: string): void {
    if (this.#request === request) this.#request = null;
    request.fail(reason);
  }

  #close(code: number, reason: string): void {
    try {
      this.#socket?.close(code, reason);
    } catch {
      // already closed
    }
  }
}

/**
 * A server's link to a Router (spec router §1.5, over link/messages.ts): one outbound
 * WebSocket per worker slot; the requests the Router tunnels through them go into this server's
 * own `/execute` pipeline in-process ({@linkcode App.execute}), and the answers go back the same
 * way. The node never accepts a connection.
 *
 * ```
 *  connect ─▶ hello (whole: true) ─▶ ack (whole: true from a Router that takes whole frames)
 *    ◀─ request_head ─▶ app.execute: a body that fits one data frame (by its Content-Length)
 *       taken whole as its frames come (no Request, no stream); any other, a Request whose
 *       body stream is fed by data frames
 *    ◀─ or one whole frame (head, body, end) ─▶ the same, its body already whole
 *    ─▶ response_head, data* (within the Router's credit), end; an answer of one frame to a
 *       Router that takes whole frames: one whole frame
 *    both ends passed ─▶ idle
 *    ◀─ cancel: the request aborted; reconnect at once
 *  connection lost or refused ─▶ reconnect after 1 s, doubling to 30 s, ±20 % jitter (the
 *  backoff starts over only after an acknowledged attempt)
 *  stop: idle slots close at once; a busy one finishes its answer, then closes
 * ```
 *
 * @module
 */
import {
  bearer,
  decodeDataFrame,
  decodeWholeFrame,
  encodeMessage,
  encodeWholeFrame,
  type HeaderEntry,
  isWholeFrame,
  LinkMessageError,
  MAX_DATA_BYTES,
  MAX_TEXT_BYTES,
  parseSlotMessage,
  PROTOCOL_VERSION,
  type RequestHead,
  type ResponseHead,
  SLOT_PATH,
} from "../link/messages.ts";
import type { EventLog } from "../http/events.ts";
import type { App } from "../server/app.ts";
import type { WholeBodyRequest } from "../server/execute/intake.ts";
import { BodyReceiver, BodySender, DATA_HEADER_BYTES } from "../link/body.ts";
import { releaseBuffer } from "../protocol/bytes.ts";
import { isLiveOutput } from "../protocol/live_output.ts";
import { WebSocketClient } from "../link/websocket_client.ts";
import { readCaFile } from "../http/access_options.ts";

/** How a node links to its Router. */
export interface NodeLinkOptions {
  /** The Router's HTTP(S) origin. */
  routerEndpoint: string;
  /** This node's id. */
  nodeId: string;
  /** The node token, or `null`. */
  nodeToken: string | null;
  /** Extra trusted certificate authorities (PEM) for a `wss://` Router. */
  caCerts?: readonly string[];
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

/**
 * The node's slots, connected and reconnected until {@linkcode NodeLink.stop}.
 *
 * @example
 * ```ts
 * import { NodeLink } from "./slot_links.ts";
 * import { EventLog } from "../http/events.ts";
 *
 * const link = new NodeLink({
 *   routerEndpoint: "http://127.0.0.1:1", // nothing listens: the slots keep retrying
 *   nodeId: "gpu-a", nodeToken: null, serverInstanceId: crypto.randomUUID(), slots: 1,
 *   execute: () => Promise.resolve(new Response("unused")),
 *   events: new EventLog({ logDir: null, console: false, programs: false }),
 * });
 * link.start();
 * await link.stop();
 * ```
 */
export class NodeLink {
  readonly #options: NodeLinkOptions;
  readonly #slots: _Slot[] = [];

  /**
   * Creates the link; nothing connects before {@linkcode NodeLink.start}.
   *
   * @example
   * ```ts
   * import { NodeLink } from "./slot_links.ts";
   * import { EventLog } from "../http/events.ts";
   *
   * const link = new NodeLink({
   *   routerEndpoint: "http://127.0.0.1:9000", nodeId: "gpu-a", nodeToken: null,
   *   serverInstanceId: crypto.randomUUID(), slots: 2,
   *   execute: () => Promise.resolve(new Response("unused")),
   *   events: new EventLog({ logDir: null, console: false, programs: false }),
   * });
   * if (link.connectedSlots !== 0) throw new Error();
   * ```
   */
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

/**
 * One request on a slot, the node's side. Everything it sends goes to the connection it came on:
 * an answer that ends after that connection was cancelled or lost is dropped, never sent on the
 * slot's next connection (where the Router would take it for a violation).
 */
class _Request {
  readonly id: string;
  readonly body: BodyReceiver;
  readonly response: BodySender;
  readonly abort = new AbortController();
  readonly #socket: WebSocketClient | null;
  task: Promise<void> = Promise.resolve();
  answered = false;

  constructor(id: string, socket: WebSocketClient | null) {
    this.id = id;
    this.#socket = socket;
    this.body = new BodyReceiver((frames) =>
      this.send(encodeMessage({ t: "credit", request_id: id, frames }))
    );
    this.response = new BodySender(
      id,
      // The slot's client copies the frame into its own masked one at `send`: the frame's
      // memory goes back at once instead of at a collection (protocol/bytes.ts).
      (frame) => (this.send(frame), releaseBuffer(frame)),
      () => this.send(encodeMessage({ t: "end", request_id: id })),
      // Full frames of a large answer's chunks are masked from the chunk itself.
      (parts) => this.#socket?.sendParts(parts),
    );
  }

  /** Sends on this request's connection (nothing once it has closed). */
  send(data: string | Uint8Array): void {
    try {
      this.#socket?.send(data as string);
    } catch {
      // closing: the close event ends the request
    }
  }

  get done(): boolean {
    return this.answered && this.body.ended;
  }
}

class _Slot {
  readonly #o: NodeLinkOptions;
  #stopping = false;
  #socket: WebSocketClient | null = null;
  #request: _Request | null = null;
  #wake: (() => void) | null = null;
  #done: Promise<void> = Promise.resolve();
  #scheme: string | null = null;
  /** The Router's ack took whole frames (this connection's). */
  #whole = false;
  acked = false;

  constructor(options: NodeLinkOptions) {
    this.#o = options;
  }

  run(): void {
    this.#done = this.#loop();
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    this.#wake?.();
    if (!this.#request) this.#close(1000, "node stopping");
    await this.#done;
  }

  async #loop(): Promise<void> {
    const min = this.#o.reconnectMinMs ?? 1000;
    const max = this.#o.reconnectMaxMs ?? 30_000;
    let delay = min;
    while (!this.#stopping) {
      const attempt = await this.#connectOnce();
      if (this.#stopping) break;
      if (attempt.acked) delay = min;
      if (attempt.expected) continue;
      const wait = delay * (0.8 + 0.4 * Math.random());
      delay = Math.min(delay * 2, max);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, wait);
        this.#wake = () => (clearTimeout(timer), resolve());
      });
      this.#wake = null;
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
        // The token goes in a request header, never into the URL. Not the platform's
        // WebSocket: it keeps Nagle's algorithm on (link/websocket_client.ts says why).
        socket = new WebSocketClient(url, {
          headers,
          maxMessageBytes: MAX_TEXT_BYTES,
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
          whole: true,
        }));
      };
      socket.onmessage = (event) => {
        try {
          if (!this.acked) {
            const first = typeof event.data === "string" ? parseSlotMessage(event.data) : null;
            if (first?.t !== "ack") throw new LinkMessageError("the Router's first message is ack");
            this.#whole = first.whole === true;
            this.acked = attempt.acked = true;
            clearTimeout(timer);
            if (this.#stopping) this.#close(1000, "node stopping");
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
        this.#whole = false;
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
    const binary = data instanceof ArrayBuffer ? new Uint8Array(data) : null;
    if (binary && isWholeFrame(binary)) {
      if (!this.#whole) throw new LinkMessageError("a whole frame the ack did not take");
      const { head, bytes } = decodeWholeFrame(binary);
      if (head.t !== "request_head") throw new LinkMessageError("'response_head' from the Router");
      if (!this.#requestHead(head)) return;
      const request = this.#request!;
      if (bytes.length > 0) request.body.push(bytes);
      request.body.end();
      this.#settle(request);
      return;
    }
    if (binary) {
      const frame = decodeDataFrame(binary);
      const request = this.#request;
      if (!request || frame.requestId !== request.id) {
        throw new LinkMessageError("data for another request");
      }
      request.body.push(frame.bytes);
      return;
    }
    if (typeof data !== "string") throw new LinkMessageError("unexpected message type");
    const message = parseSlotMessage(data);
    const request = this.#request;
    switch (message.t) {
      case "request_head":
        this.#requestHead(message);
        return;
      case "end":
        if (!request || message.request_id !== request.id) {
          throw new LinkMessageError("end for another request");
        }
        request.body.end();
        this.#settle(request);
        return;
      case "credit":
        if (!request || message.request_id !== request.id) {
          throw new LinkMessageError("credit for another request");
        }
        request.response.credit(message.frames);
        return;
      case "cancel":
        if (!request || message.request_id !== request.id) {
          throw new LinkMessageError("cancel for another request");
        }
        attempt.expected = true;
        this.#o.events.emit("INFO", "tunnel_request_cancelled", {
          request_id: request.id,
          reason: message.reason,
        });
        this.#abort(request, message.reason);
        this.#close(1000, "cancelled");
        return;
      default:
        throw new LinkMessageError(`'${message.t}' from the Router`);
    }
  }

  /** A request begins (its head alone or in a whole frame); `false` when the node is stopping. */
  #requestHead(head: RequestHead): boolean {
    const previous = this.#request;
    if (previous && !previous.body.ended) {
      throw new LinkMessageError("request_head before the previous body ended");
    }
    if (this.#stopping) {
      // Closing began: the slot goes away without the request (the Router answers 502 only if
      // it had begun; it has not reached the pipeline).
      this.#close(1001, "node stopping");
      return false;
    }
    this.#begin(head, previous);
    return true;
  }

  #begin(head: RequestHead, previous: _Request | null): void {
    const request = new _Request(head.request_id, this.#socket);
    this.#request = request;
    const headers = new Headers();
    for (const [name, value] of head.headers) headers.append(name, value);
    const declared = headers.get("content-length");
    // A body that fits one data frame goes in whole, as its frames come: no Request and no
    // stream to read (decisions.md, "A node takes a small tunnelled body whole"). Past its
    // Content-Length it is cut off where the pipeline's stream reader would cut it off.
    const input: Request | WholeBodyRequest =
      declared !== null && /^\d+$/.test(declared) && Number(declared) <= MAX_DATA_BYTES
        ? {
          headers,
          bytes: () => request.body.whole(Number(declared)),
          discard: () => request.body.discard(),
          signal: request.abort.signal,
        }
        : this.#streamed(headers, request);
    request.task = (async () => {
      await previous?.task;
      let response: Response;
      try {
        response = await this.#o.execute(input, "outbound-tunnel");
      } catch (error) {
        this.#o.events.emit("ERROR", "tunnel_request_failed", {
          request_id: request.id,
          error: error instanceof Error ? error.message : String(error),
        });
        this.#close(1011, "request failed");
        return;
      }
      await this.#answer(request, response);
    })();
  }

  /** A `Request` whose body stream is fed by the request's data frames. */
  #streamed(headers: Headers, request: _Request): Request {
    if (!headers.has("host")) headers.set("host", "kcoral-tunnel");
    this.#scheme ??= new URL(this.#o.routerEndpoint).protocol === "https:" ? "https" : "http";
    const init: RequestInit & { duplex: "half" } = {
      method: "POST",
      headers,
      body: request.body.stream,
      signal: request.abort.signal,
      duplex: "half",
    };
    return new Request(`${this.#scheme}://kcoral-tunnel/execute`, init);
  }

  async #answer(request: _Request, response: Response): Promise<void> {
    // Each `set-cookie` apart; `forEach` rather than Deno's slower `Headers` iterator
    // (router/headers.ts).
    const headers: HeaderEntry[] = [];
    let contentType: string | null = null;
    let contentLength = NaN;
    response.headers.forEach((value, name) => {
      headers.push([name, value]);
      if (name === "content-type") contentType = value;
      else if (name === "content-length") contentLength = Number(value);
    });
    const head: ResponseHead = {
      t: "response_head",
      request_id: request.id,
      status: response.status,
      headers,
    };
    try {
      const live = isLiveOutput(contentType);
      const declared = contentLength;
      if (!live && declared <= MAX_DATA_BYTES) {
        // An answer of one frame (the pipeline's answers declare their length): read whole
        // (`body` is not touched: it would turn the bytes into a stream) and sent with its head
        // and end in one whole frame, or in a data frame of its size with no stage to grow;
        // more than declared goes out as any body does.
        const bytes = await response.bytes();
        const whole = this.#whole && bytes.length <= MAX_DATA_BYTES
          ? encodeWholeFrame(head, bytes)
          : null;
        if (whole) {
          request.response.sentWhole(bytes.length); // throws once the slot failed
          request.send(whole);
        } else {
          request.send(encodeMessage(head));
          if (bytes.length > MAX_DATA_BYTES) await request.response.write(bytes);
          else if (bytes.length > 0) {
            const frame = request.response.newFrame(bytes.length);
            frame.set(bytes, DATA_HEADER_BYTES);
            await request.response.sendFilled(frame, bytes.length);
          }
        }
      } else {
        request.send(encodeMessage(head));
        // A live-output answer's pieces go out as they come (others fill whole frames).
        for await (const chunk of response.body ?? []) {
          await request.response.write(chunk);
          if (live) await request.response.flush();
        }
      }
      await request.response.end();
    } catch {
      // The slot went away mid-answer (cancel or lost connection): the body stream is dropped.
      // An answer that failed otherwise ends the connection, so the Router answers 502.
      await response.body?.cancel().catch(() => {});
      if (this.#request === request) this.#close(1011, "answer failed");
      return;
    }
    request.answered = true;
    this.#settle(request);
  }

  /** Both ends passed: the slot is idle again (or closes, when stopping). */
  #settle(request: _Request): void {
    if (!request.done || this.#request !== request) return;
    this.#request = null;
    if (this.#stopping) this.#close(1000, "node stopping");
  }

  #abort(request: _Request, reason: string): void {
    if (this.#request === request) this.#request = null;
    const error = new Error(`tunnel: ${reason}`);
    request.body.fail(error);
    request.response.fail(error);
    request.abort.abort(error);
  }

  #close(code: number, reason: string): void {
    try {
      this.#socket?.close(code, reason);
    } catch {
      // already closed
    }
  }
}

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

/**
 * The routing settings a supervisor passes its server in the environment (spec router §1.6):
 * `KCORAL_NODE_SERVER=1` with `KCORAL_ROUTER_ENDPOINT`, `KCORAL_NODE_ID` and, when set,
 * `KCORAL_NODE_TOKEN` and `KCORAL_CA_FILE` (read here: an unreadable file is an `Error` naming
 * it); `null` when this process is not a node's server.
 *
 * @example
 * ```ts
 * import { nodeLinkTargetFromEnv } from "./slot_links.ts";
 *
 * const target = nodeLinkTargetFromEnv({
 *   KCORAL_NODE_SERVER: "1", KCORAL_ROUTER_ENDPOINT: "http://r:9000", KCORAL_NODE_ID: "gpu-a",
 * });
 * if (target?.nodeId !== "gpu-a" || target.nodeToken !== null) throw new Error();
 * if (nodeLinkTargetFromEnv({}) !== null) throw new Error();
 * ```
 */
export function nodeLinkTargetFromEnv(
  env: Record<string, string | undefined>,
): NodeLinkTarget | null {
  if (env.KCORAL_NODE_SERVER !== "1") return null;
  const routerEndpoint = env.KCORAL_ROUTER_ENDPOINT;
  const nodeId = env.KCORAL_NODE_ID;
  if (!routerEndpoint || !nodeId) {
    throw new Error("a node's server needs KCORAL_ROUTER_ENDPOINT and KCORAL_NODE_ID");
  }
  const caFile = env.KCORAL_CA_FILE || null;
  return {
    routerEndpoint,
    nodeId,
    nodeToken: env.KCORAL_NODE_TOKEN || null,
    caCerts: caFile === null ? [] : [readCaFile(caFile)],
  };
}

/**
 * `app` linked to a Router: once started, its workers' slots connect; a stop closes the idle
 * slots at once (the Router stops sending work) while requests in flight finish.
 *
 * @example
 * ```ts
 * import { createApp } from "../server/app.ts";
 * import { withNodeLink } from "./slot_links.ts";
 *
 * const app = withNodeLink(
 *   createApp({ device: "cpu", sandbox: "none", logConsole: false, diskCacheDir: null }),
 *   { routerEndpoint: "http://127.0.0.1:1", nodeId: "cpu-a", nodeToken: null },
 * );
 * if (app.config.device !== "cpu") throw new Error();
 * ```
 */
export function withNodeLink(app: App, target: NodeLinkTarget): App {
  let link: NodeLink | null = null;
  return {
    get config() {
      return app.config;
    },
    get sandbox() {
      return app.sandbox;
    },
    events: app.events,
    fetch: (request, info) => app.fetch(request, info),
    health: () => app.health(),
    subscribe: (listener) => app.subscribe(listener),
    execute: (request, client) => app.execute(request, client),
    async start() {
      await app.start();
      const health = app.health();
      link = new NodeLink({
        ...target,
        serverInstanceId: health.instance_id,
        slots: Math.max(1, health.load.request_capacity),
        execute: (request, client) => app.execute(request, client),
        events: app.events,
      });
      link.start();
      app.events.emit("INFO", "node_link_started", {
        router: target.routerEndpoint,
        node_id: target.nodeId,
        slots: health.load.request_capacity,
      });
    },
    async shutdown() {
      await Promise.all([link?.stop(), app.shutdown()]);
    },
  };
}

/**
 * The supervisor's side of the control connection (spec router §1.4, over
 * link/messages.ts): {@linkcode NodeReport} holds what the supervisor knows about its node
 * (the last probe's result), and {@linkcode ControlLink} keeps one outbound WebSocket to the
 * Router's {@linkcode CONTROL_PATH} that carries it.
 *
 * ```
 *   connect (Authorization: Bearer <token> when set; ≤ connect timeout)
 *     └─▶ status now, then on every local change and every heartbeat (the health interval;
 *         no tick at the start), each a full snapshot with health_age_millis of send time
 *   ◀── ack (once): reconnect backoff reset, "connected outbound supervisor control stream"
 *   error / close ──▶ sleep backoff (1 s doubling to 30 s, no jitter) ──▶ connect again
 *   stop() ──▶ close, interrupt any sleep, never connect again
 * ```
 *
 * The Router never sends anything after its ack: draining a node is done locally and seen by
 * the Router as this connection closing.
 *
 * @module
 */
import {
  bearer,
  CONTROL_PATH,
  encodeMessage,
  LINK_CLOSE,
  LinkMessageError,
  type NodeStatus,
  parseControlMessage,
} from "../../link/messages.ts";
import { WebSocketClient } from "../../link/websocket_client.ts";
import { Backoff, sleepUnlessAborted } from "../../link/backoff.ts";
import type { ServerHealth } from "./probe.ts";
import { errorMessage } from "../../protocol/errors.ts";

export type { NodeStatus } from "../../link/messages.ts";
export type { ServerHealth } from "./probe.ts";

/** How long a closing connection waits for the Router's side of the closing handshake. */
const CLOSE_WAIT_MS = 2000;

/**
 * The WebSocket URL of a Router's control path: `ws://` for an `http://` endpoint, `wss://` for
 * `https://`.
 */
export function controlUrl(routerEndpoint: string): string {
  const url = new URL(CONTROL_PATH, routerEndpoint);
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new TypeError(`the Router endpoint must be http or https: ${routerEndpoint}`);
  }
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

/**
 * What the supervisor knows about its node: the last probe's result (spec router §5.2) and its
 * own identity. A failure changes only `server_healthy` and `last_error`; the instance id and
 * capacity keep their last values. Every change is passed to the `onChange` listeners (the
 * control link sends a snapshot on each).
 */
export class NodeReport {
  /** The node's name. */
  readonly nodeId: string;
  /** New for every supervisor (a UUID unless given). */
  readonly supervisorInstanceId: string;
  readonly #now: () => number;
  readonly #listeners = new Set<() => void>();
  #healthy = false;
  #health: ServerHealth = {
    instanceId: "",
    workerCount: 0,
    busyWorkers: 0,
    target: {},
    versions: {},
  };
  #lastError = "";
  #observedAt: number | null = null;

  /** A report for `nodeId`; `now` is a monotonic clock in milliseconds (`performance.now`). */
  constructor(
    nodeId: string,
    supervisorInstanceId: string = crypto.randomUUID(),
    now: () => number = () => performance.now(),
  ) {
    this.nodeId = nodeId;
    this.supervisorInstanceId = supervisorInstanceId;
    this.#now = now;
  }

  /** Whether the last probe succeeded. */
  get healthy(): boolean {
    return this.#healthy;
  }

  /** Records a successful probe, observed now. */
  recordHealthy(health: ServerHealth): void {
    this.#healthy = true;
    this.#health = {
      ...health,
      target: { ...health.target },
      versions: { ...health.versions },
    };
    this.#lastError = "";
    this.#observedAt = this.#now();
    this.#changed();
  }

  /**
   * Records that the server is not healthy, and why (a failed probe, "KCoral Server is
   * starting", "Supervisor is shutting down", a child's exit).
   */
  markUnhealthy(reason: string): void {
    this.#healthy = false;
    this.#lastError = reason;
    this.#changed();
  }

  /** Calls `listener` after every change; returns a function that removes it. */
  onChange(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /**
   * The full status to send now (`health_age_millis` computed at this moment; `null` before the
   * first successful probe).
   */
  snapshot(): NodeStatus {
    const age = this.#observedAt === null
      ? null
      : Math.max(0, Math.round(this.#now() - this.#observedAt));
    return {
      t: "status",
      node_id: this.nodeId,
      server_healthy: this.#healthy,
      supervisor_instance_id: this.supervisorInstanceId,
      server_instance_id: this.#health.instanceId,
      worker_count: this.#health.workerCount,
      busy_workers: this.#health.busyWorkers,
      target: { ...this.#health.target },
      versions: { ...this.#health.versions },
      last_error: this.#lastError,
      health_age_millis: age,
    };
  }

  #changed(): void {
    for (const listener of [...this.#listeners]) listener();
  }
}

/** How a {@linkcode ControlLink} connects. */
export interface ControlLinkOptions {
  /** The Router's HTTP(S) origin. */
  routerEndpoint: string;
  /** The shared node token, or `null` for none. */
  nodeToken: string | null;
  /** Extra trusted certificate authorities (PEM) for a `wss://` Router (`--ca-file`). */
  caCerts?: readonly string[];
  /** The status to send, computed at send time. */
  snapshot: () => NodeStatus;
  /** The heartbeat interval (the supervisor's health interval). */
  heartbeatSeconds: number;
  /** How long a connection may take to open; default 2. */
  connectTimeoutSeconds?: number;
  /** The first reconnect delay; default 1. */
  reconnectMinDelaySeconds?: number;
  /** The largest reconnect delay; default 30. */
  reconnectMaxDelaySeconds?: number;
  /** Where log lines go; default none. */
  log?: (line: string) => void;
}

/**
 * The outbound control connection, reconnecting until {@linkcode ControlLink.stop}.
 */
export class ControlLink {
  readonly #options: ControlLinkOptions;
  readonly #url: string;
  readonly #backoff: Backoff;
  readonly #stop = new AbortController();
  #socket: WebSocketClient | null = null;
  #acknowledged = false;
  #running: Promise<void> | null = null;
  #connections = 0;

  /** A link for `options` (not connected until {@linkcode ControlLink.start}). */
  constructor(options: ControlLinkOptions) {
    this.#options = options;
    this.#url = controlUrl(options.routerEndpoint);
    this.#backoff = new Backoff(
      options.reconnectMinDelaySeconds ?? 1,
      options.reconnectMaxDelaySeconds ?? 30,
    );
  }

  /** The control connection's URL. */
  get url(): string {
    return this.#url;
  }

  /** Whether the current connection has been acknowledged by the Router. */
  get acknowledged(): boolean {
    return this.#acknowledged;
  }

  /** How many connections have been attempted. */
  get connections(): number {
    return this.#connections;
  }

  /** Starts connecting (once; later calls do nothing). */
  start(): void {
    if (this.#running !== null || this.#stop.signal.aborted) return;
    this.#running = this.#run();
  }

  /**
   * Sends the current snapshot now, if connected (a local change); otherwise the next
   * connection sends it first anyway.
   */
  report(): void {
    const socket = this.#socket;
    if (socket === null || socket.readyState !== WebSocketClient.OPEN) return;
    try {
      socket.send(encodeMessage(this.#options.snapshot()));
    } catch (error) {
      this.#log(`cannot send a status: ${errorMessage(error)}`);
    }
  }

  /**
   * Closes the connection for good (interrupting a reconnect delay) and waits until it is
   * closed, or for at most 2 s of an unanswered closing handshake (the socket is then
   * abandoned).
   */
  async stop(): Promise<void> {
    this.#stop.abort();
    await this.#running;
  }

  async #run(): Promise<void> {
    while (!this.#stop.signal.aborted) {
      const reason = await this.#connect();
      if (this.#stop.signal.aborted) break;
      const delay = this.#backoff.next();
      this.#log(`control stream ended (${reason}); reconnecting in ${delay} s`);
      await sleepUnlessAborted(delay * 1000, this.#stop.signal);
    }
  }

  /** One connection, from opening to closing; resolves with why it ended. */
  #connect(): Promise<string> {
    const options = this.#options;
    this.#connections++;
    return new Promise((resolve) => {
      let socket: WebSocketClient;
      try {
        const headers: Record<string, string> = {};
        if (options.nodeToken !== null) headers.authorization = bearer(options.nodeToken);
        // Our own client, as the slot links: the platform's WebSocket cannot be given a CA.
        socket = new WebSocketClient(this.#url, { headers, caCerts: options.caCerts ?? [] });
      } catch (error) {
        resolve(`cannot connect: ${errorMessage(error)}`);
        return;
      }
      this.#socket = socket;
      let why = "";
      let heartbeat: ReturnType<typeof setInterval> | undefined;
      let abandon: ReturnType<typeof setTimeout> | undefined;
      let ended = false;
      const end = (reason: string) => {
        if (ended) return;
        ended = true;
        clearTimeout(connectTimer);
        clearInterval(heartbeat);
        clearTimeout(abandon);
        this.#stop.signal.removeEventListener("abort", onStop);
        if (this.#socket === socket) this.#socket = null;
        this.#acknowledged = false;
        socket.onopen =
          socket.onmessage =
          socket.onerror =
          socket.onclose =
            null;
        resolve(reason);
      };
      const close = (reason: string, code: number) => {
        why ||= reason;
        if (
          socket.readyState === WebSocketClient.OPEN ||
          socket.readyState === WebSocketClient.CONNECTING
        ) {
          socket.close(code, reason.slice(0, 120));
        }
        // A Router that never completes the closing handshake is not waited for.
        abandon ??= setTimeout(
          () => end(`${why}; the Router did not complete the close`),
          CLOSE_WAIT_MS,
        );
      };
      const onStop = () => close("supervisor is shutting down", 1000);
      this.#stop.signal.addEventListener("abort", onStop, { once: true });
      const connectTimeout = options.connectTimeoutSeconds ?? 2;
      const connectTimer = setTimeout(
        () => close(`no connection within ${connectTimeout} s`, 1000),
        connectTimeout * 1000,
      );
      socket.onopen = () => {
        clearTimeout(connectTimer);
        this.report();
        heartbeat = setInterval(() => this.report(), options.heartbeatSeconds * 1000);
      };
      socket.onmessage = (event) => {
        try {
          if (typeof event.data !== "string") throw new LinkMessageError("binary control message");
          const message = parseControlMessage(event.data);
          if (message.t !== "ack") throw new LinkMessageError("unexpected status from the Router");
        } catch (error) {
          close(errorMessage(error), LINK_CLOSE.invalid_argument);
          return;
        }
        if (this.#acknowledged) return;
        this.#acknowledged = true;
        this.#backoff.reset();
        this.#log("connected outbound supervisor control stream");
      };
      socket.onerror = (event) => {
        why ||= event.message || "connection error";
      };
      socket.onclose = (event) => {
        end(why || `closed by the Router: ${event.code}${event.reason ? ` ${event.reason}` : ""}`);
      };
    });
  }

  #log(line: string): void {
    this.#options.log?.(line);
  }
}

/**
 * The Router as an HTTP application (seed 003, spec router): clients get the same `GET /health`
 * and `POST /execute` as on a server; nodes connect on the same port over WebSockets
 * (router/hub.ts, on the link's own endpoint). Served by http/serve.ts like the server, on
 * connections of its own (http/http1_server.ts: timeouts, a bound on connections, the client's
 * end aborting a request's signal, the node links' protocol switch).
 *
 * ```
 *  GET  /health              registry.health() ─▶ 200 "ok" / 503 "unavailable"
 *  GET  /metrics, /status    Prometheus text, the status page (and /status/data)
 *  POST /execute             forwardExecute (router/pipeline.ts)
 *  GET  /kcoral/v1/control   acceptNodeLink ─▶ a supervisor's status stream
 *  GET  /kcoral/v1/slot      acceptNodeLink ─▶ one worker slot of a node's server
 * ```
 *
 * With client tokens, `/execute`, `/metrics` and `/status` (and `/health` with
 * `protectHealth`) need one (http/client_tokens.ts); the node paths keep their own node token,
 * and a client's `Authorization` never crosses to a node (router/headers.ts).
 *
 * A stop turns new requests away (503), lets requests in flight finish, then closes every node
 * connection.
 *
 * @module
 */
import { CONTROL_PATH, SLOT_PATH } from "../link/messages.ts";
import type { RouterHealthBody } from "../protocol/health.ts";
import { EventLog } from "../http/events.ts";
import { InFlight } from "../http/in_flight.ts";
import type { ClientTokens } from "../http/client_tokens.ts";
import { jsonResponse, type Route, route, type RouteGuard } from "../http/routes.ts";
import type { HttpApp } from "../http/serve.ts";
import { forwardExecute } from "./pipeline.ts";
import { ClientWatch } from "./client_watch.ts";
import { acceptNodeLink } from "./hub.ts";
import type { ServerWebSocket } from "../link/websocket_server.ts";
import { NodeRegistry } from "./registry.ts";
import { RouterMetrics } from "./metrics.ts";
import { RouterStatus } from "./status.ts";
import { operatorRoutes } from "../http/operator_routes.ts";
import { registryConfig, type RouterConfig } from "./options.ts";

/** Options of {@linkcode createRouter} besides its configuration. */
export interface RouterAppOptions {
  /** Mirror events to the console (default true). */
  logConsole?: boolean;
  /** Where console lines go (default stderr). */
  consoleWrite?: (line: string) => void;
  /** Client tokens: `/execute`, `/metrics`, `/status` then need one (default: all open). */
  clientTokens?: ClientTokens | null;
}

/** A Router application. */
export interface RouterApp extends HttpApp {
  /** The nodes and their slots. */
  readonly registry: NodeRegistry;
  /** This Router process's id (`instance_id` of `/health`). */
  readonly instanceId: string;
  /**
   * Reports the address the Router listens on (`router_started`, with the port a `--port 0`
   * got); `serve`'s `onListen`.
   */
  listening(addr: Deno.NetAddr): void;
}

/**
 * Creates a Router.
 *
 * @example
 * ```ts
 * import { createRouter } from "./app.ts";
 * import { parseRouterArgs } from "./options.ts";
 *
 * const config = parseRouterArgs([], {});
 * if ("kind" in config) throw new Error("help");
 * const router = createRouter(config, { logConsole: false });
 * await router.start();
 * const health = await router.fetch(new Request("http://router/health"));
 * if (health.status !== 503 || (await health.json()).status !== "unavailable") throw new Error();
 * await router.shutdown();
 * ```
 */
export function createRouter(config: RouterConfig, options: RouterAppOptions = {}): RouterApp {
  return new _Router(config, options);
}

class _Router implements RouterApp {
  readonly registry: NodeRegistry;
  readonly instanceId: string = crypto.randomUUID();
  readonly events: EventLog;
  readonly #startedAt = new Date().toISOString().replace(/\.(\d{3})Z$/, ".$1000Z");
  readonly #config: RouterConfig;
  readonly #inFlight: InFlight;
  readonly #sockets = new Set<ServerWebSocket>();
  readonly #routes: Route[];
  readonly #guard: RouteGuard;
  readonly #metrics: RouterMetrics;
  readonly #status: RouterStatus;
  readonly #clientWatch = new ClientWatch();

  constructor(config: RouterConfig, options: RouterAppOptions) {
    this.#config = config;
    this.events = new EventLog({
      logDir: null,
      console: options.logConsole ?? true,
      programs: false,
      consoleWrite: options.consoleWrite,
      consoleFormat: config.logFormat,
      // One line per request: gathered and written together (decisions.md, "The Router's
      // request_finished lines are written together").
      consoleBatched: ["request_finished"],
    });
    this.#inFlight = new InFlight(this.events);
    this.registry = new NodeRegistry(registryConfig(config), {
      onEvent: (event, fields) => this.events.emit("INFO", event, fields),
    });
    this.#metrics = new RouterMetrics(this.events, this.registry);
    this.#status = new RouterStatus(this.events, this.registry, this.instanceId, this.#startedAt);
    const link = (request: Request) =>
      acceptNodeLink(request, {
        registry: this.registry,
        nodeToken: config.nodeToken,
        events: this.events,
        sockets: this.#sockets,
      });
    this.#guard = {
      tokens: options.clientTokens ?? null,
      onRefused: (refusal) => this.events.emit("WARNING", "client_unauthorized", refusal),
    };
    this.#routes = [
      { path: "/health", methods: ["GET"], access: "health", handler: () => this.#health() },
      {
        path: "/execute",
        methods: ["POST"],
        access: "client",
        handler: (request) => this.#execute(request),
      },
      ...operatorRoutes(this.#metrics.registry, () => this.#status.data()),
      { path: CONTROL_PATH, methods: ["GET"], handler: link },
      { path: SLOT_PATH, methods: ["GET"], handler: link },
    ];
    this.fetch = this.fetch.bind(this);
  }

  fetch(request: Request, info?: Deno.ServeHandlerInfo): Promise<Response> {
    return route(this.#routes, request, info, this.#guard);
  }

  start(): Promise<void> {
    this.registry.start();
    this.#clientWatch.start();
    return Promise.resolve();
  }

  listening(addr: Deno.NetAddr): void {
    this.events.emit("INFO", "router_started", {
      instance_id: this.instanceId,
      host: this.#config.host,
      port: addr.port,
      node_token: this.#config.nodeToken !== null,
      client_tokens: this.#guard.tokens !== null,
    });
  }

  async shutdown(): Promise<void> {
    // New and queued requests get a 503 at once; the requests on nodes finish.
    const drained = this.#inFlight.drain();
    this.registry.close();
    await drained;
    this.#clientWatch.stop();
    // Every node connection closed with 1001 (echoed, or given up) before the stop is reported.
    const sockets = [...this.#sockets];
    for (const socket of sockets) socket.close(1001, "router stopping");
    await Promise.all(sockets.map((socket) => socket.closed));
    this.events.emit("INFO", "router_stopped", {});
    this.#metrics.close();
    this.#status.close();
    this.events.close();
  }

  #health(): Response {
    const health = this.registry.health();
    const body: RouterHealthBody = {
      status: health.ok ? "ok" : "unavailable",
      instance_id: this.instanceId,
      started_at: this.#startedAt,
      gpu_count: null,
      load: health.load,
      target: health.target,
      versions: health.versions,
    };
    return jsonResponse(health.ok ? 200 : 503, JSON.stringify(body));
  }

  async #execute(request: Request): Promise<Response> {
    // In flight until the attempt has finished: its answer streamed, abandoned or refused.
    this.#inFlight.enter();
    let left = false;
    const leave = () => {
      if (!left) (left = true, this.#inFlight.leave());
    };
    try {
      return await forwardExecute(request, {
        registry: this.registry,
        maxRequestBytes: this.#config.maxRequestBytes,
        events: this.events,
        onFinished: leave,
        clientWatch: this.#clientWatch,
      });
    } catch (error) {
      leave();
      throw error;
    }
  }
}

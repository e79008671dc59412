/**
 * A KCoral server as an HTTP application: the routes (`/health`, `/execute`, `/metrics`,
 * `/status`, the loopback-only `/internal/worker-status`) and the lifecycle. Startup is in
 * `services.ts`, `/execute` in `execute/pipeline.ts`. The front-end never touches a GPU.
 *
 * @module
 */
import type { HealthBody } from "../protocol/health.ts";
import type { EventLog as EventLogType } from "../http/events.ts";
import { EventLog } from "../http/events.ts";
import { InFlight } from "../http/in_flight.ts";
import { Rejection } from "../http/rejection.ts";
import type { ClientTokens } from "../http/client_tokens.ts";
import { jsonResponse, peerHost, type Route, route, type RouteGuard } from "../http/routes.ts";
import type { HttpApp } from "../http/serve.ts";
import { ERROR_MESSAGES } from "../protocol/errors.ts";
import { distinctGpuCount, resolveServerConfig, type ServerConfig } from "./config.ts";
import { ServerMetrics } from "./metrics.ts";
import { ServerStatus } from "./status.ts";
import { operatorRoutes } from "../http/operator_routes.ts";
import { executeRequest } from "./execute/pipeline.ts";
import { discardBody, type WholeBodyRequest } from "./execute/intake.ts";
import type { WorkerPool } from "./workers/pool.ts";
import { type Services, startServices, stopServices } from "./services.ts";

/** Options of {@linkcode createApp} that are not part of the server configuration. */
export interface AppOptions {
  /** Replaces the console sink of the event log (tests). */
  consoleWrite?: (line: string) => void;
  /** The environment workers start with, whose `PATH` finds `bwrap` (default: this process's). */
  env?: Record<string, string>;
  /** Client tokens: `/execute`, `/metrics`, `/status` (and `/health` if protected) need one. */
  clientTokens?: ClientTokens | null;
}

/** A KCoral server application. */
export interface App extends HttpApp {
  /** The effective configuration. */
  readonly config: ServerConfig;
  /** The current health report. */
  health(): HealthBody;
  /** The isolation in effect (`"none"` after a failed bubblewrap probe). */
  readonly sandbox: "bubblewrap" | "none";
  /** Observes every event the server logs; returns a function that stops observing. */
  subscribe(listener: (event: Record<string, unknown>) => void): () => void;
  /** Runs one `/execute` request through the pipeline without HTTP routing (`client`: its host). */
  execute(request: Request, client?: string | null): Promise<Response>;
}

/** Internal parts of an application (tests and benchmarks; not public API). */
export function appInternals(
  app: App,
): { pool: WorkerPool | null; events: EventLogType; blobDir: string | null } {
  if (!(app instanceof _ServerApp)) throw new TypeError("not a KCoral server application");
  const services = app.services;
  return { pool: services?.pool ?? null, events: app.events, blobDir: services?.store.dir ?? null };
}

/**
 * Runs one `/execute` request a node's slot link tunnels through `app`'s pipeline: a `Request`,
 * or a small body taken whole ({@linkcode WholeBodyRequest}). Internal to the node's links.
 */
export function executeTunnelled(
  app: App,
  request: Request | WholeBodyRequest,
  client: string | null,
): Promise<Response> {
  if (!(app instanceof _ServerApp)) throw new TypeError("not a KCoral server application");
  return app.run(request, client);
}

/**
 * Builds a server application. Nothing starts until {@linkcode App.start} (or
 * {@linkcode serve}, which starts it and listens).
 *
 * @example A CPU server on a free port, one program through it
 * ```ts
 * import { Client, createApp, Program, serve } from "../mod.ts";
 *
 * const app = createApp({ device: "cpu", sandbox: "none", logConsole: false, diskCacheDir: null });
 * const server = await serve(app, { port: 0, handleSignals: false, log: () => {} });
 * const program = new Program();
 * const mod = program.upload({ kind: "module", source: "def f(x):\n    return x + 1\n" });
 * const y = program.run({ fn: program.getFunction({ module: mod, name: "f" }), args: [41] });
 * program.return_({ key: "y", value: y });
 * await using client = new Client(server.url);
 * const result = await client.execute(program);
 * if (result.get("y") !== 42) throw new Error("unexpected result");
 * await server.shutdown();
 * ```
 */
export function createApp(input: Partial<ServerConfig> = {}, options: AppOptions = {}): App {
  return new _ServerApp(resolveServerConfig(input), options);
}

class _ServerApp implements App {
  readonly config: ServerConfig;
  readonly events: EventLog;
  readonly instanceId = crypto.randomUUID();
  readonly startedAt = new Date().toISOString().replace(/\.(\d{3})Z$/, ".$1000Z");
  /** The running server's parts (after {@linkcode start}). */
  services: Services | null = null;
  readonly #options: AppOptions;
  readonly #inFlight: InFlight;
  readonly #routes: Route[];
  readonly #guard: RouteGuard;
  readonly #metrics: ServerMetrics;
  readonly #status: ServerStatus;
  #started = false;
  #stopping = false;

  constructor(config: ServerConfig, options: AppOptions) {
    this.config = config;
    this.#options = options;
    this.events = new EventLog({
      logDir: config.logDir,
      console: config.logConsole,
      programs: config.logPrograms,
      consoleWrite: options.consoleWrite,
      consoleFormat: config.logFormat,
    });
    this.#inFlight = new InFlight(this.events);
    const sources = () => {
      const s = this.services;
      return s && { pool: s.pool, leases: s.leases, store: s.store, disk: s.caches.disk };
    };
    this.#metrics = new ServerMetrics(this.events, sources);
    this.#status = new ServerStatus(this.events, sources);
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
        handler: (r, info) => this.#execute(r, info),
      },
      ...operatorRoutes(this.#metrics.registry, () => this.#status.data(this.health())),
      {
        path: "/internal/worker-status",
        methods: ["GET"],
        loopbackOnly: true,
        handler: () => this.#workerStatus(),
      },
    ];
    this.fetch = this.fetch.bind(this);
  }

  get sandbox(): "bubblewrap" | "none" {
    return this.services?.launch.sandbox ?? this.config.sandbox;
  }

  fetch(request: Request, info?: Deno.ServeHandlerInfo): Promise<Response> {
    return route(this.#routes, request, info, this.#guard);
  }

  async start(): Promise<void> {
    if (this.#started) throw new Error("the server is already started");
    this.#started = true;
    this.events.emit("INFO", "server_started", {
      run_dir: this.events.runDir,
      config: { ...this.config },
    });
    try {
      this.services = await startServices(this.config, this.events, this.#inFlight, {
        env: this.#options.env,
      });
    } catch (error) {
      this.events.emit("ERROR", "server_start_failed", {
        error: error instanceof Error ? `${error.name}: ${error.message}` : String(error),
        traceback: error instanceof Error ? (error.stack ?? "").slice(-8192) : "",
      });
      throw error;
    }
  }

  async shutdown(): Promise<void> {
    if (this.#stopping) return;
    this.#stopping = true;
    const drained = this.#inFlight.drain();
    this.services?.intake.stop();
    this.services?.pool.beginShutdown();
    await drained;
    if (this.services) await stopServices(this.services);
    this.events.emit("INFO", "shutdown_complete");
    this.events.emit("INFO", "server_stopped");
    this.#metrics.close();
    this.#status.close();
    this.events.close();
  }

  subscribe(listener: (event: Record<string, unknown>) => void): () => void {
    return this.events.subscribe(listener);
  }

  health(): HealthBody {
    const pool = this.services?.pool;
    const load = pool?.load() ??
      { request_capacity: 0, requests_in_progress: 0, requests_waiting: 0 };
    if (this.#inFlight.closing) load.request_capacity = 0;
    return {
      status: "ok",
      instance_id: this.instanceId,
      started_at: this.startedAt,
      gpu_count: distinctGpuCount(this.config),
      load,
      target: pool?.target ?? {},
      versions: pool?.versions ?? {},
    };
  }

  #health(): Response {
    return jsonResponse(200, JSON.stringify(this.health()));
  }

  #execute(request: Request, info: Deno.ServeHandlerInfo | undefined): Promise<Response> {
    return this.execute(request, peerHost(info));
  }

  execute(request: Request, client: string | null = null): Promise<Response> {
    return this.run(request, client);
  }

  /** {@linkcode App.execute} for either kind of request ({@linkcode executeTunnelled}). */
  async run(request: Request | WholeBodyRequest, client: string | null): Promise<Response> {
    if (!this.services) {
      // Not started, or failed to: nothing can run.
      await discardBody(request);
      const busy = new Rejection(503, "busy", ERROR_MESSAGES.busy, "no_worker");
      return busy.response(crypto.randomUUID());
    }
    return await executeRequest(this.services, request, client);
  }

  #workerStatus(): Response {
    const pool = this.services?.pool;
    return jsonResponse(
      200,
      JSON.stringify({
        status: "ok",
        instance_id: this.instanceId,
        target: pool?.target ?? {},
        versions: pool?.versions ?? {},
        worker_count: pool?.seats.length ?? 0,
        busy_workers: pool?.busyWorkers ?? 0,
      }),
    );
  }
}

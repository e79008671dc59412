/**
 * Runs an application (a KCoral server, or a Router) over HTTP with `Deno.serve`: starts the workers first, then
 * listens and prints `Application startup complete.`; SIGTERM/SIGINT drain requests in flight
 * (new ones get 503), stop every worker, and end the process with status 0. Repeated signals
 * never cut the drain short (an operator pressing Ctrl+C twice must not lose benchmarks): each
 * one reports how many requests are left, as every request that finishes meanwhile does. A
 * listener that
 * fails (`Deno.serve` stops accepting for good when the process runs out of file descriptors)
 * is opened again on the same address, while connections already accepted go on. With `tls`
 * it serves HTTPS (Deno.serve's own TLS); with `clientTokens`, SIGHUP reads their token file
 * again (a failed reload keeps the previous set and logs a warning naming the file, never a
 * token).
 *
 * @module
 */
import type { ClientTokens } from "./client_tokens.ts";
import type { EventLog } from "./events.ts";
import { type ConnectionLimits, type Http1Server, serveHttp1 } from "./http1_server.ts";

export type { ConnectionLimits } from "./http1_server.ts";

/** A certificate chain and its private key, PEM-encoded (the files' contents). */
export interface TlsFiles {
  /** The certificate chain, leaf first. */
  cert: string;
  /** The private key. */
  key: string;
}

/** What {@linkcode serve} runs: Web-standard request handling around a start and a stop. */
export interface HttpApp {
  /** Handles one HTTP request. */
  fetch(request: Request, info?: Deno.ServeHandlerInfo): Promise<Response>;
  /** Starts whatever serving needs; resolves when requests can be taken. */
  start(): Promise<void>;
  /**
   * Graceful stop: refuse new work, finish requests in flight, stop. Reports its progress as
   * `shutdown_started` and `shutdown_waiting` events with the number of requests `remaining`.
   */
  shutdown(): Promise<void>;
  /** The application's event log (serve reports a restarted listener there). */
  readonly events: EventLog;
  /**
   * Serves WebSocket upgrades (the Router's node links): served by `Deno.serve`, without the
   * connection limits. Otherwise connections are served by http/http1_server.ts.
   */
  readonly upgrades?: boolean;
}

/** How long a stop waits for connections to close once the application is down. */
const _CLOSE_GRACE_MS = 1000;
/** Waits before listening again after the listener failed: doubling from the first, capped. */
const _RELISTEN_FIRST_MS = 50;
const _RELISTEN_MAX_MS = 1000;

/** Where and how to listen. */
export interface ServeOptions {
  /** Bind address (default 127.0.0.1). */
  host?: string;
  /** Port (default 8000; 0 picks a free one). */
  port?: number;
  /** Install SIGTERM/SIGINT handlers (default true). */
  handleSignals?: boolean;
  /** Called with the bound address once listening. */
  onListen?: (addr: Deno.NetAddr) => void;
  /** Where status lines go (default stderr). */
  log?: (line: string) => void;
  /** What the listening line calls the application (default `KCoral server`). */
  label?: string;
  /** Serve HTTPS with this certificate and key (default: plain HTTP). */
  tls?: TlsFiles | null;
  /** Client tokens whose file SIGHUP reads again (with `handleSignals`). */
  clientTokens?: ClientTokens | null;
  /**
   * Timeouts and the bound on connections (http/http1_server.ts's defaults for those not
   * given); not for an application that serves upgrades.
   */
  connections?: Partial<ConnectionLimits>;
}

/** A running HTTP server. */
export interface RunningServer {
  /** The bound address. */
  readonly addr: Deno.NetAddr;
  /** Base URL, e.g. `http://127.0.0.1:8000`. */
  readonly url: string;
  /**
   * Resolves when the server has stopped (a stop's end: a connection still owed a body it will
   * never get is not waited for).
   */
  readonly finished: Promise<void>;
  /** Resolves when the listener's last connection has closed as well. */
  readonly closed: Promise<void>;
  /**
   * Graceful stop (idempotent): requests in flight finish, bodies still arriving are answered
   * 503, workers stop; resolves at most ~1 s after that even if a client keeps a connection.
   */
  shutdown(): Promise<void>;
}

/**
 * Starts `app` and serves it until {@linkcode RunningServer.shutdown} or a signal.
 *
 * @example
 * ```ts
 * import { createApp, serve } from "../mod.ts";
 *
 * const app = createApp({ device: "cpu", sandbox: "none", logConsole: false, diskCacheDir: null });
 * const server = await serve(app, { port: 0, handleSignals: false, log: () => {} });
 * const health = await (await fetch(`${server.url}/health`)).json();
 * if (health.status !== "ok") throw new Error("not ready");
 * await server.shutdown();
 * ```
 */
export async function serve(app: HttpApp, options: ServeOptions = {}): Promise<RunningServer> {
  const log = options.log ?? ((line: string) => console.error(line));
  await app.start();
  let resolveAddr!: (addr: Deno.NetAddr) => void;
  const listening = new Promise<Deno.NetAddr>((resolve) => (resolveAddr = resolve));
  const tls = options.tls ?? null;
  const listen = (port: number, onListen: (addr: Deno.NetAddr) => void) =>
    Deno.serve({
      hostname: options.host ?? "127.0.0.1",
      port,
      onListen,
      ...(tls ? { cert: tls.cert, key: tls.key } : {}),
    }, app.fetch);
  // Deno.serve's `finished` fails when its listener does (relistened below); ours never does.
  let server: { readonly finished: Promise<void>; shutdown(): Promise<void> };
  try {
    if (app.upgrades) server = listen(options.port ?? 8000, resolveAddr);
    else {
      const own = _serveConnections(app, options, tls, log);
      resolveAddr(own.addr);
      server = own;
    }
  } catch (error) {
    await app.shutdown();
    throw error;
  }
  const addr = await listening;
  const host = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
  const url = `${tls ? "https" : "http"}://${host}:${addr.port}`;
  options.onListen?.(addr);
  log(`${options.label ?? "KCoral server"} listening on ${url}`);
  log("Application startup complete.");

  let stopping: Promise<void> | null = null;
  let stopDone!: () => void;
  const stopped = new Promise<void>((resolve) => stopDone = resolve);
  const signalHandlers: [Deno.Signal, () => void][] = [];
  // The drain's progress, as the application reports it (upstream's console lines).
  let remaining = 0;
  const unsubscribe = app.events.subscribe((event) => {
    if (event.event === "shutdown_started" || event.event === "shutdown_waiting") {
      remaining = Number(event.remaining);
      const lead = event.event === "shutdown_started" ? "Shutdown requested. " : "";
      log(`${lead}Finishing remaining benchmarks: ${remaining} left.`);
    }
  });
  const shutdown = () => {
    stopping ??= (async () => {
      await app.shutdown();
      unsubscribe();
      // A connection still owed the rest of a body it will never get (its upload stalled and
      // was answered 503) would hold a graceful stop for as long as its client waits: after a
      // moment, stopping goes on without it (`closed` still waits for it).
      let grace: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([
        server.shutdown().catch(() => {}), // a failed listener has nothing left to stop
        new Promise((resolve) => grace = setTimeout(resolve, _CLOSE_GRACE_MS)),
      ]);
      clearTimeout(grace);
      for (const [signal, handler] of signalHandlers) {
        try {
          Deno.removeSignalListener(signal, handler);
        } catch {
          // already removed
        }
      }
      stopDone();
    })();
    return stopping;
  };
  if (options.handleSignals ?? true) {
    for (const signal of ["SIGTERM", "SIGINT"] as const) {
      const handler = () => {
        if (stopping) log(`Shutdown requested. Finishing remaining benchmarks: ${remaining} left.`);
        else shutdown();
      };
      Deno.addSignalListener(signal, handler);
      signalHandlers.push([signal, handler]);
    }
    const tokens = options.clientTokens;
    if (tokens?.file) {
      const reload = () => {
        const result = tokens.reload();
        if (result.ok) {
          app.events.emit("INFO", "client_tokens_reloaded", { tokens: result.count });
          log(`client tokens reloaded from ${tokens.file}: ${result.count} accepted`);
        } else {
          app.events.emit("WARNING", "client_tokens_reload_failed", { error: result.error });
          log(`client tokens not reloaded (the previous ones stay): ${result.error}`);
        }
      };
      Deno.addSignalListener("SIGHUP", reload);
      signalHandlers.push(["SIGHUP", reload]);
    }
  }
  const closed = (async () => {
    for (;;) {
      try {
        await server.finished;
      } catch (error) {
        const again = stopping ? null : await _listenAgain(
          error,
          () => stopping !== null,
          () => listen(addr.port, () => {}),
          (fields) => {
            app.events.emit("WARNING", "listener_restarted", fields);
            log(`${options.label ?? "KCoral server"}: listening again after: ${fields.error}`);
          },
        );
        if (again) {
          server = again;
          // A shutdown that began meanwhile may have stopped the failed listener only.
          if (stopping) await server.shutdown().catch(() => {});
          else continue;
        }
      }
      await stopping;
      return;
    }
  })();
  // The process may end once the stop is done (`kcoral server` exits then), even while a
  // stalled client still holds a connection open.
  const finished = Promise.race([closed, stopped]);
  return { addr, url, finished, closed, shutdown };
}

/**
 * `app` served over connections of our own (http/http1_server.ts): what they cut or refuse,
 * and a listener that cannot accept, are logged as events and counted.
 */
function _serveConnections(
  app: HttpApp,
  options: ServeOptions,
  tls: TlsFiles | null,
  log: (line: string) => void,
): Http1Server {
  const label = options.label ?? "KCoral server";
  return serveHttp1({
    hostname: options.host ?? "127.0.0.1",
    port: options.port ?? 8000,
    tls,
    limits: options.connections,
    handler: app.fetch,
    onCut: (reason, fields) => app.events.emit("WARNING", "connection_cut", { reason, ...fields }),
    onListener: (state, fields) => {
      if (state === "exhausted") {
        app.events.emit("WARNING", "listener_accept_failed", fields);
        log(`${label}: cannot accept connections (retrying): ${fields.error}`);
      } else {
        app.events.emit("INFO", "listener_accepting_again", fields);
        log(`${label}: accepting connections again`);
      }
    },
  });
}

/**
 * Opens the listener again after it failed with `error`, retrying (doubling waits, capped)
 * while that fails too (no descriptor free yet); `null` once the server is stopping.
 */
async function _listenAgain(
  error: unknown,
  stopping: () => boolean,
  listen: () => Deno.HttpServer<Deno.NetAddr>,
  report: (fields: { error: string; attempts: number }) => void,
): Promise<Deno.HttpServer<Deno.NetAddr> | null> {
  let delay = _RELISTEN_FIRST_MS;
  for (let attempts = 1;; attempts++) {
    await new Promise((resolve) => setTimeout(resolve, delay));
    if (stopping()) return null;
    try {
      const server = listen();
      report({ error: error instanceof Error ? error.message : String(error), attempts });
      return server;
    } catch {
      delay = Math.min(2 * delay, _RELISTEN_MAX_MS);
    }
  }
}

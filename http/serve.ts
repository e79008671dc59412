/**
 * Runs an application (a KCoral server, or a Router) over HTTP/1.1 on connections of its own
 * (http1_server.ts): starts it, listens and prints `Application startup complete.`; SIGTERM/SIGINT
 * drain requests in flight and stop. Repeated signals never cut the drain short (a second Ctrl+C
 * must not lose benchmarks), each reports how many requests are left. With `tls` it serves HTTPS;
 * with `clientTokens`, SIGHUP rereads their token file.
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
  /** The application's event log (serve reports cut connections and the listener there). */
  readonly events: EventLog;
}

/** How long a stop waits for connections to close once the application is down. */
const _CLOSE_GRACE_MS = 1000;

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
  /** Timeouts and the bound on connections (http/http1_server.ts's defaults for those not given). */
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
   * Graceful stop (idempotent): requests in flight finish, bodies still arriving are answered 503,
   * workers stop; resolves at most ~1 s after that even if a client keeps a connection.
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
  const tls = options.tls ?? null;
  let server: Http1Server;
  try {
    server = _serveConnections(app, options, tls, log);
  } catch (error) {
    await app.shutdown();
    throw error;
  }
  const addr = server.addr;
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
        server.shutdown(),
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
  // The listener's connections end only after a stop began (http1_server.ts never fails).
  const closed = server.finished.then(() => stopping ?? undefined);
  // The process may end once the stop is done (`kcoral server` exits then), even while a
  // stalled client still holds a connection open.
  const finished = Promise.race([closed, stopped]);
  return { addr, url, finished, closed, shutdown };
}

/**
 * `app` served over connections of our own (http/http1_server.ts): what they cut or refuse, and a
 * listener that cannot accept, are logged as events and counted.
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

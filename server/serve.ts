/**
 * Runs a server application over HTTP with `Deno.serve`: starts the workers first, then
 * listens and prints `Application startup complete.`; SIGTERM/SIGINT drain requests in flight
 * (new ones get 503), stop every worker, and end the process with status 0.
 *
 * @module
 */
import type { App } from "./app.ts";

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
}

/** A running HTTP server. */
export interface RunningServer {
  /** The bound address. */
  readonly addr: Deno.NetAddr;
  /** Base URL, e.g. `http://127.0.0.1:8000`. */
  readonly url: string;
  /** Resolves when the server has fully stopped. */
  readonly finished: Promise<void>;
  /** Graceful stop (idempotent). */
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
export async function serve(app: App, options: ServeOptions = {}): Promise<RunningServer> {
  const log = options.log ?? ((line: string) => console.error(line));
  await app.start();
  let resolveAddr!: (addr: Deno.NetAddr) => void;
  const listening = new Promise<Deno.NetAddr>((resolve) => (resolveAddr = resolve));
  let server: Deno.HttpServer<Deno.NetAddr>;
  try {
    server = Deno.serve({
      hostname: options.host ?? "127.0.0.1",
      port: options.port ?? 8000,
      onListen: (addr) => resolveAddr(addr),
    }, app.fetch);
  } catch (error) {
    await app.shutdown();
    throw error;
  }
  const addr = await listening;
  const host = addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname;
  const url = `http://${host}:${addr.port}`;
  options.onListen?.(addr);
  log(`KCoral server listening on ${url}`);
  log("Application startup complete.");

  let stopping: Promise<void> | null = null;
  const signalHandlers: [Deno.Signal, () => void][] = [];
  const shutdown = () => {
    stopping ??= (async () => {
      const remaining = app.health().load.requests_in_progress;
      if (remaining > 0) log(`Finishing remaining benchmarks: ${remaining} left.`);
      await app.shutdown();
      await server.shutdown();
      for (const [signal, handler] of signalHandlers) {
        try {
          Deno.removeSignalListener(signal, handler);
        } catch {
          // already removed
        }
      }
    })();
    return stopping;
  };
  if (options.handleSignals ?? true) {
    for (const signal of ["SIGTERM", "SIGINT"] as const) {
      const handler = () => {
        if (stopping) {
          log("Forced exit.");
          Deno.exit(1);
        }
        shutdown();
      };
      Deno.addSignalListener(signal, handler);
      signalHandlers.push([signal, handler]);
    }
  }
  const finished = server.finished.then(() => stopping ?? undefined);
  return { addr, url, finished, shutdown };
}

/**
 * The KCoral execution server as a library: {@linkcode createApp} builds it from a
 * {@linkcode ServerConfig}, {@linkcode serve} listens. `kcoral server` is this plus the command
 * line.
 *
 * @example
 * ```ts
 * import { createApp, serve } from "./mod.ts";
 *
 * const app = createApp({ device: "cpu", numWorkers: 1, logDir: null, logConsole: false });
 * const server = await serve(app, { port: 0, handleSignals: false, log: () => {} });
 * const health = await (await fetch(`${server.url}/health`)).json();
 * if (health.status !== "ok") throw new Error(JSON.stringify(health));
 * await server.shutdown();
 * ```
 *
 * @module
 */

export { type App, type AppOptions, createApp } from "./app.ts";
export { ConfigError, resolveServerConfig, type ServerConfig } from "./config.ts";
export {
  defaultDiskCacheDir,
  serverConfigOptions,
  serverConfigRules,
  serverListenOptions,
} from "./config_options.ts";
export * from "../http/app_exports.ts";

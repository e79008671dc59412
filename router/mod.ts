/**
 * The KCoral Router as a library (docs/router.md): {@linkcode createRouter} builds it from a
 * {@linkcode RouterConfig} ({@linkcode parseRouterArgs} makes one from `kcoral router`'s flags),
 * {@linkcode serve} listens. Nodes join it with `kcoral server --router URL --node-id NAME`.
 *
 * @example
 * ```ts
 * import { createRouter, parseRouterArgs, serve } from "./mod.ts";
 *
 * const router = createRouter(parseRouterArgs([], {}), { logConsole: false });
 * const server = await serve(router, { port: 0, handleSignals: false, log: () => {} });
 * const health = await fetch(`${server.url}/health`);
 * await health.body?.cancel();
 * if (health.status !== 503) throw new Error("no node yet: 503"); // no node has joined
 * await server.shutdown();
 * ```
 *
 * @module
 */

export { createRouter, type RouterApp, type RouterAppOptions } from "./app.ts";
export {
  parseRouterArgs,
  type RouterConfig,
  RouterHelp,
  routerHelpText,
  routerOptions,
} from "./options.ts";
export type { RouterHealthBody } from "../protocol/health.ts";
export * from "../http/app_exports.ts";
export {
  NodeRegistry,
  type RegistryConfig,
  type RegistryEventListener,
  type RegistryOptions,
} from "./registry.ts";
export { type ControlHandle, LinkRefusal, type SlotHandle, type SlotLease } from "./connections.ts";
export type { NodeState } from "./node_health.ts";
export type { NodeSnapshot, RegistryHealth, RegistrySnapshot } from "./health_views.ts";
export {
  LINK_CLOSE,
  type LinkCloseName,
  type NodeStatus,
  type SlotHello,
} from "../link/messages.ts";

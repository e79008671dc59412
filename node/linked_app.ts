/**
 * A node's server linked to its Router: the routing settings its supervisor hands it in the
 * environment (spec router §1.6), and the server application whose workers' slots connect once
 * it has started (node/slot_links.ts) and feed the requests they carry into its own `/execute`
 * pipeline in-process.
 *
 * @module
 */
import { readCaFile } from "../http/access_options.ts";
import { type App, executeTunnelled } from "../server/app.ts";
import { NodeLink, type NodeLinkTarget } from "./slot_links.ts";

/**
 * The routing settings a supervisor passes its server in the environment (spec router §1.6):
 * `KCORAL_NODE_SERVER=1` with `KCORAL_ROUTER_ENDPOINT`, `KCORAL_NODE_ID` and, when set,
 * `KCORAL_NODE_TOKEN` and `KCORAL_CA_FILE` (read here: an unreadable file is an `Error` naming
 * it); `null` when this process is not a node's server.
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
        execute: (request, client) => executeTunnelled(app, request, client),
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

import { acceptNodeLink } from "./hub.ts";
import { NodeRegistry } from "./registry.ts";
import { defaultRegistryConfig } from "./options.ts";
import { EventLog } from "../http/events.ts";
import type { ServerWebSocket } from "../link/websocket_server.ts";

Deno.test("hub: acceptNodeLink", () => {
  const registry = new NodeRegistry(defaultRegistryConfig());
  const events = new EventLog({ logDir: null, console: false, programs: false });
  const ctx = { registry, nodeToken: "s3cret", events, sockets: new Set<ServerWebSocket>() };
  const refused = acceptNodeLink(new Request("http://router/kcoral/v1/slot"), ctx);
  if (refused.status !== 401) throw new Error(String(refused.status));
  registry.close();
});

import { EventLog } from "../http/events.ts";
import { NodeRegistry } from "./registry.ts";
import { defaultRegistryConfig } from "./options.ts";
import { RouterStatus } from "./status.ts";

Deno.test("status: RouterStatus", () => {
  const events = new EventLog({ logDir: null, console: false, programs: false });
  const registry = new NodeRegistry(defaultRegistryConfig());
  const status = new RouterStatus(events, registry, "i", "s");
  events.emit("INFO", "request_finished", { request_id: "r1", node: "gpu-a", http_status: 200 });
  const data = status.data();
  if (data.nodes.length !== 0 || data.requests[0].node !== "gpu-a") throw new Error();
  status.close();
  registry.close();
});

import { EventLog } from "../http/events.ts";
import { NodeRegistry } from "./registry.ts";
import { defaultRegistryConfig } from "./options.ts";
import { RouterMetrics } from "./metrics.ts";

Deno.test("metrics: RouterMetrics", async () => {
  const events = new EventLog({ logDir: null, console: false, programs: false });
  const registry = new NodeRegistry(defaultRegistryConfig());
  const metrics = new RouterMetrics(events, registry);
  events.emit("WARNING", "request_finished", {
    http_status: 503,
    finish_reason: "queue_full",
    error_kind: "router_busy",
    queue_wait_ms: 0,
    request_bytes: 0,
    response_bytes: 0,
  });
  const text = await metrics.render();
  if (!text.includes('outcome="queue_full",error_kind="router_busy"} 1')) throw new Error(text);
  if (!text.includes('kcoral_router_nodes{state="ready"} 0')) throw new Error(text);
  metrics.close();
  registry.close();
});

import { forwardExecute } from "./pipeline.ts";
import { NodeRegistry } from "./registry.ts";
import { defaultRegistryConfig } from "./options.ts";
import { EventLog } from "../http/events.ts";

Deno.test("pipeline: forwardExecute", async () => {
  const registry = new NodeRegistry(defaultRegistryConfig({ maxQueuedRequests: 0 }));
  const events = new EventLog({ logDir: null, console: false, programs: false });
  const response = await forwardExecute(
    new Request("http://router/execute", { method: "POST", body: "x" }),
    { registry, maxRequestBytes: 1 << 20, events },
  );
  if (response.status !== 503 || response.headers.get("retry-after") !== "1") throw new Error();
  await response.body?.cancel();
});

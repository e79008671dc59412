import { admitRequest } from "./admission.ts";
import { RequestTrace } from "./finish.ts";
import { defaultRegistryConfig } from "./options.ts";
import { NodeRegistry } from "./registry.ts";
import { EventLog } from "../http/events.ts";
import type { Rejection } from "../http/rejection.ts";

Deno.test("admission: admitRequest", async () => {
  const registry = new NodeRegistry(defaultRegistryConfig({ maxQueuedRequests: 0 }));
  const events = new EventLog({ logDir: null, console: false, programs: false });
  const routed = {
    request: new Request("http://router/execute", { method: "POST" }),
    preferred: null,
    length: null,
    body: new Uint8Array(0),
    prefix: null,
  };
  try {
    await admitRequest(routed, new RequestTrace(events), { registry });
    throw new Error("no node, yet a slot");
  } catch (rejection) {
    if ((rejection as Rejection).kind !== "router_busy") throw rejection; // nobody may wait
  }
});

import { NodeLink } from "./slot_links.ts";
import { EventLog } from "../http/events.ts";

Deno.test("slot links: NodeLink", async () => {
  const link = new NodeLink({
    routerEndpoint: "http://127.0.0.1:1", // nothing listens: the slots keep retrying
    nodeId: "gpu-a",
    nodeToken: null,
    serverInstanceId: crypto.randomUUID(),
    slots: 1,
    execute: () => Promise.resolve(new Response("unused")),
    events: new EventLog({ logDir: null, console: false, programs: false }),
  });
  link.start();
  await link.stop();
});

Deno.test("slot links: NodeLink", () => {
  const link = new NodeLink({
    routerEndpoint: "http://127.0.0.1:9000",
    nodeId: "gpu-a",
    nodeToken: null,
    serverInstanceId: crypto.randomUUID(),
    slots: 2,
    execute: () => Promise.resolve(new Response("unused")),
    events: new EventLog({ logDir: null, console: false, programs: false }),
  });
  if (link.connectedSlots !== 0) throw new Error();
});

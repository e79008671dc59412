import { NodeSlots } from "./connections.ts";

Deno.test("connections: NodeSlots", () => {
  const slots = new NodeSlots();
  const slot = {
    connectionId: "d1",
    slotId: "x",
    nodeId: "gpu-a",
    serverInstanceId: "i1",
    close() {},
  };
  slots.add(slot);
  if (slots.takeIdle() !== slot || slots.size !== 1) throw new Error("taken, still registered");
  slots.giveBack(slot, true, "i1");
  if (slots.idleCount !== 1) throw new Error("idle again");
});

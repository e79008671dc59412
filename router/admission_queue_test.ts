import { AdmissionQueue, NoNode, RouterBusy, RouterStopping } from "./admission_queue.ts";

Deno.test("admission queue: RouterBusy", () => {
  if (new RouterBusy().kind !== "router_busy") throw new Error();
});

Deno.test("admission queue: NoNode", () => {
  if (new NoNode().kind !== "no_node") throw new Error();
});

Deno.test("admission queue: RouterStopping", () => {
  const error = new RouterStopping();
  if (!(error instanceof NoNode) || error.message !== "router stopping") throw new Error();
});

Deno.test("admission queue: AdmissionQueue", async () => {
  const queue = new AdmissionQueue({ maxWaiting: 1, waitTimeoutMs: 1000 });
  let free = 0;
  const take = () => free > 0 ? free-- : null;
  const waiting = queue.admit(take);
  await queue.admit(take).then(() => {
    throw new Error("admitted");
  }, (error) => {
    if (!(error instanceof RouterBusy)) throw error;
  });
  free = 1;
  queue.wakeOne();
  await waiting;
  if (queue.waiting !== 0) throw new Error();
});

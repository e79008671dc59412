import { choosePowerOfTwo, compareLoad, estimatedUsed, selectNode } from "./selection.ts";

Deno.test("selection: estimatedUsed", () => {
  const node = { name: "a", inFlight: 4, busyWorkers: 2, workerCount: 8, lastSelected: 0 };
  if (estimatedUsed(node) !== 4) throw new Error();
});

Deno.test("selection: compareLoad", () => {
  const node = (workerCount: number, busyWorkers: number) => ({
    name: "n",
    inFlight: 0,
    busyWorkers,
    workerCount,
    lastSelected: 0,
  });
  if (compareLoad(node(8, 4), node(2, 0)) <= 0) throw new Error("4/8 > 0/2");
  if (compareLoad(node(8, 4), node(2, 1)) !== 0) throw new Error("4/8 = 1/2");
});

Deno.test("selection: choosePowerOfTwo", () => {
  const a = { name: "a", inFlight: 0, busyWorkers: 0, workerCount: 1, lastSelected: 7 };
  const b = { name: "b", inFlight: 0, busyWorkers: 0, workerCount: 1, lastSelected: 3 };
  // Equal load: the least recently selected wins, whichever is drawn first.
  if (choosePowerOfTwo([a, b], () => 0).name !== "b") throw new Error();
  if (choosePowerOfTwo([a, b], () => 0.99).name !== "b") throw new Error();
});

Deno.test("selection: selectNode", () => {
  const a = { name: "a", inFlight: 3, busyWorkers: 0, workerCount: 1, lastSelected: 0 };
  const b = { name: "b", inFlight: 0, busyWorkers: 0, workerCount: 1, lastSelected: 0 };
  if (selectNode([a, b], "a")?.name !== "a") throw new Error("preferred, though busier");
  if (selectNode([a, b], "gone")?.name !== "b") throw new Error("the less loaded");
  if (selectNode([], "a") !== null) throw new Error();
});

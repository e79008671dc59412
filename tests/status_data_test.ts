/**
 * `/status/data` on a simulated-GPU server with fresh workers: a retiring worker's teardown is a
 * hold of its own on the lease timeline (handed over from its request), context creations are
 * holds of their own, and no request's hold overlaps any other hold.
 */
import assert from "node:assert/strict";
import { Client, Program } from "../mod.ts";
import type { ServerStatusData } from "../server/status.ts";
import { assertRequestHoldsAlone, startServer } from "./_server.ts";

Deno.test("status data: teardowns and context creations are their own holds; a request's never overlaps", async () => {
  const server = await startServer({
    device: "gpu",
    simulateGpus: true,
    gpus: [0],
    workersPerGpu: 2,
    maxRequestsPerWorker: 1,
  });
  try {
    await using client = new Client(server.url);
    for (let i = 0; i < 4; i++) {
      const program = new Program();
      const mod = program.upload({ kind: "module", source: "def f():\n    return 1\n" });
      program.return_({
        key: "out",
        value: program.run({ fn: program.getFunction({ module: mod, name: "f" }), args: [] }),
      });
      assert.equal((await client.execute(program)).completed, true);
    }
    await server.pool.settled();
    const data: ServerStatusData = await (await fetch(`${server.url}/status/data`)).json();
    const gpu = data.gpus[0];
    assert.deepEqual(gpu.holders, [], "nothing holds the GPU once the pool is settled");
    const teardowns = gpu.holds.filter((h) => h.teardown);
    const requests = gpu.holds.filter((h) => !h.teardown && !h.initialization);
    assert.equal(requests.length, 4);
    assert.equal(teardowns.length, 4, JSON.stringify(gpu.holds));
    assert.ok(teardowns.every((h) => h.id.startsWith("teardown:") && !h.initialization));
    assert.ok(gpu.holds.some((h) => h.initialization), "replacement contexts are holds too");
    for (const request of requests) {
      // Each request's teardown starts where its hold ends (handed over, no gap).
      assert.ok(teardowns.some((t) => t.id === `teardown:${request.id}` && t.from === request.to));
    }
    assertRequestHoldsAlone(gpu.holds);
  } finally {
    await server.stop();
  }
});

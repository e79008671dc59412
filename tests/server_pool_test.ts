/**
 * Worker pool and GPU leases end to end, with simulated GPUs (issue 4): serialization on one
 * GPU, cpu_only phases releasing the lease, load counters, poisoned workers, GPU sets.
 */
import assert from "node:assert/strict";
import {
  assertRequestHoldsAlone,
  callProgram,
  OUTLIVE_ANSWER,
  postProgram,
  startServer,
  type StatusHolds,
  type TestServer,
} from "./_server.ts";
import type { ServerConfig } from "../server/config.ts";
import type { ServerStatusData } from "../server/status.ts";

type Body = Record<string, unknown> & {
  request_id: string;
  lease_wait_ms: number;
  lease_held_ms: number;
  queue_ms: number;
  elapsed_ms: number;
};

const SLEEP_ON_GPU = "import time\ndef f(s):\n    time.sleep(s)\n    return s\n";

/**
 * `gpu(s)` sleeps on the GPU; `wait_for_peer(marker, go)`, run as cpu_only, makes the file
 * `marker`, then waits (at most 20 s) for the file `go`: whether it came.
 */
const GPU_THEN_PEER = `import os, time
def gpu(s):
    time.sleep(s)
    return s
def wait_for_peer(marker, go):
    open(marker, "w").close()
    for _ in range(400):
        if os.path.exists(go):
            return True
        time.sleep(0.05)
    return False
`;

/**
 * A program whose cpu_only step waits for the test between two GPU steps (`GPU_THEN_PEER`),
 * returning as `released` whether the test let it go on.
 */
function cpuOnlyBetweenGpuSteps(marker: string, go: string) {
  return {
    instructions: [
      { op: "upload", id: "m", kind: "module", source: GPU_THEN_PEER },
      { op: "get_function", id: "gpu", module: { $ref: "m" }, name: "gpu" },
      {
        op: "get_function",
        id: "cpu",
        module: { $ref: "m" },
        name: "wait_for_peer",
        cpu_only: true,
      },
      { op: "run", id: "r1", fn: { $ref: "gpu" }, args: [0.05] },
      { op: "run", id: "r2", fn: { $ref: "cpu" }, args: [marker, go] },
      { op: "run", id: "r3", fn: { $ref: "gpu" }, args: [0.05] },
      { op: "return", key: "released", value: { $ref: "r2" } },
    ],
  };
}

const _exists = (path: string) => {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
};

/** The finished lease holds on GPU `gpu` (`/status/data`), once the pool is settled. */
async function settledHolds(server: TestServer, gpu: number): Promise<StatusHolds> {
  await server.pool.settled();
  const data: ServerStatusData = await (await fetch(`${server.url}/status/data`)).json();
  return data.gpus.find((g) => g.id === gpu)!.holds;
}

/** The index of request `id`'s `event` in the server's event log (-1: none). */
function eventIndex(server: TestServer, event: string, id: unknown): number {
  return server.events.findIndex((e) => e.event === event && e.request_id === id);
}

/** Asserts that request `peer`'s holds on a GPU all lie between two holds of request `outer`. */
function assertHeldBetween(holds: StatusHolds, outer: string, peer: string): void {
  const around = holds.filter((h) => h.id === outer);
  const inside = holds.filter((h) => h.id === peer);
  assert.ok(inside.length > 0, `no hold of ${peer}: ${JSON.stringify(holds)}`);
  for (const h of inside) {
    assert.ok(
      around.some((a) => a.to <= h.from) && around.some((a) => a.from >= h.to),
      `${peer} did not hold the GPU between two holds of ${outer}: ${JSON.stringify(holds)}`,
    );
  }
}

/** A simulated-GPU server: one GPU, two reused workers, unless `config` says otherwise. */
function _simGpuServer(config: Partial<ServerConfig> = {}): Promise<TestServer> {
  return startServer({
    device: "gpu",
    simulateGpus: true,
    gpus: [0],
    workersPerGpu: 2,
    maxRequestsPerWorker: 0,
    ...config,
  });
}

async function _waitFor(condition: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error("condition not reached in time");
    await new Promise((r) => setTimeout(r, 5));
  }
}

Deno.test("pool: two GPU requests on one GPU with two workers serialize on the lease", async () => {
  const server = await _simGpuServer();
  try {
    const program = callProgram(SLEEP_ON_GPU, "f", [0.5]);
    const bodies = (await Promise.all([
      postProgram(server.url, program),
      postProgram(server.url, program),
    ])).map((r) => r.json as Body);
    for (const body of bodies) assert.equal(body.status, "COMPLETED");
    // Both found a worker at once: each was routed before either finished.
    const ids = bodies.map((body) => body.request_id);
    const routed = ids.map((id) => eventIndex(server, "request_routed", id));
    const finished = ids.map((id) => eventIndex(server, "request_finished", id));
    assert.ok(routed.every((i) => i >= 0) && finished.every((i) => i >= 0));
    assert.ok(Math.max(...routed) < Math.min(...finished), "a request waited for a worker");
    // One lease: one hold each, one after the other; the second one waited for it.
    const holds = (await settledHolds(server, 0)).filter((h) => ids.includes(h.id));
    assert.equal(holds.length, 2, JSON.stringify(holds));
    assertRequestHoldsAlone(holds);
    const second = bodies.find((body) => body.request_id === holds.at(-1)!.id)!;
    assert.ok(second.lease_wait_ms > 0, `the second waited ${second.lease_wait_ms} ms`);
  } finally {
    await server.stop();
  }
});

Deno.test("pool: a cpu_only phase releases the lease to a waiting peer", async () => {
  const server = await _simGpuServer();
  try {
    // a's cpu_only step waits for b's answer: b can only have run while a's step went on
    // off-lease (a's next GPU step comes after it).
    const dir = await Deno.makeTempDir();
    try {
      const [marker, go] = [`${dir}/in_cpu_only`, `${dir}/go`];
      const a = postProgram(server.url, cpuOnlyBetweenGpuSteps(marker, go));
      await _waitFor(() => _exists(marker));
      const b = await postProgram(server.url, callProgram(SLEEP_ON_GPU, "f", [0.2]));
      Deno.writeTextFileSync(go, "");
      const bBody = b.json as Body;
      assert.equal(bBody.status, "COMPLETED");
      const aBody = (await a).json as Body;
      assert.equal(aBody.status, "COMPLETED");
      assert.deepEqual(aBody.results, { released: { type: "boolean", value: true } });
      assertHeldBetween(await settledHolds(server, 0), aBody.request_id, bBody.request_id);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  } finally {
    await server.stop();
  }
});

Deno.test("pool: load counters while busy; capacity excludes nothing when idle", async () => {
  const server = await _simGpuServer();
  try {
    const program = callProgram(SLEEP_ON_GPU, "f", [0.6]);
    const running = [0, 1, 2].map(() => postProgram(server.url, program));
    await _waitFor(() => server.app.health().load.requests_waiting === 1);
    assert.deepEqual(server.app.health().load, {
      request_capacity: 2,
      requests_in_progress: 2,
      requests_waiting: 1,
    });
    const results = await Promise.all(running);
    assert.ok(results.every((r) => r.status === 200));
    // The third request got a worker only after another request had finished.
    const ids = results.map((r) => r.json.request_id);
    const lastRouted = Math.max(...ids.map((id) => eventIndex(server, "request_routed", id)));
    const firstFinished = Math.min(...ids.map((id) => eventIndex(server, "request_finished", id)));
    assert.ok(firstFinished >= 0 && lastRouted > firstFinished, "the third request waited");
    // A seat is busy until the worker's reuse hygiene after the answer is done.
    await server.pool.settled();
    assert.deepEqual(server.app.health().load, {
      request_capacity: 2,
      requests_in_progress: 0,
      requests_waiting: 0,
    });
  } finally {
    await server.stop();
  }
});

Deno.test("pool: fresh mode replaces workers; capacity counts only ready ones", async () => {
  const server = await _simGpuServer({ maxRequestsPerWorker: 1 });
  try {
    const r = await postProgram(server.url, callProgram("def f():\n    return 1\n", "f"));
    assert.equal(r.status, 200);
    await server.pool.settled();
    assert.equal(server.app.health().load.request_capacity, 2);
    const retired = server.events.filter((e) => e.event === "worker_retired");
    assert.equal(retired.length, 1);
    assert.equal(retired[0].reason, "request_limit");
    const ready = server.events.filter((e) => e.event === "worker_ready");
    assert.equal(ready.length, 3, "two at start, one replacement");
    assert.ok(server.events.some((e) => e.event === "worker_exited"));
  } finally {
    await server.stop();
  }
});

Deno.test("pool: a poisoned worker is replaced and the next request succeeds", async () => {
  const server = await _simGpuServer({ workersPerGpu: 1 });
  try {
    // The program breaks interpreter state the worker must reset (linecache), so reset fails.
    const poison = callProgram(
      "import linecache, os\ndef f():\n    linecache.cache = None\n    return os.getpid()\n",
      "f",
    );
    const first = await postProgram(server.url, poison);
    assert.equal(first.json.status, "COMPLETED");
    await server.pool.settled();
    const retired = server.events.filter((e) => e.event === "worker_retired");
    assert.equal(retired.at(-1)?.reason, "poisoned_context");
    const next = await postProgram(
      server.url,
      callProgram("import os\ndef f():\n    return os.getpid()\n", "f"),
    );
    assert.equal(next.json.status, "COMPLETED");
    const pid = (x: { json: Record<string, unknown> }) =>
      (x.json.results as { out: { value: number } }).out.value;
    assert.notEqual(pid(next), pid(first));
  } finally {
    await server.stop();
  }
});

Deno.test("pool: a fresh worker whose program keeps it from exiting is killed after the grace", async () => {
  // The program's process cannot exit after its answer: the exit's flush of the streams, which
  // the program replaced from a thread, never returns. Its teardown holds the GPU's lease and its
  // seat; the server kills it after the termination grace and the next request runs.
  const graceSeconds = 1;
  const server = await _simGpuServer({
    workersPerGpu: 1,
    maxRequestsPerWorker: 1,
    workerTerminationGraceSeconds: graceSeconds,
  });
  try {
    const stuck = callProgram(
      `${OUTLIVE_ANSWER}\ndef f():\n    outlive_answer(3600)\n    return 1\n`,
      "f",
    );
    const first = await postProgram(server.url, stuck);
    assert.equal(first.json.status, "COMPLETED", JSON.stringify(first.json.error));
    // Only the stuck worker's kill frees the one seat: the next request's answer, before a
    // guard far short of the program's hour, says it came.
    let timer: ReturnType<typeof setTimeout> | undefined;
    const next = await Promise.race([
      postProgram(server.url, callProgram("def f():\n    return 2\n", "f")),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          // Else stopping the server would wait on the stuck worker too.
          for (const seat of server.pool.seats) seat.slot?.destroy();
          reject(new Error("the next request never ran"));
        }, 15_000);
      }),
    ]).finally(() => clearTimeout(timer));
    assert.equal(next.json.status, "COMPLETED", JSON.stringify(next.json.error));
    // The kill came no sooner than the configured grace (the option's meaning).
    const exited = server.events.find((e) => e.event === "worker_exited");
    assert.ok(Number(exited?.teardown_ms) >= graceSeconds * 1000, JSON.stringify(exited));
  } finally {
    await server.stop();
  }
});

Deno.test("pool: GPU sets on 4 simulated GPUs", async (t) => {
  const server = await _simGpuServer({ gpus: [0, 1, 2, 3] });
  try {
    await t.step("a set request sees exactly its GPUs and reports gpu_ids", async () => {
      const r = await postProgram(server.url, {
        ...callProgram(
          "import os\ndef f():\n    return os.environ['CUDA_VISIBLE_DEVICES']\n",
          "f",
        ),
        options: { gpu_count: 2 },
      });
      assert.equal(r.status, 200);
      assert.equal(r.json.status, "COMPLETED");
      const ids = r.json.gpu_ids as number[];
      assert.equal(r.json.gpu_count, 2);
      assert.equal(ids.length, 2);
      const visible = (r.json.results as { out: { value: string } }).out.value;
      assert.deepEqual(visible.split(","), ids.map((i) => `sim-${i}`));
    });

    await t.step("gpu_count above the configured GPUs is 400", async () => {
      const r = await postProgram(server.url, {
        ...callProgram("def f():\n    return 1\n", "f"),
        options: { gpu_count: 5 },
      });
      assert.equal(r.status, 400);
    });

    await t.step("a waiting set is not starved by single-GPU work behind it", async () => {
      const finished: string[] = [];
      const run = (name: string, body: unknown) =>
        postProgram(server.url, body).then((r) => {
          finished.push(name);
          return r;
        });
      const early = [0, 1, 2].map((i) => run(`early${i}`, callProgram(SLEEP_ON_GPU, "f", [0.8])));
      await _waitFor(() => server.app.health().load.requests_in_progress === 3);
      const set = run("set", {
        ...callProgram(SLEEP_ON_GPU, "f", [0.3]),
        options: { gpu_count: 4 },
      });
      await new Promise((r) => setTimeout(r, 150));
      const late = [0, 1].map((i) => run(`late${i}`, callProgram(SLEEP_ON_GPU, "f", [0.1])));
      const setBody = (await set).json as Body;
      await Promise.all([...early, ...late]);
      assert.equal(setBody.status, "COMPLETED");
      assert.deepEqual(setBody.gpu_ids, [0, 1, 2, 3]);
      const setIndex = finished.indexOf("set");
      assert.ok(finished.indexOf("late0") > setIndex, `order ${finished}`);
      assert.ok(finished.indexOf("late1") > setIndex, `order ${finished}`);
    });

    await t.step(
      "a cpu_only call releases the whole set; the next GPU step re-takes it",
      async () => {
        // The set's cpu_only step waits for the single request's answer: a single GPU was
        // free meanwhile, and the set took all four again after it.
        const dir = await Deno.makeTempDir();
        try {
          const [marker, go] = [`${dir}/in_cpu_only`, `${dir}/go`];
          const set = postProgram(server.url, {
            ...cpuOnlyBetweenGpuSteps(marker, go),
            options: { gpu_count: 4 },
          });
          await _waitFor(() => _exists(marker));
          const single = await postProgram(server.url, callProgram(SLEEP_ON_GPU, "f", [0.05]));
          Deno.writeTextFileSync(go, "");
          assert.equal(single.json.status, "COMPLETED");
          const setBody = (await set).json as Body;
          assert.equal(setBody.status, "COMPLETED");
          assert.deepEqual(setBody.gpu_ids, [0, 1, 2, 3]);
          assert.deepEqual(setBody.results, { released: { type: "boolean", value: true } });
          const singleId = (single.json as Body).request_id;
          const held = [];
          for (const gpu of [0, 1, 2, 3]) {
            const holds = await settledHolds(server, gpu);
            if (!holds.some((h) => h.id === singleId)) continue;
            held.push(gpu);
            assertHeldBetween(holds, setBody.request_id, singleId);
          }
          assert.equal(held.length, 1, "the single request held one GPU");
        } finally {
          await Deno.remove(dir, { recursive: true });
        }
      },
    );
  } finally {
    await server.stop();
  }
});

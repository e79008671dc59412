/**
 * A routed deployment for real, on loopback (seed 003): `kcoral router` and CPU nodes started
 * with `kcoral server --router ... --node-id ...` as processes (each a supervisor, its server
 * and the server's Python workers). Clients: raw HTTP, the TypeScript client and `kcoral run`.
 */
import assert from "node:assert/strict";
import { Client } from "../mod.ts";
import { sha256Hex } from "../protocol/hash.ts";
import { callProgram, postProgram } from "./_server.ts";
import {
  KcoralProcess,
  parseLogLine,
  routerHealth,
  startNode,
  startRouter,
  type TestNode,
  waitForCapacity,
  waitUntil,
} from "./_router.ts";
import { trivialProgram } from "../bench/_programs.ts";
import { FakeNode } from "./_fake_node.ts";

const SLEEP = "import time\ndef f(s):\n    time.sleep(s)\n    return s\n";

/** A program that uploads one bytes blob and returns its length. */
function blobProgram(sha: string) {
  return {
    instructions: [
      { op: "upload", id: "m", kind: "module", source: "def n(b):\n    return len(b)\n" },
      { op: "upload", id: "b", kind: "bytes", blob: sha },
      { op: "get_function", id: "f", module: { $ref: "m" }, name: "n" },
      { op: "run", id: "r", fn: { $ref: "f" }, args: [{ $ref: "b" }] },
      { op: "return", key: "n", value: { $ref: "r" } },
    ],
  };
}

/** The server pid its supervisor last started. */
function serverPid(node: TestNode): number {
  const started = node.process.lines.filter((l) => /started KCoral Server \(pid \d+\)/.test(l));
  return Number(/pid (\d+)/.exec(started.at(-1)!)![1]);
}

function alive(pid: number): boolean {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    return stat.split(") ")[1][0] !== "Z";
  } catch {
    return false;
  }
}

Deno.test({
  name: "routed: two nodes behind one Router serve clients as one server",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn(t) {
    const router = await startRouter([], { KCORAL_NODE_TOKEN: "s3cret" });
    const nodes: TestNode[] = [];
    try {
      await t.step("/health is 503 with no node", async () => {
        const { status, body } = await routerHealth(router.url);
        assert.equal(status, 503);
        assert.equal(body.status, "unavailable");
        assert.equal(body.load.request_capacity, 0);
      });
      // Token by flag on one node and by variable on the other.
      nodes.push(
        await startNode(router.url, "cpu-a", { workers: 2, extra: ["--node-token", "s3cret"] }),
      );
      nodes.push(await startNode(router.url, "cpu-b", { env: { KCORAL_NODE_TOKEN: "s3cret" } }));
      await waitForCapacity(router.url, 3);

      await t.step("/health sums the nodes' capacity", async () => {
        const { status, body } = await routerHealth(router.url);
        assert.equal(status, 200);
        assert.equal(body.status, "ok");
        assert.deepEqual(body.load, {
          request_capacity: 3,
          requests_in_progress: 0,
          requests_waiting: 0,
        });
        assert.equal(body.gpu_count, null);
        // The shape of a server's own /health, and the nodes' target and versions.
        const direct = await (await fetch(`http://127.0.0.1:${nodes[0].port}/health`)).json();
        assert.deepEqual(Object.keys(body).sort(), Object.keys(direct).sort());
        assert.deepEqual(body.target, direct.target);
        assert.deepEqual(body.versions, direct.versions);
      });

      await t.step("requests spread over both nodes", async () => {
        const seen: Record<string, number> = {};
        for (let i = 0; i < 16; i++) {
          const { status, headers, json } = await postProgram(
            router.url,
            callProgram("def f(x):\n    return x + 1\n", "f", [i]),
          );
          assert.equal(status, 200, JSON.stringify(json));
          const node = headers.get("x-kcoral-node")!;
          seen[node] = (seen[node] ?? 0) + 1;
          assert.equal(headers.get("x-request-id"), json.request_id);
        }
        assert.ok((seen["cpu-a"] ?? 0) >= 3 && (seen["cpu-b"] ?? 0) >= 2, JSON.stringify(seen));
      });

      await t.step(
        "a node's ERROR answer crosses the Router with its length, not chunked",
        async () => {
          // A malformed program: the node's pipeline refuses it (400 parse).
          const response = await fetch(`${router.url}/execute`, {
            method: "POST",
            body: "{not json",
            headers: { "content-type": "application/json" },
          });
          const body = await response.bytes();
          assert.equal(response.status, 400);
          assert.equal(JSON.parse(new TextDecoder().decode(body)).status, "ERROR");
          assert.ok(response.headers.get("x-kcoral-node"), "answered by a node");
          assert.equal(response.headers.get("transfer-encoding"), null);
          assert.equal(response.headers.get("content-length"), String(body.length));
        },
      );

      await t.step("a CACHE_MISS retry lands on the node that answered the miss", async () => {
        for (let i = 0; i < 4; i++) {
          const blob = crypto.getRandomValues(new Uint8Array(1000 + i));
          const sha = sha256Hex(blob);
          const miss = await postProgram(router.url, blobProgram(sha));
          assert.equal(miss.status, 200);
          assert.equal(miss.json.status, "CACHE_MISS");
          const node = miss.headers.get("x-kcoral-node")!;
          const hit = await postProgram(router.url, blobProgram(sha), {
            headers: { "x-kcoral-node": node },
            blobs: { [sha]: blob },
          });
          assert.equal(hit.status, 200, JSON.stringify(hit.json));
          assert.equal(hit.headers.get("x-kcoral-node"), node);
          assert.deepEqual(hit.json.results, { n: { type: "integer", value: 1000 + i } });
          assert.notEqual(hit.json.request_id, miss.json.request_id, "one id per attempt");
        }
      });

      await t.step("the TypeScript client and kcoral run work through the Router", async () => {
        await using client = new Client(router.url);
        const result = await client.execute(trivialProgram());
        assert.equal(result.get("y"), 42);
        const run = new KcoralProcess(["run", "python", "--", "-c", "print('routed', 6 * 7)"], {
          KCORAL_URL: router.url,
        });
        const status = await run.status;
        assert.equal(status.code, 0, run.lines.join("\n"));
        assert.ok(run.lines.includes("routed 42"), run.lines.join("\n"));
      });

      await t.step("one request can be followed from the Router into the node's log", async () => {
        const { headers, json } = await postProgram(
          router.url,
          callProgram("def f():\n    return 1\n", "f"),
        );
        const id = json.request_id as string;
        const node = nodes.find((n) => n.nodeId === headers.get("x-kcoral-node"))!;
        await waitUntil(
          "the router's line",
          () => router.finished().some((f) => f.request_id === id),
        );
        const line = router.finished().find((f) => f.request_id === id)!;
        assert.equal(line.node, node.nodeId);
        assert.equal(line.finish_reason, "completed");
        await waitUntil(
          "the node's events",
          () => node.events().some((e) => e.event === "request_finished" && e.request_id === id),
        );
      });

      await t.step("a node with a wrong token is refused and never counted", async () => {
        const intruder = await startNode(router.url, "cpu-x", { extra: ["--node-token", "wrong"] });
        try {
          await router.process.waitForLine(/node_link_refused .*invalid node bearer token/);
          await new Promise((resolve) => setTimeout(resolve, 500));
          assert.equal((await routerHealth(router.url)).body.load.request_capacity, 3);
        } finally {
          assert.equal((await intruder.stop()).code, 0);
        }
      });

      await t.step(
        "SIGTERM on a node finishes its request in flight, then it exits 0",
        async () => {
          const accepted = () =>
            nodes[1].events().filter((e) => e.event === "request_accepted").length;
          const before = accepted();
          const running = postProgram(router.url, callProgram(SLEEP, "f", [1.5]), {
            headers: { "x-kcoral-node": "cpu-b" },
          });
          // This request (not an earlier one) has reached cpu-b's pipeline.
          await waitUntil("the request runs on cpu-b", () => accepted() > before);
          const node = nodes.pop()!;
          const server = serverPid(node);
          const stopping = node.stop();
          const { status, headers, json } = await running;
          assert.equal(status, 200, JSON.stringify(json));
          assert.equal(headers.get("x-kcoral-node"), "cpu-b");
          assert.equal(json.status, "COMPLETED");
          assert.equal((await stopping).code, 0);
          assert.ok(!alive(server), "the node's server outlived its supervisor");
          await waitForCapacity(router.url, 2);
        },
      );
    } finally {
      for (const node of nodes) await node.stop();
      await router.stop();
    }
  },
});

Deno.test({
  name: "routed: failures — a killed server, a frozen node, a full queue, a restart",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn(t) {
    const router = await startRouter([
      "--max-status-age-seconds",
      "1.5",
      "--node-retention-seconds",
      "30",
      "--max-queued-requests",
      "1",
      "--queue-wait-timeout-seconds",
      "1",
    ]);
    const nodes: TestNode[] = [];
    try {
      nodes.push(await startNode(router.url, "cpu-a"));
      nodes.push(await startNode(router.url, "cpu-b"));
      await waitForCapacity(router.url, 2);

      await t.step("queue full: 503 router_busy; wait expired: 503 no_node", async () => {
        const hold = [0, 1].map((i) =>
          postProgram(router.url, callProgram(SLEEP, "f", [2]), {
            headers: { "x-kcoral-node": i ? "cpu-b" : "cpu-a" },
          })
        );
        await waitUntil(
          "both busy",
          async () => (await routerHealth(router.url)).body.load.requests_in_progress === 2,
        );
        const queued = postProgram(router.url, callProgram(SLEEP, "f", [0]));
        await waitUntil(
          "one waiting",
          async () => (await routerHealth(router.url)).body.load.requests_waiting === 1,
        );
        const busy = await postProgram(router.url, callProgram(SLEEP, "f", [0]));
        assert.equal(busy.status, 503);
        assert.equal(busy.headers.get("retry-after"), "1");
        assert.equal((busy.json.error as Record<string, string>).kind, "router_busy");
        const timedOut = await queued;
        assert.equal(timedOut.status, 503);
        assert.equal((timedOut.json.error as Record<string, string>).kind, "no_node");
        for (const held of await Promise.all(hold)) assert.equal(held.status, 200);
      });

      await t.step(
        "a server killed mid-request: 502, not replayed, restarted, rejoins",
        async () => {
          const victim = nodes[0];
          const pid = serverPid(victim);
          // Earlier steps' requests left their own events: this one is the next accepted.
          const accepted = () => victim.events().filter((e) => e.event === "request_accepted");
          const before = accepted().length;
          const running = postProgram(router.url, callProgram(SLEEP, "f", [5]), {
            headers: { "x-kcoral-node": "cpu-a" },
          });
          await waitUntil("the request runs on cpu-a", () => accepted().length > before);
          Deno.kill(pid, "SIGKILL");
          const { status, json } = await running;
          assert.equal(status, 502);
          const error = json.error as Record<string, string>;
          assert.equal(error.kind, "server_transport");
          assert.match(error.message, /not retried/);
          const id = json.request_id as string;
          assert.ok(
            !nodes[1].events().some((e) => e.request_id === id),
            "replayed on cpu-b",
          );
          await victim.process.waitForLine(/restarting KCoral Server/);
          await waitUntil("a new server", () => serverPid(victim) !== pid);
          await waitForCapacity(router.url, 2);
          const again = await postProgram(router.url, callProgram(SLEEP, "f", [0]), {
            headers: { "x-kcoral-node": "cpu-a" },
          });
          assert.equal(again.status, 200);
          assert.equal(again.headers.get("x-kcoral-node"), "cpu-a");
        },
      );

      await t.step("a frozen node is dropped after the status age, and comes back", async () => {
        const frozen = nodes[1];
        frozen.process.kill("SIGSTOP");
        try {
          await router.process.waitForLine(/node_unhealthy node=cpu-b/);
          await waitForCapacity(router.url, 1);
          const { headers } = await postProgram(router.url, callProgram(SLEEP, "f", [0]), {
            headers: { "x-kcoral-node": "cpu-b" },
          });
          assert.equal(headers.get("x-kcoral-node"), "cpu-a");
        } finally {
          frozen.process.kill("SIGCONT");
        }
        await waitForCapacity(router.url, 2);
      });

      await t.step("a node killed outright and started again keeps one record", async () => {
        const old = nodes.pop()!;
        const oldServer = serverPid(old);
        old.process.kill("SIGKILL");
        Deno.kill(oldServer, "SIGKILL");
        await old.process.status;
        await waitUntil("the old server is gone", () => !alive(oldServer));
        const fresh = await startNode(router.url, "cpu-b", { workers: 2 });
        nodes.push(fresh);
        let most = 0;
        await waitUntil("capacity 3", async () => {
          const capacity = (await routerHealth(router.url)).body.load.request_capacity;
          most = Math.max(most, capacity);
          return capacity === 3;
        });
        await new Promise((resolve) => setTimeout(resolve, 1000));
        most = Math.max(most, (await routerHealth(router.url)).body.load.request_capacity);
        assert.equal(most, 3, "capacity counted twice");
        await Deno.remove(old.logDir, { recursive: true }).catch(() => {});
      });

      await t.step("the Router's log has one request_finished per attempt", () => {
        const ids = router.finished().map((f) => f.request_id);
        assert.equal(new Set(ids).size, ids.length);
        assert.ok(
          router.process.lines.every((l) =>
            !/ request_finished /.test(l) || parseLogLine(l).finish_reason
          ),
        );
      });
    } finally {
      for (const node of nodes) await node.stop();
      await router.stop();
    }
  },
});

Deno.test("routed: an answer its node cuts short reaches the client cut, with no stack trace on the Router's console", async () => {
  const router = await startRouter();
  const node = new FakeNode(router.url, "gpu-a");
  try {
    await node.connect();
    await node.openSlot(async (request) => {
      await request.body();
      request.respond(200, [["content-type", "application/octet-stream"]]);
      await request.write(new Uint8Array(1000));
      request.socket.close(); // gone mid-answer
    });
    await waitForCapacity(router.url, 1);
    const response = await fetch(`${router.url}/execute`, { method: "POST", body: "x" });
    assert.equal(response.status, 200);
    await assert.rejects(() => response.arrayBuffer());
    await router.process.waitForLine(/request_finished .*finish_reason=tunnel_disconnected/);
    const traces = router.process.lines.filter((line) => /TunnelError|^\s+at /.test(line));
    assert.deepEqual(traces, []);
  } finally {
    node.close();
    await router.stop();
  }
});

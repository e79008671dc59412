/**
 * The node supervisor end to end (node/supervisor/supervisor.ts, spec router §5, §6.2 items
 * 8–10, §6.3 `test_node_processes.py`): a real supervisor runs a real child process (the fake
 * server of tests/fixtures/supervisor/fake_server.ts, a Deno program serving
 * `/internal/worker-status`) and reports to a fake Router over a real WebSocket. Shutdown is
 * driven through the AbortSignal that the CLI aborts on SIGTERM/SIGINT.
 *
 * Past 400 lines because each scenario of the upstream acceptance tests is one test here, with
 * the shared harness (`supervise`) at the top.
 */
import assert from "node:assert/strict";
import { probeOrigin } from "../node/supervisor/probe.ts";
import {
  nodeServerEnv,
  runSupervisor,
  SHUTTING_DOWN,
  STARTING,
  type SupervisorOptions,
} from "../node/supervisor/supervisor.ts";
import {
  exists,
  fakeRouter,
  fakeServerCommand,
  freePort,
  isAlive,
  readRecord,
  waitFor,
} from "./fixtures/supervisor/helpers.ts";

/** One supervised fake server, its fake Router, and what they recorded. */
async function supervise(args: string[], overrides: Partial<SupervisorOptions> = {}) {
  const dir = await Deno.makeTempDir();
  const recordFile = `${dir}/record`;
  const port = freePort();
  const router = fakeRouter({ token: overrides.nodeToken ?? null });
  const stop = new AbortController();
  const lines: { at: number; line: string }[] = [];
  const env = nodeServerEnv({
    routerEndpoint: router.url,
    nodeId: "gpu-a",
    nodeToken: overrides.nodeToken ?? null,
    host: "127.0.0.1",
    port,
  });
  const done = runSupervisor({
    nodeId: "gpu-a",
    routerEndpoint: router.url,
    nodeToken: null,
    serverUrl: probeOrigin("127.0.0.1", port),
    child: fakeServerCommand(["--record", recordFile, "--fail-file", `${dir}/fail`, ...args], env),
    childStdio: "null",
    healthIntervalSeconds: 0.05,
    healthTimeoutSeconds: 1,
    failureThreshold: 3,
    startupGraceSeconds: 10,
    stableResetSeconds: 60,
    terminationGraceSeconds: 2,
    restartMinDelaySeconds: 0.05,
    restartMaxDelaySeconds: 0.2,
    restartJitter: 0,
    controlReconnectMinDelaySeconds: 0.05,
    controlReconnectMaxDelaySeconds: 0.1,
    signal: stop.signal,
    log: (line) => lines.push({ at: performance.now(), line }),
    ...overrides,
  });
  let code: number | null = null;
  const finish = async () => {
    stop.abort();
    // A supervisor that does not finish in time has its servers killed, so the test ends
    // (and fails on its exit status or log) rather than hanging.
    const rescue = setTimeout(() => {
      for (const start of readRecord(recordFile).filter((l) => l[0] === "start")) {
        try {
          Deno.kill(Number(start[1]), "SIGKILL");
        } catch { /* gone */ }
      }
    }, 20_000);
    code = await done;
    clearTimeout(rescue);
    await router.close();
    return code;
  };
  return {
    /** While this file exists, the server's health fails. */
    failFile: `${dir}/fail`,
    port,
    router,
    done,
    lines,
    log: () => lines.map((l) => l.line).join("\n"),
    record: () => readRecord(recordFile),
    /** The `start` lines: [_, pid, instance_id, survivors=...]. */
    starts: () => readRecord(recordFile).filter((l) => l[0] === "start"),
    escapers: () =>
      readRecord(recordFile).filter((l) => l[0] === "escaper").map((l) => Number(l[1])),
    /** Shuts the supervisor down; resolves with its exit status. */
    finish,
    /** Cleans up after a test, whatever happened. */
    async dispose() {
      if (code === null) await finish();
      for (const pid of readRecord(recordFile).filter((l) => l[0] === "escaper")) {
        try {
          Deno.kill(Number(pid[1]), "SIGKILL"); // only if the test failed
        } catch { /* gone, as it should be */ }
      }
      await Deno.remove(dir, { recursive: true });
    },
  };
}

const healthyOf =
  (instance: string) => (s: { server_healthy: boolean; server_instance_id: string }) =>
    s.server_healthy && s.server_instance_id === instance;

Deno.test("supervisor: a healthy server is reported and not restarted", async () => {
  const node = await supervise(["--workers", "3"], { nodeToken: "s3cret" });
  try {
    await waitFor("a start", () => node.starts().length === 1);
    const instance = node.starts()[0][2];
    await waitFor("a healthy report", () => node.router.statuses().some(healthyOf(instance)));
    const healthyAt = node.router.statuses().length;
    // Ten more probe intervals, each a probe and a report.
    await waitFor("more reports", () => node.router.statuses().length >= healthyAt + 10);
    assert.equal(node.starts().length, 1);
    assert.ok(!node.log().includes("restarting"), node.log());

    const statuses = node.router.statuses();
    const [first] = statuses;
    assert.equal(first.node_id, "gpu-a");
    assert.equal(first.server_healthy, false); // starting, or its first probes failed
    assert.ok(first.last_error !== "");
    assert.equal(first.health_age_millis, null);
    assert.equal(first.server_instance_id, "");
    const last = statuses.at(-1)!;
    assert.deepEqual({ ...last, health_age_millis: 0 }, {
      t: "status",
      node_id: "gpu-a",
      server_healthy: true,
      supervisor_instance_id: first.supervisor_instance_id,
      server_instance_id: instance,
      worker_count: 3,
      busy_workers: 0,
      target: { arch: "fake" },
      versions: { fake: "1" },
      last_error: "",
      health_age_millis: 0,
    });
    assert.ok(last.health_age_millis! >= 0 && last.health_age_millis! < 5_000);
    assert.equal(new Set(statuses.map((s) => s.supervisor_instance_id)).size, 1);
    assert.equal(node.router.connections.length, 1);
    assert.equal(node.router.connections[0].authorization, "Bearer s3cret");
    assert.ok(
      node.log().includes(
        "kcoral supervisor [gpu-a]: connected outbound supervisor control stream",
      ),
    );
    assert.equal(await node.finish(), 0);
  } finally {
    await node.dispose();
  }
});

Deno.test("supervisor: a server that crashes is restarted, its escaped descendants killed first", async () => {
  const node = await supervise(["--crash-after-ms", "300", "--escapers"]);
  try {
    await waitFor("three starts", () => node.starts().length >= 3);
    const starts = node.starts();
    assert.equal(new Set(starts.map((s) => s[2])).size, starts.length, "fresh instance ids");
    // Each replacement saw none of the escapers of the generations before it.
    for (const start of starts) assert.equal(start[3], "survivors=none");
    assert.ok(node.escapers().length >= 4, "two escapers per generation");
    assert.match(node.log(), /KCoral Server child exited with exit status 3/);
    assert.match(
      node.log(),
      /restarting KCoral Server in 0\.05 s \(child exited with exit status 3\)/,
    );
    await waitFor(
      "the reason at the Router",
      () => node.router.statuses().some((s) => s.last_error === "child exited with exit status 3"),
    );
    // Once connected, the Router hears each replacement start.
    await waitFor(
      "a start at the Router",
      () => node.router.statuses().some((s) => s.last_error === STARTING),
    );
    assert.equal(await node.finish(), 0);
    for (const pid of node.escapers()) assert.ok(!exists(pid), `escaper ${pid} is gone`);
  } finally {
    await node.dispose();
  }
});

Deno.test("supervisor: failing health past the threshold restarts the server, SIGKILL if need be", async () => {
  const node = await supervise(["--first-ignores-sigterm", "--escapers"], {
    failureThreshold: 3,
    startupGraceSeconds: 1.5,
    terminationGraceSeconds: 0.2,
  });
  const failFile = node.failFile;
  try {
    await waitFor("a start", () => node.starts().length === 1);
    const first = node.starts()[0][2];
    await waitFor("a healthy report", () => node.router.statuses().some(healthyOf(first)));
    const escapers = node.escapers();
    assert.equal(escapers.length, 2);
    assert.ok(escapers.every(isAlive));
    await Deno.writeTextFile(failFile, "");
    await waitFor("a second start", () => node.starts().length >= 2);
    await Deno.remove(failFile); // the replacement is healthy
    const log = node.log();
    assert.match(log, /health probe failed \(1\/3\): worker status answered HTTP 500/);
    assert.match(log, /health probe failed \(3\/3\)/);
    assert.match(log, /child did not stop after SIGTERM; sending SIGKILL/);
    assert.match(log, /KCoral Server exited with signal SIGKILL/);
    assert.match(log, /restarting KCoral Server in 0\.05 s \(health probe failed 3 times: /);
    assert.equal(node.record().filter((l) => l[0] === "sigterm").length, 1);
    // The first generation's escapers were gone before the second generation started.
    assert.equal(node.starts()[1][3], "survivors=none");
    for (const pid of escapers) assert.ok(!exists(pid), `escaper ${pid} is gone`);
    const second = node.starts()[1][2];
    await waitFor(
      "the replacement's healthy report",
      () => node.router.statuses().some(healthyOf(second)),
    );
    assert.equal(await node.finish(), 0);
  } finally {
    await node.dispose();
  }
});

Deno.test("supervisor: failed probes within the startup grace are not counted", async () => {
  const node = await supervise(["--health", "fail"], {
    failureThreshold: 1,
    startupGraceSeconds: 1,
    restartMinDelaySeconds: 30,
    restartMaxDelaySeconds: 30,
  });
  try {
    await waitFor("the restart", () => node.log().includes("restarting KCoral Server"));
    const started = node.lines.find((l) => l.line.includes("started KCoral Server"))!.at;
    const restarted = node.lines.find((l) => l.line.includes("restarting KCoral Server"))!.at;
    // With a threshold of 1 only the grace kept the first failures from restarting it.
    assert.ok(restarted - started >= 1000, `${restarted - started} ms`);
    // Probing goes on during the grace (every failure reported), only counting does not.
    const during = node.lines.filter((l) => l.line.includes("failed during startup grace"));
    assert.ok(during.length >= 1, node.log());
    assert.ok(during.every((l) => l.at - started < 1100));
    const failed = node.router.statuses().filter((s) => s.last_error.includes("HTTP 500"));
    assert.ok(failed.length >= 3, `${failed.length} failed probes reported`);
    assert.match(node.log(), /health probe failed \(1\/1\)/);
    // Shutdown interrupts the 30 s restart delay.
    const before = performance.now();
    assert.equal(await node.finish(), 0);
    assert.ok(performance.now() - before < 10_000);
    assert.equal(node.starts().length, 1);
  } finally {
    await node.dispose();
  }
});

Deno.test("supervisor: a stable run resets the restart backoff; unstable ones double it", async () => {
  const delays = async (stableResetSeconds: number) => {
    const node = await supervise(["--crash-after-ms", "400"], {
      stableResetSeconds,
      restartMinDelaySeconds: 0.05,
      restartMaxDelaySeconds: 0.2,
    });
    try {
      await waitFor(
        "three restarts",
        () => node.lines.filter((l) => l.line.includes("restarting")).length >= 3,
      );
      assert.equal(await node.finish(), 0);
      return node.lines.filter((l) => l.line.includes("restarting")).slice(0, 3)
        .map((l) => l.line.match(/in ([\d.]+) s/)![1]);
    } finally {
      await node.dispose();
    }
  };
  assert.deepEqual(await delays(60), ["0.05", "0.10", "0.20"]);
  assert.deepEqual(await delays(0), ["0.05", "0.05", "0.05"]);
});

Deno.test("supervisor: shutdown drains the server and kills what escaped; others survive", async () => {
  const node = await supervise(["--sigterm-delay-ms", "300", "--escapers"]);
  const unrelated = new Deno.Command("sleep", { args: ["30"] }).spawn();
  try {
    await waitFor("a start", () => node.starts().length === 1);
    const instance = node.starts()[0][2];
    await waitFor("a healthy report", () => node.router.statuses().some(healthyOf(instance)));
    const escapers = node.escapers();
    assert.equal(escapers.length, 2);
    const child = Number(node.starts()[0][1]);

    // A long request is in flight when the shutdown begins.
    const request = fetch(`http://127.0.0.1:${node.port}/slow?ms=700`).then(async (r) => ({
      status: r.status,
      text: await r.text(),
      at: performance.now(),
    }));
    await waitFor("the request at the server", () => node.record().some((l) => l[0] === "slow"));
    const abortedAt = performance.now();
    const code = await node.finish();
    const finishedAt = performance.now();
    const answer = await request;

    assert.equal(code, 0);
    assert.deepEqual([answer.status, answer.text], [200, "slow done"]);
    // The supervisor waited for the server: the request, then 0.3 s of SIGTERM handling.
    assert.ok(answer.at <= finishedAt);
    assert.ok(finishedAt - abortedAt >= 300, `${finishedAt - abortedAt} ms`);
    assert.deepEqual(node.record().filter((l) => l[0] === "sigterm" || l[0] === "exit"), [
      ["sigterm", String(child)],
      ["exit", String(child)],
    ]);
    assert.ok(!isAlive(child));
    // The Router heard "shutting down", then lost the connection while the request still ran.
    const connection = node.router.connections[0];
    assert.equal(connection.statuses.at(-1)!.last_error, SHUTTING_DOWN);
    assert.equal(connection.isClosed, true);
    assert.equal(node.router.connections.length, 1);
    assert.ok(
      connection.closedAt! < answer.at,
      "the control connection closed before the drain ended",
    );
    // Everything of the tree is gone; the unrelated process is not.
    for (const pid of escapers) assert.ok(!exists(pid), `escaper ${pid} is gone`);
    assert.ok(isAlive(unrelated.pid));
    const log = node.log();
    assert.match(log, /sending SIGTERM to KCoral Server \(pid \d+\) and waiting for it to finish/);
    assert.match(log, /killing 2 remaining server descendant\(s\)/);
    assert.ok(!log.includes("sending SIGKILL"), log);
  } finally {
    unrelated.kill("SIGKILL");
    await unrelated.status;
    await node.dispose();
  }
});

Deno.test("supervisor: a server that cannot be spawned ends the supervisor with status 1", async () => {
  const lines: string[] = [];
  const code = await runSupervisor({
    nodeId: "gpu-a",
    routerEndpoint: `http://127.0.0.1:${freePort()}`,
    nodeToken: null,
    serverUrl: "http://127.0.0.1:9/",
    child: { command: "/nonexistent/kcoral", args: [], env: {} },
    healthIntervalSeconds: 0.05,
    healthTimeoutSeconds: 1,
    failureThreshold: 3,
    startupGraceSeconds: 0,
    stableResetSeconds: 60,
    terminationGraceSeconds: 1,
    restartMinDelaySeconds: 0.05,
    restartMaxDelaySeconds: 0.1,
    restartJitter: 0,
    log: (line) => lines.push(line),
  });
  assert.equal(code, 1);
  assert.ok(lines.some((l) => l.includes("cannot start KCoral Server (/nonexistent/kcoral)")));
});

Deno.test("supervisor: invalid options are refused before any child starts", async () => {
  const file = await Deno.makeTempFile();
  await Deno.remove(file);
  const base: SupervisorOptions = {
    nodeId: "gpu-a",
    routerEndpoint: "http://127.0.0.1:9000",
    nodeToken: null,
    serverUrl: "http://127.0.0.1:8000/",
    child: { command: "touch", args: [file], env: {} },
    healthIntervalSeconds: 2,
    healthTimeoutSeconds: 1,
    failureThreshold: 3,
    startupGraceSeconds: 30,
    stableResetSeconds: 60,
    terminationGraceSeconds: 5,
    restartMinDelaySeconds: 1,
    restartMaxDelaySeconds: 30,
    restartJitter: 0.2,
    log: () => {},
  };
  const bad: [Partial<SupervisorOptions>, RegExp][] = [
    [{ nodeId: "bad name" }, /invalid node id/],
    [{ routerEndpoint: "ftp://x" }, /invalid Router endpoint/],
    [{ nodeToken: "" }, /token must not be empty/],
    [{ healthIntervalSeconds: 0 }, /healthIntervalSeconds must be positive/],
    [{ healthTimeoutSeconds: NaN }, /healthTimeoutSeconds must be positive/],
    [{ failureThreshold: 1.5 }, /failureThreshold must be an integer/],
    [{ startupGraceSeconds: -1 }, /startupGraceSeconds must be non-negative/],
    [{ restartJitter: 0.6 }, /restartJitter must be between 0 and 0.5/],
    [{ restartMinDelaySeconds: 40 }, /restartMaxDelaySeconds must not be below/],
  ];
  for (const [change, problem] of bad) {
    await assert.rejects(() => runSupervisor({ ...base, ...change }), (error: Error) => {
      assert.ok(error instanceof TypeError);
      assert.match(error.message, problem);
      return true;
    });
  }
  await assert.rejects(() => Deno.stat(file), Deno.errors.NotFound); // never spawned
});

Deno.test("supervisor: the server's environment carries the node's identity", () => {
  assert.deepEqual(
    nodeServerEnv({
      routerEndpoint: "http://10.0.0.1:9000",
      nodeId: "gpu-a",
      nodeToken: "s3cret",
      host: "[::1]",
      port: 8001,
    }),
    {
      KCORAL_NODE_SERVER: "1",
      KCORAL_ROUTER_ENDPOINT: "http://10.0.0.1:9000",
      KCORAL_NODE_ID: "gpu-a",
      KCORAL_NODE_TOKEN: "s3cret",
      KCORAL_SERVER_HOST: "::1",
      KCORAL_SERVER_PORT: "8001",
    },
  );
  const without = nodeServerEnv({
    routerEndpoint: "http://r:9000",
    nodeId: "n",
    nodeToken: null,
    host: "0.0.0.0",
    port: 8000,
  });
  assert.ok(!("KCORAL_NODE_TOKEN" in without));
  assert.equal(without.KCORAL_SERVER_HOST, "0.0.0.0");
});

/**
 * The supervisor's control connection (node/supervisor/control_link.ts, spec router §1.4)
 * against a fake Router: a snapshot at once, on every change and on every heartbeat; the
 * bearer token; the single ack; reconnection after the Router drops the connection; the
 * connect timeout; and stopping for good.
 */
import assert from "node:assert/strict";
import { ControlLink, type ControlLinkOptions, controlUrl, NodeReport } from "./control_link.ts";
import { fakeRouter, freePort, waitFor } from "../../tests/fixtures/supervisor/helpers.ts";

const HEALTH = {
  instanceId: "srv-1",
  workerCount: 2,
  busyWorkers: 1,
  target: { arch: "fake" },
  versions: { fake: "1" },
};

function link(
  report: NodeReport,
  options: Partial<ControlLinkOptions> & { routerEndpoint: string },
) {
  const lines: string[] = [];
  const control = new ControlLink({
    nodeToken: null,
    snapshot: () => report.snapshot(),
    heartbeatSeconds: 30,
    reconnectMinDelaySeconds: 0.02,
    reconnectMaxDelaySeconds: 0.05,
    log: (line) => lines.push(line),
    ...options,
  });
  const off = report.onChange(() => control.report());
  return { control, lines, stop: async () => (off(), await control.stop()) };
}

Deno.test("control link: URLs follow the Router's scheme", () => {
  assert.equal(controlUrl("http://127.0.0.1:9000"), "ws://127.0.0.1:9000/kcoral/v1/control");
  assert.equal(controlUrl("https://r.example/"), "wss://r.example/kcoral/v1/control");
  assert.throws(() => controlUrl("ftp://r.example"), TypeError);
});

Deno.test("control link: a report is a full snapshot with the probe's age at send time", () => {
  let now = 5_000;
  const report = new NodeReport("gpu-a", "sup-1", () => now);
  assert.deepEqual(report.snapshot(), {
    t: "status",
    node_id: "gpu-a",
    server_healthy: false,
    supervisor_instance_id: "sup-1",
    server_instance_id: "",
    worker_count: 0,
    busy_workers: 0,
    target: {},
    versions: {},
    last_error: "",
    health_age_millis: null,
  });
  report.markUnhealthy("KCoral Server is starting");
  assert.equal(report.snapshot().health_age_millis, null); // never probed successfully
  report.recordHealthy(HEALTH);
  now += 1_234.4;
  assert.deepEqual(report.snapshot(), {
    t: "status",
    node_id: "gpu-a",
    server_healthy: true,
    supervisor_instance_id: "sup-1",
    server_instance_id: "srv-1",
    worker_count: 2,
    busy_workers: 1,
    target: { arch: "fake" },
    versions: { fake: "1" },
    last_error: "",
    health_age_millis: 1234,
  });
  // A failure keeps the instance and capacity; the age keeps counting from the last success.
  report.markUnhealthy("health probe timed out after 1000 ms");
  now += 100;
  const failed = report.snapshot();
  assert.equal(failed.server_healthy, false);
  assert.equal(failed.server_instance_id, "srv-1");
  assert.equal(failed.worker_count, 2);
  assert.equal(failed.last_error, "health probe timed out after 1000 ms");
  assert.equal(failed.health_age_millis, 1334);
  // Snapshots are copies.
  failed.target.arch = "changed";
  assert.equal(report.snapshot().target.arch, "fake");
});

Deno.test("control link: a snapshot at once, one on each change, the ack logged once", async () => {
  const router = fakeRouter();
  const report = new NodeReport("gpu-a");
  report.markUnhealthy("KCoral Server is starting");
  const { control, lines, stop } = link(report, { routerEndpoint: router.url });
  try {
    control.start();
    await waitFor("the first status", () => router.statuses().length >= 1);
    const first = router.statuses()[0];
    assert.equal(first.node_id, "gpu-a");
    assert.equal(first.supervisor_instance_id, report.supervisorInstanceId);
    assert.equal(first.last_error, "KCoral Server is starting");
    assert.equal(first.health_age_millis, null);
    await waitFor("the ack", () => control.acknowledged);
    assert.deepEqual(lines, ["connected outbound supervisor control stream"]);

    report.recordHealthy(HEALTH); // the heartbeat is 30 s away: only a change sends now
    await waitFor("the healthy status", () => router.statuses().length >= 2);
    const healthy = router.statuses()[1];
    assert.equal(healthy.server_healthy, true);
    assert.equal(healthy.server_instance_id, "srv-1");
    assert.ok(healthy.health_age_millis !== null && healthy.health_age_millis < 5_000);
    report.markUnhealthy("Supervisor is shutting down");
    await waitFor("the shutdown status", () => router.statuses().length >= 3);
    assert.equal(router.statuses()[2].last_error, "Supervisor is shutting down");
    assert.equal(router.connections.length, 1);
    assert.equal(router.connections[0].authorization, null); // no token, no header
  } finally {
    await stop();
    await router.close();
  }
});

Deno.test("control link: heartbeats repeat the snapshot every interval, none at the start", async () => {
  const router = fakeRouter();
  let now = 0;
  const report = new NodeReport("gpu-a", undefined, () => now);
  report.recordHealthy(HEALTH);
  const sent: number[] = []; // when each snapshot was taken, i.e. sent
  const { control, stop } = link(report, {
    routerEndpoint: router.url,
    heartbeatSeconds: 0.15,
    snapshot: () => (sent.push(performance.now()), report.snapshot()),
  });
  try {
    control.start();
    await waitFor("three statuses", () => router.statuses().length >= 3);
    assert.deepEqual(router.statuses().slice(0, 3).map((s) => s.health_age_millis), [0, 0, 0]);
    now = 700; // the age is computed when each heartbeat is sent
    await waitFor(
      "a heartbeat with the new age",
      () => router.statuses().some((s) => s.health_age_millis === 700),
    );
    assert.equal(router.connections.length, 1);
    // No heartbeat at the start: the first one comes a full interval after the first status.
    assert.ok(sent[1] - sent[0] >= 140, `${sent[1] - sent[0]} ms`);
    assert.ok(sent[2] - sent[1] >= 140, `${sent[2] - sent[1]} ms`);
  } finally {
    await stop();
    await router.close();
  }
});

Deno.test("control link: the bearer token is sent; a wrong one is refused and retried", async () => {
  const router = fakeRouter({ token: "s3cret" });
  const report = new NodeReport("gpu-a");
  const wrong = link(report, { routerEndpoint: router.url, nodeToken: "nope" });
  const right = link(report, { routerEndpoint: router.url, nodeToken: "s3cret" });
  try {
    wrong.control.start();
    await waitFor("two refused attempts", () => router.refused >= 2);
    assert.equal(router.connections.length, 0);
    assert.equal(wrong.control.acknowledged, false);
    assert.ok(
      wrong.lines.some((l) => l.startsWith("control stream ended")),
      wrong.lines.join("\n"),
    );
    await wrong.stop();

    right.control.start();
    await waitFor("the ack", () => right.control.acknowledged);
    assert.equal(router.connections.length, 1);
    assert.equal(router.connections[0].authorization, "Bearer s3cret");
  } finally {
    await wrong.stop();
    await right.stop();
    await router.close();
  }
});

Deno.test("control link: reconnects after the Router drops it, with a fresh snapshot", async () => {
  const router = fakeRouter();
  const report = new NodeReport("gpu-a");
  report.recordHealthy(HEALTH);
  const { control, lines, stop } = link(report, { routerEndpoint: router.url });
  try {
    control.start();
    await waitFor("the first ack", () => control.acknowledged);
    router.dropAll();
    await waitFor("a second connection", () => router.connections.length >= 2);
    await waitFor("its first status", () => router.connections[1].statuses.length >= 1);
    await waitFor("the second ack", () => control.acknowledged);
    assert.equal(router.connections[1].statuses[0].server_instance_id, "srv-1");
    assert.equal(
      lines.filter((l) => l === "connected outbound supervisor control stream").length,
      2,
    );
    assert.ok(lines.some((l) => l.startsWith("control stream ended (closed by the Router: 1000")));
  } finally {
    await stop();
    await router.close();
  }
});

Deno.test("control link: keeps retrying while no Router listens, then connects", async () => {
  const port = freePort();
  const report = new NodeReport("gpu-a");
  const { control, lines, stop } = link(report, { routerEndpoint: `http://127.0.0.1:${port}` });
  let router;
  try {
    control.start();
    await waitFor("two failed attempts", () => control.connections >= 2);
    router = fakeRouter({ port });
    await waitFor("the ack", () => control.acknowledged);
    assert.ok(lines.filter((l) => l.startsWith("control stream ended")).length >= 1);
  } finally {
    await stop();
    await router?.close();
  }
});

Deno.test("control link: a Router that never answers the upgrade hits the connect timeout", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const accepted: Deno.Conn[] = [];
  const accepting = (async () => {
    for await (const conn of listener) accepted.push(conn); // and never answer
  })();
  const report = new NodeReport("gpu-a");
  const { control, lines, stop } = link(report, {
    routerEndpoint: `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`,
    connectTimeoutSeconds: 0.1,
  });
  try {
    control.start();
    await waitFor(
      "a timed-out attempt",
      () => lines.some((l) => l.includes("no connection within 0.1 s")),
    );
  } finally {
    await stop();
    listener.close();
    await accepting.catch(() => {});
    for (const conn of accepted) conn.close();
  }
});

Deno.test("control link: stop closes the connection and never reconnects", async () => {
  const router = fakeRouter();
  const report = new NodeReport("gpu-a");
  const { control, stop } = link(report, { routerEndpoint: router.url });
  control.start();
  await waitFor("the ack", () => control.acknowledged);
  await stop();
  await router.connections[0].closed;
  const attempts = control.connections;
  await new Promise((r) => setTimeout(r, 200)); // several reconnect delays
  assert.equal(control.connections, attempts);
  assert.equal(router.connections.length, 1);
  control.start(); // a stopped link stays stopped
  assert.equal(control.connections, attempts);
  await router.close();
});

Deno.test("control link: stop interrupts a long reconnect delay", async () => {
  const report = new NodeReport("gpu-a");
  const { control, stop } = link(report, {
    routerEndpoint: `http://127.0.0.1:${freePort()}`,
    reconnectMinDelaySeconds: 600,
    reconnectMaxDelaySeconds: 600,
  });
  control.start();
  await waitFor("the failed attempt", () => control.connections >= 1);
  await new Promise((r) => setTimeout(r, 50));
  const started = performance.now();
  await stop();
  assert.ok(performance.now() - started < 5_000);
});

Deno.test("control link: a Router that never answers the close is not waited for", async () => {
  // A "Router" that completes the upgrade, reads the first status, and then never reads again.
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const conns: Deno.Conn[] = [];
  const serving = (async () => {
    for await (const conn of listener) {
      conns.push(conn);
      const buffer = new Uint8Array(8192);
      const n = await conn.read(buffer);
      const request = new TextDecoder().decode(buffer.subarray(0, n ?? 0));
      const key = request.match(/sec-websocket-key: *(.*)\r\n/i)![1].trim();
      const digest = await crypto.subtle.digest(
        "SHA-1",
        new TextEncoder().encode(`${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`),
      );
      const accept = btoa(String.fromCharCode(...new Uint8Array(digest)));
      await conn.write(new TextEncoder().encode(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
          `Sec-WebSocket-Accept: ${accept}\r\n\r\n`,
      ));
    }
  })();
  const report = new NodeReport("gpu-a");
  const { control, lines, stop } = link(report, {
    routerEndpoint: `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`,
  });
  try {
    control.start();
    await waitFor("the connection", () => conns.length === 1);
    await new Promise((r) => setTimeout(r, 50));
    const started = performance.now();
    await stop();
    const elapsed = performance.now() - started;
    assert.ok(elapsed >= 1_900 && elapsed < 6_000, `${elapsed} ms`);
    assert.equal(control.connections, 1);
    assert.ok(!lines.some((l) => l.startsWith("control stream ended")), lines.join("\n"));
  } finally {
    listener.close();
    await serving.catch(() => {});
    for (const conn of conns) conn.close();
    await new Promise((r) => setTimeout(r, 100)); // the abandoned socket sees the end of its stream
  }
});

Deno.test("control link: a Router message other than an ack ends the connection", async () => {
  const closes: number[] = [];
  let connections = 0;
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
    const { socket, response } = Deno.upgradeWebSocket(request);
    connections++;
    socket.onmessage = () => socket.send('{"t":"drain"}');
    socket.onclose = (event) => closes.push(event.code);
    return response;
  });
  const report = new NodeReport("gpu-a");
  const { control, lines, stop } = link(report, {
    routerEndpoint: `http://127.0.0.1:${server.addr.port}`,
  });
  try {
    control.start();
    await waitFor("a reconnection", () => connections >= 2 && closes.length >= 1);
    assert.equal(closes[0], 4003); // LINK_CLOSE.invalid_argument
    assert.ok(
      lines.some((l) => l.includes("unexpected control message 'drain'")),
      lines.join("\n"),
    );
    assert.equal(control.acknowledged, false);
  } finally {
    await stop();
    await server.shutdown();
  }
});

Deno.test("control link: controlUrl", () => {
  if (controlUrl("http://127.0.0.1:9000/") !== "ws://127.0.0.1:9000/kcoral/v1/control") {
    throw new Error();
  }
});

Deno.test("control link: NodeReport", () => {
  let now = 1000;
  const report = new NodeReport("gpu-a", "sup-1", () => now);
  report.recordHealthy({
    instanceId: "srv-1",
    workerCount: 2,
    busyWorkers: 0,
    target: {},
    versions: {},
  });
  now += 250;
  report.markUnhealthy("health probe timed out after 1000 ms");
  const status = report.snapshot();
  if (status.server_instance_id !== "srv-1" || status.health_age_millis !== 250) throw new Error();
});

Deno.test("control link: ControlLink", async () => {
  const report = new NodeReport("gpu-a");
  // No Router listens on port 9: the link keeps trying until it is stopped.
  const link = new ControlLink({
    routerEndpoint: "http://127.0.0.1:9",
    nodeToken: null,
    snapshot: () => report.snapshot(),
    heartbeatSeconds: 2,
  });
  link.start();
  await link.stop();
  if (link.acknowledged) throw new Error();
});

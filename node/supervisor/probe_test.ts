/**
 * The supervisor's local health probe (node/supervisor/probe.ts, spec router §5.2): the
 * success rules, the timeout, no redirects, no proxy, and the probe origin of wildcard, IPv6
 * and specific-interface binds (the endpoint answers loopback peers only).
 */
import assert from "node:assert/strict";
import {
  parseWorkerStatus,
  probeOrigin,
  probeServer,
  resolveProbeHost,
  WORKER_STATUS_PATH,
} from "./probe.ts";
import { freePort } from "../../tests/fixtures/supervisor/helpers.ts";

const GOOD = {
  status: "ok",
  instance_id: "srv-1",
  worker_count: 4,
  busy_workers: 1,
  target: { arch: "sm_90" },
  versions: { torch: "2.5.1", cuda: "12.4" },
};

/** A server on `hostname` whose worker-status route answers `answer`; loopback peers only. */
function server(
  answer: (request: Request) => Response | Promise<Response>,
  hostname = "127.0.0.1",
) {
  const seen: { path: string; peer: string }[] = [];
  const http = Deno.serve({ hostname, port: 0, onListen() {} }, (request, info) => {
    const peer = (info.remoteAddr as Deno.NetAddr).hostname;
    seen.push({ path: new URL(request.url).pathname, peer });
    const loopback = peer.startsWith("127.") || peer === "::1";
    if (!loopback) return new Response("not found", { status: 404 });
    return answer(request);
  });
  return { port: http.addr.port, seen, close: () => http.shutdown() };
}

Deno.test("probe: a healthy worker status becomes the node's snapshot", async () => {
  const s = server(() => Response.json(GOOD));
  try {
    const result = await probeServer(`http://127.0.0.1:${s.port}/`, 1000);
    assert.deepEqual(result, {
      ok: true,
      health: {
        instanceId: "srv-1",
        workerCount: 4,
        busyWorkers: 1,
        target: { arch: "sm_90" },
        versions: { torch: "2.5.1", cuda: "12.4" },
      },
    });
    assert.deepEqual(s.seen.map((r) => r.path), [WORKER_STATUS_PATH]);
  } finally {
    await s.close();
  }
});

Deno.test("probe: every success rule of the worker status is enforced", () => {
  const cases: [Record<string, unknown> | unknown, RegExp][] = [
    [[GOOD], /not a JSON object/],
    [null, /not a JSON object/],
    [{ ...GOOD, status: "starting" }, /"starting", not "ok"/],
    [{ ...GOOD, status: undefined }, /null, not "ok"/],
    [{ ...GOOD, instance_id: "" }, /no instance_id/],
    [{ ...GOOD, instance_id: 7 }, /no instance_id/],
    [{ ...GOOD, worker_count: 0 }, /worker_count 0 is not a positive integer/],
    [{ ...GOOD, worker_count: 1.5 }, /worker_count 1.5/],
    [{ ...GOOD, worker_count: "4" }, /worker_count "4"/],
    [{ ...GOOD, busy_workers: 5 }, /busy_workers 5 is not an integer between 0 and worker_count 4/],
    [{ ...GOOD, busy_workers: -1 }, /busy_workers -1/],
    [{ ...GOOD, busy_workers: 0.5 }, /busy_workers 0.5/],
    [{ ...GOOD, busy_workers: undefined }, /busy_workers null/],
    [{ ...GOOD, target: { arch: 90 } }, /target is not a map of strings/],
    [{ ...GOOD, target: ["sm_90"] }, /target is not a map of strings/],
    [{ ...GOOD, versions: undefined }, /versions is not a map of strings/],
  ];
  for (const [body, problem] of cases) {
    const result = parseWorkerStatus(body);
    assert.equal(typeof result, "string", JSON.stringify(body));
    assert.match(result as string, problem);
  }
  // Boundaries that pass: all workers busy, empty maps, extra fields.
  const full = parseWorkerStatus({ ...GOOD, busy_workers: 4, target: {}, versions: {}, x: 1 });
  assert.ok(typeof full !== "string" && full.busyWorkers === 4);
});

Deno.test("probe: HTTP errors, non-JSON bodies and refused connections are failures", async () => {
  let answer: () => Response = () => new Response("oops", { status: 500 });
  const s = server(() => answer());
  try {
    const url = `http://127.0.0.1:${s.port}/`;
    assert.deepEqual(await probeServer(url, 1000), {
      ok: false,
      error: "worker status answered HTTP 500",
    });
    answer = () => new Response("<html>", { status: 200 });
    assert.deepEqual(await probeServer(url, 1000), {
      ok: false,
      error: "worker status is not JSON",
    });
    answer = () => Response.json({ ...GOOD, worker_count: 0 });
    const zero = await probeServer(url, 1000);
    assert.ok(!zero.ok && zero.error.includes("worker_count 0"));
  } finally {
    await s.close();
  }
  const refused = await probeServer(`http://127.0.0.1:${freePort()}/`, 1000);
  assert.ok(
    !refused.ok && refused.error.startsWith("health probe failed:"),
    JSON.stringify(refused),
  );
});

Deno.test("probe: redirects are not followed", async () => {
  const s = server((request) => {
    if (new URL(request.url).pathname === WORKER_STATUS_PATH) {
      return new Response(null, { status: 302, headers: { location: "/elsewhere" } });
    }
    return Response.json(GOOD);
  });
  try {
    const result = await probeServer(`http://127.0.0.1:${s.port}/`, 1000);
    assert.deepEqual(result, { ok: false, error: "worker status answered HTTP 302" });
    assert.deepEqual(s.seen.map((r) => r.path), [WORKER_STATUS_PATH]);
  } finally {
    await s.close();
  }
});

Deno.test("probe: the whole request is bounded by the timeout", async () => {
  const release = Promise.withResolvers<void>();
  const s = server(async () => {
    await release.promise;
    return Response.json(GOOD);
  });
  try {
    const started = performance.now();
    const result = await probeServer(`http://127.0.0.1:${s.port}/`, 150);
    const elapsed = performance.now() - started;
    assert.deepEqual(result, { ok: false, error: "health probe timed out after 150 ms" });
    assert.ok(elapsed >= 140 && elapsed < 5000, `${elapsed} ms`);

    // An abort from the caller (shutdown) ends it too.
    const stop = new AbortController();
    const pending = probeServer(`http://127.0.0.1:${s.port}/`, 60_000, stop.signal);
    setTimeout(() => stop.abort(), 20);
    assert.deepEqual(await pending, { ok: false, error: "health probe abandoned" });
  } finally {
    release.resolve();
    await s.close();
  }
});

Deno.test("probe: proxy variables do not apply", async () => {
  const proxy = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    () => new Response("via proxy", { status: 502 }),
  );
  const s = server(() => Response.json(GOOD));
  const names = ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"];
  const saved = names.map((name) => Deno.env.get(name));
  try {
    for (const name of names) {
      Deno.env.set(
        name,
        name.toLowerCase().startsWith("no_") ? "" : `http://127.0.0.1:${proxy.addr.port}`,
      );
    }
    // The environment does reach plain fetch in this process ...
    const plain = await fetch(`http://127.0.0.1:${s.port}${WORKER_STATUS_PATH}`);
    await plain.body?.cancel();
    assert.equal(plain.status, 502);
    // ... but not the probe.
    const result = await probeServer(`http://127.0.0.1:${s.port}/`, 1000);
    assert.ok(result.ok, JSON.stringify(result));
  } finally {
    names.forEach((name, i) =>
      saved[i] === undefined ? Deno.env.delete(name) : Deno.env.set(name, saved[i]!)
    );
    await s.close();
    await proxy.shutdown();
  }
});

Deno.test("probe: origins of wildcard, IPv6 and specific binds", () => {
  assert.equal(probeOrigin("0.0.0.0", 8000), "http://127.0.0.1:8000/");
  assert.equal(probeOrigin("", 8000), "http://127.0.0.1:8000/");
  assert.equal(probeOrigin("::", 8000), "http://[::1]:8000/");
  assert.equal(probeOrigin("[::]", 8000), "http://[::1]:8000/");
  assert.equal(probeOrigin("0:0:0:0:0:0:0:0", 8000), "http://[::1]:8000/");
  assert.equal(probeOrigin("::1", 8001), "http://[::1]:8001/");
  assert.equal(probeOrigin("127.0.0.1", 8000), "http://127.0.0.1:8000/");
  assert.equal(probeOrigin("localhost", 8000), "http://localhost:8000/");
  assert.equal(probeOrigin("10.1.2.3", 8000), "http://10.1.2.3:8000/");
  assert.equal(probeOrigin("fd00::5", 8000), "http://[fd00::5]:8000/");
});

Deno.test("probe: a wildcard bind is probed on loopback", async () => {
  const s = server(() => Response.json(GOOD), "0.0.0.0");
  try {
    const result = await probeServer(probeOrigin("0.0.0.0", s.port), 1000);
    assert.ok(result.ok, JSON.stringify(result));
    assert.equal(s.seen[0].peer, "127.0.0.1");
  } finally {
    await s.close();
  }
});

Deno.test("probe: an IPv6 bind is probed in brackets", async (t) => {
  let s: ReturnType<typeof server>;
  try {
    s = server(() => Response.json(GOOD), "::1");
  } catch {
    await t.step({ name: "no IPv6 loopback here", ignore: true, fn: () => {} });
    return;
  }
  try {
    const result = await probeServer(probeOrigin("::1", s.port), 1000);
    assert.ok(result.ok, JSON.stringify(result));
    assert.equal(s.seen[0].peer, "::1");
  } finally {
    await s.close();
  }
});

Deno.test("probe: a server bound to a specific interface is probed from loopback", async (t) => {
  const address = Deno.networkInterfaces().find((i) =>
    i.family === "IPv4" && !i.address.startsWith("127.")
  )?.address;
  if (address === undefined) {
    await t.step({ name: "no non-loopback IPv4 address here", ignore: true, fn: () => {} });
    return;
  }
  const s = server(() => Response.json(GOOD), address);
  try {
    // Without the loopback source the server's loopback-only endpoint would answer 404.
    const client = Deno.createHttpClient({
      proxy: { transport: "tcp", hostname: address, port: s.port },
    });
    const plain = await fetch(`http://${address}:${s.port}${WORKER_STATUS_PATH}`, { client });
    await plain.body?.cancel();
    client.close();
    assert.equal(plain.status, 404);
    const result = await probeServer(probeOrigin(address, s.port), 1000);
    assert.ok(result.ok, JSON.stringify(result));
    assert.equal(s.seen.at(-1)!.peer, "127.0.0.1");
  } finally {
    await s.close();
  }
});

Deno.test("probe: WORKER_STATUS_PATH", () => {
  if (new URL(WORKER_STATUS_PATH, "http://127.0.0.1:8000/").port !== "8000") throw new Error();
});

Deno.test("probe: resolveProbeHost", async () => {
  if (await resolveProbeHost("0.0.0.0") !== "0.0.0.0") throw new Error();
  if (await resolveProbeHost("[::1]") !== "[::1]") throw new Error();
  const local = await resolveProbeHost("localhost");
  if (local !== "127.0.0.1" && local !== "::1") throw new Error(local);
});

Deno.test("probe: probeOrigin", () => {
  if (probeOrigin("::", 8000) !== "http://[::1]:8000/") throw new Error();
  if (probeOrigin("[fe80::1]", 80) !== "http://[fe80::1]:80/") throw new Error();
  if (probeOrigin("10.0.0.5", 8000) !== "http://10.0.0.5:8000/") throw new Error();
});

Deno.test("probe: parseWorkerStatus", () => {
  const bad = parseWorkerStatus({
    status: "ok",
    instance_id: "i-1",
    worker_count: 1,
    busy_workers: 2,
    target: {},
    versions: {},
  });
  if (bad !== "busy_workers 2 is not an integer between 0 and worker_count 1") throw new Error();
});

Deno.test("probe: probeServer", async () => {
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, () =>
    Response.json({
      status: "ok",
      instance_id: "i-1",
      worker_count: 1,
      busy_workers: 0,
      target: {},
      versions: {},
    }));
  const result = await probeServer(`http://127.0.0.1:${server.addr.port}/`, 1000);
  await server.shutdown();
  if (!result.ok || result.health.instanceId !== "i-1") throw new Error(JSON.stringify(result));
});

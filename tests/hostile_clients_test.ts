/**
 * Clients that leave, stall or flood (issue 44), against real `kcoral server` and `kcoral
 * router` processes on loopback (CPU workers): a request abandoned while it waits never runs
 * (small and 1 MiB bodies, direct and routed); half-sent heads, idle connections and trickled
 * bodies are cut by their timeouts while `/health` and a normal request are answered, and a
 * trickled body never holds a Router's node slot; beyond `--max-connections` only `/health` is
 * answered; malformed framing gets a 400 ERROR body; node-link messages of 60 MiB are refused
 * at their frame header (1009) with the Router's peak RSS up by at most 8 MiB. Counts and order
 * are asserted, never durations. `bench/hostile_clients_bench.ts` runs the issue's full numbers
 * and prints `/health` latencies.
 */
import assert from "node:assert/strict";
import { callProgram, multipartBody } from "./_server.ts";
import {
  freePort,
  KcoralProcess,
  readEvents,
  startNode,
  startRouter,
  waitForCapacity,
  waitUntil,
} from "./_router.ts";
import { FakeNode } from "./_fake_node.ts";
import { encodeMessage, PROTOCOL_VERSION, SLOT_PATH } from "../link/messages.ts";

const _encoder = new TextEncoder();

/** A CPU `kcoral server` process with one worker and short connection timeouts. */
async function _startServer(extra: string[] = []) {
  const port = freePort();
  const logDir = await Deno.makeTempDir({ prefix: "kcoral-hostile-" });
  const process = new KcoralProcess([
    "server",
    "--device",
    "cpu",
    "--num-workers",
    "1",
    "--sandbox",
    "none",
    "--port",
    String(port),
    "--log-dir",
    logDir,
    "--disk-cache-dir",
    "",
    "--header-timeout-seconds",
    "1",
    "--keep-alive-timeout-seconds",
    "1",
    "--body-timeout-seconds",
    "1",
    ...extra,
  ]);
  await process.waitForLine(/Application startup complete/);
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    process,
    events: () => readEvents(logDir),
    async stop() {
      await process.stop();
      await Deno.remove(logDir, { recursive: true }).catch(() => {});
    },
  };
}

/**
 * A program that leaves a file named `tag` in `dir` when it runs (padded with a comment to
 * about `padBytes`), as a raw request head and body.
 */
function _markingRequest(dir: string, tag: string, padBytes = 0, id = crypto.randomUUID()) {
  const source =
    `def f():\n    open(${JSON.stringify(`${dir}/${tag}`)}, "w").close()\n    return 1\n` +
    (padBytes > 0 ? `# ${"x".repeat(padBytes)}\n` : "");
  const { body, contentType } = multipartBody([{
    name: "program",
    contentType: "application/json",
    body: JSON.stringify(callProgram(source, "f")),
  }]);
  const head = `POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: ${contentType}\r\n` +
    `x-request-id: ${id}\r\ncontent-length: ${body.length}\r\n\r\n`;
  return { id, bytes: new Uint8Array([..._encoder.encode(head), ...body]) };
}

/** A program that holds its worker until `release` exists. */
function _blockingProgram(release: string) {
  const source = "import os, time\n" +
    `def f():\n    while not os.path.exists(${JSON.stringify(release)}):\n` +
    "        time.sleep(0.02)\n    return 1\n";
  return multipartBody([{
    name: "program",
    contentType: "application/json",
    body: JSON.stringify(callProgram(source, "f")),
  }]);
}

async function _post(url: string, multipart: { body: Uint8Array; contentType: string }) {
  const response = await fetch(`${url}/execute`, {
    method: "POST",
    headers: { "content-type": multipart.contentType },
    body: multipart.body as Uint8Array<ArrayBuffer>,
  });
  return { status: response.status, json: await response.json() };
}

/** Everything the server sends on `conn` until it closes it (latin1 text). */
async function _readAll(conn: Deno.Conn): Promise<string> {
  const buffer = new Uint8Array(65536);
  let text = "";
  for (;;) {
    const n = await conn.read(buffer).catch(() => null);
    if (n === null) return text;
    text += new TextDecoder("latin1").decode(buffer.subarray(0, n));
  }
}

/**
 * A request on `conn`, beyond the connection bound: a 503 ERROR `busy`, then closed; returns
 * the ERROR body.
 */
async function _assertRefusedSaturated(
  conn: Deno.Conn,
): Promise<{ request_id: string; [key: string]: unknown }> {
  await conn.write(_markingRequest("/nonexistent", "x").bytes);
  const refused = await _closedByServer(conn);
  assert.match(refused, /^HTTP\/1\.1 503 /);
  const json = JSON.parse(refused.slice(refused.indexOf("\r\n\r\n") + 4));
  assert.deepEqual([json.status, json.error.kind, json.error.message], [
    "ERROR",
    "busy",
    "server saturated",
  ]);
  return json;
}

/** `count` connections from `connect`, each holding half a `/health` head. */
async function _halfHeads(connect: () => Promise<Deno.Conn>, count: number): Promise<Deno.Conn[]> {
  const held: Deno.Conn[] = [];
  for (let i = 0; i < count; i++) {
    const conn = await connect();
    await conn.write(_encoder.encode("GET /health HTTP/1.1\r\nhost: x\r\n"));
    held.push(conn);
  }
  return held;
}

/** Whether the server has closed `conn` (reads until the end, discarding). */
async function _closedByServer(conn: Deno.Conn): Promise<string> {
  const text = await _readAll(conn);
  conn.close();
  return text;
}

/**
 * Sends `count` marking requests on their own connections while the only worker is held, waits
 * until `accepted(id)` says each has arrived, closes them all, then releases the worker and runs
 * one more request to the end. Returns how many of the abandoned programs ran.
 */
async function _abandonWhileQueued(
  url: string,
  bodies: number[],
  busy: () => Promise<boolean>,
  waiting: (ids: string[]) => Promise<boolean>,
  letGo: (ids: string[]) => boolean,
): Promise<number> {
  const dir = await Deno.makeTempDir({ prefix: "kcoral-abandoned-" });
  const release = `${dir}/release`;
  try {
    const blocked = _post(url, _blockingProgram(release));
    await waitUntil("the worker held", busy);
    const { hostname, port } = new URL(url);
    const conns: Deno.Conn[] = [];
    const ids: string[] = [];
    for (const [index, pad] of bodies.entries()) {
      const { id, bytes } = _markingRequest(dir, `abandoned-${index}`, pad);
      const conn = await Deno.connect({ hostname, port: Number(port) });
      await conn.write(bytes);
      conns.push(conn);
      ids.push(id);
    }
    await waitUntil("the abandoned requests waiting", () => waiting(ids));
    for (const conn of conns) conn.close();
    // The worker frees up only once every abandoned request was let go: a program that still
    // ran would leave its file.
    await waitUntil("the abandoned requests let go", () => letGo(ids));
    await Deno.writeTextFile(release, "");
    assert.equal((await blocked).status, 200);
    const { id, bytes } = _markingRequest(dir, "wanted");
    const conn = await Deno.connect({ hostname, port: Number(port) });
    await conn.write(bytes);
    const answer = await _readUntilAnswer(conn);
    conn.close();
    assert.match(answer, /^HTTP\/1\.1 200 /, `the wanted request ${id}`);
    const files = [...Deno.readDirSync(dir)].map((entry) => entry.name);
    assert.ok(files.includes("wanted"), "the wanted program ran");
    return files.filter((name) => name.startsWith("abandoned-")).length;
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}

/** One answer's text (head and a Content-Length body) read off `conn`. */
async function _readUntilAnswer(conn: Deno.Conn): Promise<string> {
  const buffer = new Uint8Array(65536);
  let text = "";
  for (;;) {
    const end = text.indexOf("\r\n\r\n");
    if (end !== -1) {
      const length = Number(/content-length: (\d+)/i.exec(text.slice(0, end))?.[1] ?? 0);
      if (text.length >= end + 4 + length) return text;
    }
    const n = await conn.read(buffer);
    if (n === null) return text;
    text += new TextDecoder("latin1").decode(buffer.subarray(0, n));
  }
}

Deno.test("hostile: requests abandoned while queued on a server never run (small and 1 MiB)", async () => {
  const server = await _startServer();
  try {
    const waiting = (ids: string[]) =>
      Promise.resolve(
        ids.every((id) =>
          server.events().some((e) => e.event === "request_accepted" && e.request_id === id)
        ),
      );
    const busy = () => Promise.resolve(server.events().some((e) => e.event === "request_routed"));
    const letGo = (ids: string[]) =>
      ids.every((id) =>
        server.events().some((e) =>
          e.event === "request_finished" && e.request_id === id &&
          e.finish_reason === "client_disconnected"
        )
      );
    const ran = await _abandonWhileQueued(
      server.url,
      [0, 0, 1 << 20, 1 << 20],
      busy,
      waiting,
      letGo,
    );
    assert.equal(ran, 0, "abandoned programs that ran");
    const events = server.events();
    const gone = events.filter((e) =>
      e.event === "request_finished" && e.finish_reason === "client_disconnected"
    );
    assert.equal(gone.length, 4);
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(
      metrics,
      /kcoral_requests_total\{code="499",finish_reason="client_disconnected"[^}]*\} 4/,
    );
  } finally {
    await server.stop();
  }
});

Deno.test("hostile: requests abandoned while queued at a Router never run on its node", async () => {
  const router = await startRouter(["--queue-wait-timeout-seconds", "60"]);
  const node = await startNode(router.url, "n1", { workers: 1 });
  try {
    await waitForCapacity(router.url, 1);
    // Queued at the Router (its one slot is held): the Router's own queue.
    const waiting = async (ids: string[]) => {
      const health = await (await fetch(`${router.url}/health`)).json();
      return health.load.requests_waiting === ids.length;
    };
    const busy = async () => {
      const health = await (await fetch(`${router.url}/health`)).json();
      return health.load.requests_in_progress === 1;
    };
    // The small body was read before it queued: its client's end is seen while it waits. The
    // 1 MiB one is read only once a slot is free (the rest of it, and its client's end, reach
    // the Router then): it is cancelled before its body ends on the node.
    const letGo = (_ids: string[]) =>
      router.finished().filter((f) => f.finish_reason === "client_disconnected").length >= 1;
    const ran = await _abandonWhileQueued(router.url, [0, 1 << 20], busy, waiting, letGo);
    assert.equal(ran, 0, "abandoned programs that ran on the node");
    const finished = router.finished().filter((f) => f.finish_reason === "client_disconnected");
    assert.equal(finished.length, 2);
  } finally {
    await node.stop();
    await router.stop();
  }
});

Deno.test("hostile: a 1 MiB request whose client half-closed while queued at a Router never runs", async () => {
  const router = await startRouter(["--queue-wait-timeout-seconds", "60"]);
  const node = await startNode(router.url, "n1", { workers: 1 });
  const dir = await Deno.makeTempDir({ prefix: "kcoral-half-closed-" });
  try {
    await waitForCapacity(router.url, 1);
    const release = `${dir}/release`;
    const blocked = _post(router.url, _blockingProgram(release));
    await waitUntil("the slot held", async () => {
      const health = await (await fetch(`${router.url}/health`)).json();
      return health.load.requests_in_progress === 1;
    });
    // Sent whole, then the client's end: the Router reads the body (and sees that end) only
    // once the slot frees, before the body's end goes to the node.
    const { hostname, port } = new URL(router.url);
    const conn = await Deno.connect({ hostname, port: Number(port) });
    const { bytes } = _markingRequest(dir, "abandoned", 1 << 20);
    const sent = conn.write(bytes).then(async function rest(n): Promise<void> {
      if (n < bytes.length) return rest(n + await conn.write(bytes.subarray(n)));
    });
    await waitUntil("the request queued", async () => {
      const health = await (await fetch(`${router.url}/health`)).json();
      return health.load.requests_waiting === 1;
    });
    await Deno.writeTextFile(release, "");
    await sent;
    await conn.closeWrite();
    assert.equal((await blocked).status, 200);
    await waitUntil(
      "the Router let it go",
      () => router.finished().some((f) => f.finish_reason === "client_disconnected"),
    );
    conn.close();
    // The node's worker is free again and runs a wanted request.
    const wanted = await _post(
      router.url,
      multipartBody([{
        name: "program",
        contentType: "application/json",
        body: JSON.stringify(callProgram("def f():\n    return 7\n", "f")),
      }]),
    );
    assert.equal(wanted.status, 200);
    assert.deepEqual([...Deno.readDirSync(dir)].map((e) => e.name).sort(), ["release"]);
  } finally {
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    await node.stop();
    await router.stop();
  }
});

Deno.test("hostile: a Router cuts bodies that stop arriving (408); a small one never holds the slot", async () => {
  const router = await startRouter(["--body-timeout-seconds", "1"]);
  const node = await startNode(router.url, "n1", { workers: 1 });
  try {
    await waitForCapacity(router.url, 1);
    const { hostname, port } = new URL(router.url);
    const head = (length: number) =>
      _encoder.encode(
        "POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=b\r\n" +
          `content-length: ${length}\r\n\r\n`,
      );
    // A small body (one data frame) is read before a slot is taken.
    const small = await Deno.connect({ hostname, port: Number(port) });
    await small.write(head(1000));
    await small.write(new Uint8Array(10));
    // A large one is streamed to its node: it holds the slot until it is cut.
    const large = await Deno.connect({ hostname, port: Number(port) });
    await large.write(head(1 << 20));
    await large.write(new Uint8Array(300 * 1024));
    for (const conn of [small, large]) {
      const text = await _readUntilAnswer(conn);
      conn.close();
      assert.match(text, /^HTTP\/1\.1 408 /);
      const json = JSON.parse(text.slice(text.indexOf("\r\n\r\n") + 4));
      assert.equal(json.status, "ERROR");
      assert.equal(json.error.kind, "timeout");
    }
    await waitUntil("both logged", () => router.finished().length >= 2);
    const cut = router.finished().filter((f) => f.http_status === "408");
    assert.equal(cut.length, 2);
    // Only the large body reached a node.
    assert.deepEqual(cut.map((f) => f.node).sort(), ["", "n1"]);
    // The slot is free again: a request runs.
    await waitForCapacity(router.url, 1);
    const ok = await _post(
      router.url,
      multipartBody([{
        name: "program",
        contentType: "application/json",
        body: JSON.stringify(callProgram("def f():\n    return 7\n", "f")),
      }]),
    );
    assert.equal(ok.status, 200);
  } finally {
    await node.stop();
    await router.stop();
  }
});

Deno.test("hostile: stalled heads, idle connections and trickled bodies are cut; /health and a request are answered", async () => {
  const server = await _startServer(["--max-connections", "200"]);
  try {
    const { hostname, port } = new URL(server.url);
    const connect = () => Deno.connect({ hostname, port: Number(port) });
    const halfHeads: Deno.Conn[] = [];
    for (let i = 0; i < 60; i++) {
      const conn = await connect();
      await conn.write(_encoder.encode("POST /execute HTTP/1.1\r\nhost: x\r\ncontent-le"));
      halfHeads.push(conn);
    }
    const idle: Deno.Conn[] = [];
    for (let i = 0; i < 20; i++) idle.push(await connect());
    const trickled: Deno.Conn[] = [];
    for (let i = 0; i < 20; i++) {
      const conn = await connect();
      await conn.write(_encoder.encode(
        "POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=b\r\n" +
          "content-length: 100000\r\n\r\n--b\r\n",
      ));
      trickled.push(conn);
    }
    // While they stall: /health and a program are answered.
    const health = await fetch(`${server.url}/health`);
    assert.equal(health.status, 200);
    await health.body?.cancel();
    const { body, contentType } = multipartBody([{
      name: "program",
      contentType: "application/json",
      body: JSON.stringify(callProgram("def f():\n    return 7\n", "f")),
    }]);
    const ok = await _post(server.url, { body, contentType });
    assert.equal(ok.status, 200);
    assert.equal(ok.json.status, "COMPLETED");
    // Every stalled connection is closed by the server: heads and bodies with a 408 ERROR body,
    // idle ones quietly.
    const heads = await Promise.all(halfHeads.map(_closedByServer));
    for (const text of heads) {
      assert.match(text, /^HTTP\/1\.1 408 /);
      const json = JSON.parse(text.slice(text.indexOf("\r\n\r\n") + 4));
      assert.equal(json.status, "ERROR");
      assert.equal(json.error.kind, "timeout");
    }
    assert.deepEqual(new Set(await Promise.all(idle.map(_closedByServer))), new Set([""]));
    const bodies = await Promise.all(trickled.map(_closedByServer));
    for (const text of bodies) {
      assert.match(text, /^HTTP\/1\.1 408 /);
      assert.match(text, /"kind":"timeout","message":"request body not received in time/);
    }
    const cuts = server.events().filter((e) => e.event === "connection_cut");
    assert.equal(cuts.filter((e) => e.reason === "header_timeout").length, 60);
    assert.equal(cuts.filter((e) => e.reason === "body_timeout").length, 20);
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    assert.match(metrics, /kcoral_connections_cut_total\{reason="header_timeout"\} 60\n/);
    assert.match(metrics, /kcoral_connections_cut_total\{reason="body_timeout"\} 20\n/);
    // No stalled body reached a worker.
    assert.equal(server.events().filter((e) => e.event === "request_routed").length, 1);
    const after = await fetch(`${server.url}/health`);
    assert.equal(after.status, 200);
    await after.body?.cancel();
  } finally {
    await server.stop();
  }
});

Deno.test("hostile: beyond --max-connections only /health is answered; others get 503 busy", async () => {
  const server = await _startServer(["--max-connections", "8", "--header-timeout-seconds", "30"]);
  try {
    const { hostname, port } = new URL(server.url);
    const connect = () => Deno.connect({ hostname, port: Number(port) });
    const held = await _halfHeads(connect, 8);
    await waitUntil("8 connections held", async () => {
      // A probe beyond the bound tells: it is answered with connection: close.
      const conn = await connect();
      await conn.write(_encoder.encode("GET /health HTTP/1.1\r\nhost: x\r\n\r\n"));
      const text = await _closedByServer(conn);
      return /^HTTP\/1\.1 200 /.test(text) && /connection: close/i.test(text);
    });
    const json = await _assertRefusedSaturated(await connect());
    for (const c of held) c.close();
    // Below the bound again: requests are served as before.
    await waitUntil("served again", async () => {
      const response = await fetch(`${server.url}/metrics`);
      await response.body?.cancel();
      return response.status === 200;
    });
    const cuts = server.events().filter((e) =>
      e.event === "connection_cut" && e.reason === "too_many_connections"
    );
    // The refused request is logged (a probe racing the held connections' close may be too).
    assert.ok(cuts.some((cut) => cut.request_id === json.request_id), JSON.stringify(cuts));
  } finally {
    await server.stop();
  }
});

Deno.test("hostile: malformed HTTP framing gets a 400 ERROR body naming the problem", async () => {
  const server = await _startServer();
  try {
    const { hostname, port } = new URL(server.url);
    const cases: [string, RegExp][] = [
      [
        "POST /execute HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd",
        /conflicting Content-Length/,
      ],
      ["POST /execute HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n", /invalid Content-Length/],
      [
        "POST /execute HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
        /both Transfer-Encoding and Content-Length/,
      ],
      [
        "POST /execute HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\n",
        /unsupported Transfer-Encoding/,
      ],
      ["GET /health HTTP/1.1\r\nhost : x\r\n\r\n", /invalid header field name/],
      ["GET /health HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n  folded\r\n\r\n", /obsolete line folding/],
      ["GET /health HTTP/1.1\r\n\r\n", /missing Host header/],
      ["GET /health\r\n\r\n", /invalid HTTP request line/],
    ];
    for (const [head, message] of cases) {
      const conn = await Deno.connect({ hostname, port: Number(port) });
      await conn.write(_encoder.encode(head));
      const text = await _closedByServer(conn);
      assert.match(text, /^HTTP\/1\.1 400 /, head);
      const json = JSON.parse(text.slice(text.indexOf("\r\n\r\n") + 4));
      assert.equal(json.status, "ERROR");
      assert.equal(json.error.kind, "parse");
      assert.match(json.error.message, message);
      assert.match(json.request_id, /^[0-9a-f-]{36}$/);
    }
    // Invalid chunked encoding reaches the body reader: a 400 from the pipeline.
    const conn = await Deno.connect({ hostname, port: Number(port) });
    await conn.write(_encoder.encode(
      "POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=b\r\n" +
        "transfer-encoding: chunked\r\n\r\nzz\r\n",
    ));
    const text = await _readUntilAnswer(conn);
    conn.close();
    assert.match(text, /^HTTP\/1\.1 400 /);
    assert.match(text, /invalid chunked encoding/);
    const cuts = server.events().filter((e) =>
      e.event === "connection_cut" && e.reason === "malformed_request"
    );
    assert.equal(cuts.length, cases.length);
    const health = await fetch(`${server.url}/health`);
    assert.equal(health.status, 200);
    await health.body?.cancel();
  } finally {
    await server.stop();
  }
});

/**
 * `kcoral ARGS` (a server or a Router on `port`) under a limit of 256 descriptors, sent more
 * connections than that: its listener says it cannot accept, keeps its address, says when it
 * can again, and answers `/health` (`status`) then.
 */
async function _outOfDescriptors(args: string, port: number, status: number): Promise<void> {
  const cli = new URL("../cli.ts", import.meta.url).pathname;
  const command = `ulimit -n 256 && exec "${Deno.execPath()}" run -A "${cli}" ${args} ` +
    `--max-connections 5000 --keep-alive-timeout-seconds 120 --header-timeout-seconds 120`;
  const child = new Deno.Command("bash", {
    args: ["-c", command],
    env: { NO_COLOR: "1" },
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  let log = "";
  const reading = (async () => {
    for await (const text of child.stderr.pipeThrough(new TextDecoderStream())) log += text;
  })();
  const conns: Deno.Conn[] = [];
  try {
    await waitUntil("it started", () => log.includes("Application startup complete"));
    // More connections than it has descriptors: the kernel still completes them (the
    // backlog), the listener cannot accept them all.
    for (let i = 0; i < 400 && !log.includes("cannot accept connections"); i++) {
      conns.push(await Deno.connect({ hostname: "127.0.0.1", port }));
      if (i % 50 === 49) await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await waitUntil("the failure logged", () => log.includes("cannot accept connections"));
    for (const conn of conns.splice(0)) conn.close();
    await waitUntil("accepting again", () => log.includes("accepting connections again"));
    const health = await fetch(`http://127.0.0.1:${port}/health`);
    assert.equal(health.status, status);
    await health.body?.cancel();
    assert.ok(
      log.indexOf("cannot accept connections") < log.indexOf("accepting connections again"),
    );
    assert.match(
      log,
      /cannot accept connections \(retrying\): .*(Too many open files|os error 24)/,
    );
  } finally {
    for (const conn of conns) conn.close();
    child.kill("SIGTERM");
    await child.status;
    await reading;
  }
}

Deno.test("hostile: a server out of descriptors keeps its listener, says so, and accepts again", async () => {
  const port = freePort();
  await _outOfDescriptors(
    `server --device cpu --num-workers 1 --sandbox none --port ${port} --log-dir '' ` +
      "--disk-cache-dir ''",
    port,
    200,
  );
});

Deno.test("hostile: a Router out of descriptors keeps its listener, says so, and accepts again", async () => {
  const port = freePort();
  // No node: its /health answers 503 "unavailable".
  await _outOfDescriptors(`router --port ${port}`, port, 503);
});

/** A node link opened by hand: the upgrade's answer head, and what came after it. */
async function _rawLink(port: number, path: string, token: string) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  await _writeAll(
    conn,
    _encoder.encode(
      `GET ${path} HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\n` +
        "sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n" +
        `authorization: Bearer ${token}\r\n\r\n`,
    ),
  );
  return conn;
}

async function _writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let at = 0; at < bytes.length;) at += await conn.write(bytes.subarray(at));
}

/** A client frame (masked with a zero key: the payload as it is). */
function _linkFrame(opcode: number, payload: Uint8Array, declared = payload.length): Uint8Array {
  const header = new Uint8Array(14);
  header[0] = 0x80 | opcode;
  header[1] = 0x80 | 127;
  new DataView(header.buffer).setBigUint64(2, BigInt(declared));
  const frame = new Uint8Array(header.length + payload.length);
  frame.set(header);
  frame.set(payload, header.length);
  return frame;
}

/**
 * What the Router sends on a raw link, read until its close frame: the HTTP head, the text
 * messages before, and the close code (`null`: the connection ended without one).
 */
class _LinkReader {
  #buffer = new Uint8Array(0);
  head: string | null = null;
  constructor(readonly conn: Deno.Conn) {}

  async #more(): Promise<boolean> {
    const chunk = new Uint8Array(65536);
    const n = await this.conn.read(chunk).catch(() => null);
    if (n === null) return false;
    const joined = new Uint8Array(this.#buffer.length + n);
    joined.set(this.#buffer);
    joined.set(chunk.subarray(0, n), this.#buffer.length);
    this.#buffer = joined;
    return true;
  }

  /** The answer's head (`HTTP/1.1 101 ...` or a refusal). */
  async readHead(): Promise<string> {
    for (;;) {
      const text = new TextDecoder("latin1").decode(this.#buffer);
      const end = text.indexOf("\r\n\r\n");
      if (end >= 0) {
        this.#buffer = this.#buffer.slice(end + 4);
        return this.head = text.slice(0, end + 4);
      }
      if (!(await this.#more())) return this.head = text;
    }
  }

  /** The next frame: its opcode and payload; `null` once the connection ended. */
  async frame(): Promise<{ opcode: number; payload: Uint8Array } | null> {
    const need = async (n: number) => {
      while (this.#buffer.length < n) if (!(await this.#more())) return false;
      return true;
    };
    if (!(await need(2))) return null;
    let length = this.#buffer[1] & 0x7f;
    const size = length === 126 ? 4 : length === 127 ? 10 : 2;
    if (!(await need(size))) return null;
    if (length === 126) length = (this.#buffer[2] << 8) | this.#buffer[3];
    if (length === 127) length = Number(new DataView(this.#buffer.buffer, 2, 8).getBigUint64(0));
    if (!(await need(size + length))) return null;
    const frame = {
      opcode: this.#buffer[0] & 0x0f,
      payload: this.#buffer.slice(size, size + length),
    };
    this.#buffer = this.#buffer.slice(size + length);
    return frame;
  }

  /** Frames until the close frame's code (`null`: the connection ended first). */
  async closeCode(): Promise<number | null> {
    for (;;) {
      const frame = await this.frame();
      if (frame === null) return null;
      if (frame.opcode === 8) return (frame.payload[0] << 8) | frame.payload[1];
    }
  }
}

/**
 * Sends one binary message declared `bytes` long on a link whose upgrade (and hello, for
 * `slot`) is done, streaming zeros for it until the Router closes the connection; resolves with
 * the close code the Router sent.
 */
async function _oversized(conn: Deno.Conn, reader: _LinkReader, bytes: number) {
  const closing = reader.closeCode();
  const chunk = new Uint8Array(1 << 20);
  try {
    await _writeAll(conn, _linkFrame(2, new Uint8Array(0), bytes));
    for (let sent = 0; sent < bytes; sent += chunk.length) await _writeAll(conn, chunk);
  } catch {
    // the Router closed the connection under the writes
  }
  const code = await closing;
  conn.close();
  return code;
}

/** A peer that never authenticates: a wrong token, then a message's bytes all the same. */
async function _unauthenticatedFlood(port: number, bytes: number): Promise<string> {
  const conn = await _rawLink(port, SLOT_PATH, "wrong");
  const reader = new _LinkReader(conn);
  const head = reader.readHead();
  await _oversized(conn, reader, bytes);
  return await head;
}

/** A peer with the token that sends a message of `bytes` before its hello: the close code. */
async function _beforeHello(port: number, token: string, bytes: number) {
  const conn = await _rawLink(port, SLOT_PATH, token);
  const reader = new _LinkReader(conn);
  assert.match(await reader.readHead(), /^HTTP\/1\.1 101 /);
  return await _oversized(conn, reader, bytes);
}

/** A registered slot of `node` that sends a message of `bytes`: the close code. */
async function _registeredSlot(port: number, token: string, node: FakeNode, bytes: number) {
  const conn = await _rawLink(port, SLOT_PATH, token);
  const reader = new _LinkReader(conn);
  assert.match(await reader.readHead(), /^HTTP\/1\.1 101 /);
  const hello = _encoder.encode(encodeMessage({
    t: "hello",
    node_id: node.nodeId,
    server_instance_id: node.status.server_instance_id,
    slot_id: crypto.randomUUID(),
    protocol_version: PROTOCOL_VERSION,
  }));
  await _writeAll(conn, _linkFrame(1, hello));
  const ack = await reader.frame();
  assert.equal(new TextDecoder().decode(ack?.payload), '{"t":"ack"}');
  return await _oversized(conn, reader, bytes);
}

/** A process's resident set now and at its peak since the last reset, in KiB. */
function _memory(pid: number): { rss: number; peak: number } {
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  const field = (name: string) => Number(new RegExp(`${name}:\\s+(\\d+) kB`).exec(status)![1]);
  return { rss: field("VmRSS"), peak: field("VmHWM") };
}

Deno.test("hostile: node-link messages of 60 MiB are refused at their header (1009), unauthenticated or not; the Router's peak RSS grows by at most 8 MiB", async () => {
  const token = "node-s3cret";
  const router = await startRouter([], { KCORAL_NODE_TOKEN: token });
  const node = new FakeNode(router.url, "n1");
  try {
    await node.connect(token);
    await waitUntil("the node ready", () => router.process.lines.some((l) => /node_ready/.test(l)));
    const port = Number(new URL(router.url).port);
    const pid = router.process.child.pid;
    // Each kind once with a small message first: what the code paths themselves cost is paid.
    assert.match(await _unauthenticatedFlood(port, 2 << 20), /^HTTP\/1\.1 401 /);
    assert.equal(await _beforeHello(port, token, 2 << 20), 1009);
    assert.equal(await _registeredSlot(port, token, node, 2 << 20), 1009);
    Deno.writeTextFileSync(`/proc/${pid}/clear_refs`, "5"); // the peak starts from now
    const before = _memory(pid);
    // Six peers at once, 60 MiB each: two without the token, two before their hello, two slots.
    const bytes = 60 << 20;
    const [heads, codes] = await Promise.all([
      Promise.all([_unauthenticatedFlood(port, bytes), _unauthenticatedFlood(port, bytes)]),
      Promise.all([
        _beforeHello(port, token, bytes),
        _beforeHello(port, token, bytes),
        _registeredSlot(port, token, node, bytes),
        _registeredSlot(port, token, node, bytes),
      ]),
    ]);
    for (const head of heads) assert.match(head, /^HTTP\/1\.1 401 /);
    assert.deepEqual(codes, [1009, 1009, 1009, 1009]);
    const after = _memory(pid);
    const grewKiB = after.peak - before.rss;
    assert.ok(grewKiB <= 8 * 1024, `peak RSS ${before.rss} -> ${after.peak} KiB`);
    // Logged, each naming the limit.
    const refused = router.process.lines.filter((l) =>
      /node_link_refused .*code=message_too_big/.test(l)
    );
    assert.equal(refused.length, 6);
    assert.match(refused[0], /binary message of \d+ bytes or more, over the \d+ allowed/);
    // The node's links still work: its control link stayed up, a slot opens and a request routes.
    assert.ok(!router.process.lines.some((l) => /node_unhealthy/.test(l)));
    await node.openSlot((request) => {
      request.respondComplete(200, [["content-type", "text/plain"]], _encoder.encode("routed"));
    }, token);
    await waitForCapacity(router.url, 1);
    const routed = await fetch(`${router.url}/execute`, { method: "POST", body: "x" });
    assert.equal(routed.status, 200);
    assert.equal(await routed.text(), "routed");
  } finally {
    node.close();
    await router.stop();
  }
});

/** A Router with one CPU node of one worker, and short connection timeouts. */
async function _routerWithNode(extra: string[]) {
  const router = await startRouter([
    "--header-timeout-seconds",
    "1",
    "--keep-alive-timeout-seconds",
    "1",
    ...extra,
  ]);
  const node = await startNode(router.url, "n1", { workers: 1 });
  await waitForCapacity(router.url, 1);
  return { router, node };
}

Deno.test("hostile: a Router cuts half-sent heads and idle connections; trickled bodies never hold its node slot", async () => {
  const { router, node } = await _routerWithNode(["--body-timeout-seconds", "5"]);
  try {
    const { hostname, port } = new URL(router.url);
    const connect = () => Deno.connect({ hostname, port: Number(port) });
    const order: string[] = [];
    const watch = (conn: Deno.Conn, name: string) =>
      _closedByServer(conn).then((text) => (order.push(name), text));
    const halfHeads: Promise<string>[] = [];
    for (let i = 0; i < 60; i++) {
      const conn = await connect();
      await conn.write(_encoder.encode("POST /execute HTTP/1.1\r\nhost: x\r\ncontent-le"));
      halfHeads.push(watch(conn, "head"));
    }
    const idle: Promise<string>[] = [];
    for (let i = 0; i < 20; i++) idle.push(watch(await connect(), "idle"));
    // Bodies that stop arriving: small ones (one frame), and large ones before their first
    // frame is in.
    const trickled: Promise<string>[] = [];
    for (const length of [...Array(10).fill(100_000), ...Array(10).fill(1 << 20)]) {
      const conn = await connect();
      await conn.write(_encoder.encode(
        "POST /execute HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=b\r\n" +
          `content-length: ${length}\r\n\r\n--b\r\n${"x".repeat(10_000)}`,
      ));
      trickled.push(watch(conn, "body"));
    }
    // While they stall, the node's one slot is free: a routed request runs at once, before any
    // trickled body is cut.
    const health = await (await fetch(`${router.url}/health`)).json();
    assert.deepEqual(health.load, {
      request_capacity: 1,
      requests_in_progress: 0,
      requests_waiting: 0,
    });
    const ok = await _post(
      router.url,
      multipartBody([{
        name: "program",
        contentType: "application/json",
        body: JSON.stringify(callProgram("def f():\n    return 7\n", "f")),
      }]),
    );
    order.push("routed");
    assert.equal(ok.status, 200);
    assert.equal(ok.json.status, "COMPLETED");
    for (const text of await Promise.all(halfHeads)) {
      assert.match(text, /^HTTP\/1\.1 408 /);
      assert.match(text, /"kind":"timeout","message":"request head not received in time"/);
    }
    assert.deepEqual(new Set(await Promise.all(idle)), new Set([""]));
    for (const text of await Promise.all(trickled)) {
      assert.match(text, /^HTTP\/1\.1 408 /);
      assert.match(text, /"kind":"timeout","message":"request body not received in time/);
    }
    assert.ok(order.indexOf("routed") < order.indexOf("body"), order.join());
    // Logged and counted; no trickled body reached the node (their lines name none).
    await waitUntil("all logged", () => router.finished().length >= 21);
    const cut = router.finished().filter((f) => f.http_status === "408");
    assert.equal(cut.length, 20);
    assert.deepEqual(new Set(cut.map((f) => f.node)), new Set([""]));
    const cuts = router.process.lines.filter((l) => / connection_cut /.test(l));
    assert.equal(cuts.filter((l) => /reason=header_timeout/.test(l)).length, 60);
    assert.equal(cuts.filter((l) => /reason=body_timeout/.test(l)).length, 20);
    const metrics = await (await fetch(`${router.url}/metrics`)).text();
    assert.match(metrics, /kcoral_router_connections_cut_total\{reason="header_timeout"\} 60\n/);
    assert.match(metrics, /kcoral_router_connections_cut_total\{reason="body_timeout"\} 20\n/);
    assert.equal(node.events().filter((e) => e.event === "request_routed").length, 1);
  } finally {
    await node.stop();
    await router.stop();
  }
});

Deno.test("hostile: a Router beyond --max-connections answers only /health; malformed framing gets a 400 ERROR body", async () => {
  const router = await startRouter(["--max-connections", "8", "--header-timeout-seconds", "30"]);
  try {
    const { hostname, port } = new URL(router.url);
    const connect = () => Deno.connect({ hostname, port: Number(port) });
    const cases: [string, RegExp][] = [
      [
        "POST /execute HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd",
        /conflicting Content-Length/,
      ],
      ["GET /health HTTP/1.1\r\nhost : x\r\n\r\n", /invalid header field name/],
      ["GET /health HTTP/1.1\r\n\r\n", /missing Host header/],
    ];
    for (const [head, message] of cases) {
      const conn = await connect();
      await conn.write(_encoder.encode(head));
      const text = await _closedByServer(conn);
      assert.match(text, /^HTTP\/1\.1 400 /, head);
      const json = JSON.parse(text.slice(text.indexOf("\r\n\r\n") + 4));
      assert.deepEqual([json.status, json.error.kind], ["ERROR", "parse"]);
      assert.match(json.error.message, message);
    }
    const held = await _halfHeads(connect, 8);
    await waitUntil("8 connections held", async () => {
      const conn = await connect();
      await conn.write(_encoder.encode("GET /health HTTP/1.1\r\nhost: x\r\n\r\n"));
      const text = await _closedByServer(conn);
      // Beyond the bound /health is still answered (503: no node), then the connection closes.
      return /^HTTP\/1\.1 503 /.test(text) && /connection: close/i.test(text) &&
        /"status":"unavailable"/.test(text);
    });
    await _assertRefusedSaturated(await connect());
    for (const c of held) c.close();
    const lines = router.process.lines.filter((l) => / connection_cut /.test(l));
    assert.equal(lines.filter((l) => /reason=malformed_request/.test(l)).length, cases.length);
    assert.ok(lines.some((l) => /reason=too_many_connections/.test(l)));
  } finally {
    await router.stop();
  }
});

/**
 * The Router's forwarding and its node links, in-process: a real Router on loopback (real HTTP,
 * real WebSockets) and fake nodes that speak the node link by hand, so that a node can answer
 * early, fail, stall, misbehave or report other versions (spec router §1.2–§1.5, §2.2, §3).
 */
import assert from "node:assert/strict";
import { serve } from "../http/serve.ts";
import { createRouter } from "../router/app.ts";
import { forwardExecute } from "../router/pipeline.ts";
import { NodeRegistry } from "../router/registry.ts";
import { EventLog } from "../http/events.ts";
import { defaultRegistryConfig, parseRouterArgs } from "../router/options.ts";
import { CONTROL_PATH, encodeMessage, SLOT_PATH } from "../link/messages.ts";
import { encodeFrame, frameWithRoom } from "../link/frames.ts";
import { closed, FakeNode, type FakeRequest, healthyStatus, openLink } from "./_fake_node.ts";

async function startRouter(args: string[] = []) {
  const lines: string[] = [];
  const router = createRouter(
    parseRouterArgs([
      "--status-check-interval-seconds",
      "0.05",
      "--recovery-threshold",
      "1",
      ...args,
    ], {}),
    { consoleWrite: (line) => lines.push(line) },
  );
  const server = await serve(router, { port: 0, handleSignals: false, log: () => {} });
  return {
    url: server.url,
    router,
    lines,
    finished: () =>
      lines.filter((l) => l.includes(" request_finished ")).map((l) =>
        Object.fromEntries([...l.matchAll(/(\w+)=(\S*)/g)].map((m) => [m[1], m[2]]))
      ),
    stop: () => server.shutdown(),
  };
}

async function waitFor(what: string, check: () => boolean | Promise<boolean>, ms = 10_000) {
  const deadline = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

async function capacity(url: string): Promise<number> {
  const body = await (await fetch(`${url}/health`)).json();
  return body.load.request_capacity;
}

Deno.test("router: /health is 503 without nodes, a server's shape, then the nodes' capacity", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-a", { worker_count: 2, target: { arch: "sm_90a" } });
  try {
    const empty = await fetch(`${r.url}/health`);
    assert.equal(empty.status, 503);
    const body = await empty.json();
    assert.deepEqual(Object.keys(body).sort(), [
      "gpu_count",
      "instance_id",
      "load",
      "started_at",
      "status",
      "target",
      "versions",
    ]);
    assert.equal(body.status, "unavailable");
    assert.equal(body.gpu_count, null);
    assert.deepEqual(body.load, {
      request_capacity: 0,
      requests_in_progress: 0,
      requests_waiting: 0,
    });
    await node.connect();
    await node.openSlot(() => {});
    await node.openSlot(() => {});
    await waitFor("capacity 2", async () => (await capacity(r.url)) === 2);
    const ready = await (await fetch(`${r.url}/health`)).json();
    assert.equal(ready.status, "ok");
    assert.deepEqual(ready.target, { arch: "sm_90a" });
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: a 2 MiB + 17 B body and repeated headers cross byte for byte", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-a");
  try {
    await node.connect();
    let seenHeaders: [string, string][] = [];
    let requestId = "";
    await node.openSlot(async (request) => {
      seenHeaders = request.head.headers;
      requestId = request.id;
      const body = await request.body();
      request.respond(200, [
        ["content-type", "application/octet-stream"],
        ["set-cookie", "a=1"],
        ["set-cookie", "b=2"],
        ["content-length", "999"],
        ["x-request-id", "spoofed"],
      ]);
      await request.write(body);
      request.end();
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);
    const payload = crypto.getRandomValues(new Uint8Array(65536));
    const big = new Uint8Array(2 * 1024 * 1024 + 17);
    for (let i = 0; i < big.length; i += payload.length) {
      big.set(payload.subarray(0, big.length - i), i);
    }
    const response = await fetch(`${r.url}/execute`, {
      method: "POST",
      body: big,
      headers: {
        "content-type": "multipart/form-data; boundary=x",
        "x-request-id": "11111111-2222-4333-8444-555555555555",
        "x-kcoral-node": "gpu-a",
        connection: "keep-alive, x-secret",
        "x-secret": "hop",
      },
    });
    assert.equal(response.status, 200);
    const echoed = new Uint8Array(await response.arrayBuffer());
    assert.equal(echoed.length, big.length);
    assert.ok(echoed.every((b, i) => b === big[i]), "body differs");
    assert.deepEqual(response.headers.getSetCookie(), ["a=1", "b=2"]);
    assert.equal(response.headers.get("x-kcoral-node"), "gpu-a");
    const id = response.headers.get("x-request-id")!;
    assert.equal(id, requestId, "the Router's id, not the client's or the node's");
    assert.notEqual(id, "11111111-2222-4333-8444-555555555555");
    const names = seenHeaders.map(([name]) => name);
    for (const dropped of ["host", "connection", "x-secret", "x-kcoral-node"]) {
      assert.ok(!names.includes(dropped), `${dropped} forwarded`);
    }
    assert.deepEqual(seenHeaders.filter(([n]) => n === "x-request-id"), [["x-request-id", id]]);
    assert.deepEqual(seenHeaders.filter(([n]) => n === "content-length"), [[
      "content-length",
      String(big.length),
    ]]);
    await waitFor("request_finished", () => r.finished().length === 1);
    const finished = r.finished()[0];
    assert.equal(finished.request_id, id);
    assert.equal(finished.finish_reason, "completed");
    assert.equal(finished.http_status, "200");
    assert.equal(finished.request_bytes, String(big.length));
    assert.equal(finished.response_bytes, String(big.length));
    // The slot went back to the FIFO: a second request runs on it.
    await waitFor("slot back", async () => (await capacity(r.url)) === 1);
    const again = await fetch(`${r.url}/execute`, { method: "POST", body: "x" });
    assert.equal(again.status, 200);
    assert.equal(await again.text(), "x");
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: 400 and 413 at the Router, 503 router_busy and no_node with Retry-After", async () => {
  const r = await startRouter([
    "--max-request-bytes",
    "1024",
    "--max-queued-requests",
    "1",
    "--queue-wait-timeout-seconds",
    "0.3",
  ]);
  const node = new FakeNode(r.url, "gpu-a");
  try {
    const tooLarge = await fetch(`${r.url}/execute`, {
      method: "POST",
      body: new Uint8Array(2048),
    });
    assert.equal(tooLarge.status, 413);
    const body = await tooLarge.json();
    assert.equal(body.error.kind, "request_too_large");
    assert.equal(body.request_id, tooLarge.headers.get("x-request-id"));
    // A streamed body over the limit (no Content-Length) is 413 too, once the node is chosen.
    await node.connect();
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let first = true;
    await node.openSlot(async (request) => {
      if (first) {
        first = false;
        await held;
      }
      request.respond(200);
      request.end();
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);
    const running = fetch(`${r.url}/execute`, { method: "POST", body: "held" });
    await waitFor("in progress", async () => {
      const h = await (await fetch(`${r.url}/health`)).json();
      return h.load.requests_in_progress === 1;
    });
    const queued = fetch(`${r.url}/execute`, { method: "POST", body: "queued" });
    await waitFor("waiting", async () => {
      const h = await (await fetch(`${r.url}/health`)).json();
      return h.load.requests_waiting === 1;
    });
    const busy = await fetch(`${r.url}/execute`, { method: "POST", body: "third" });
    assert.equal(busy.status, 503);
    assert.equal(busy.headers.get("retry-after"), "1");
    assert.equal((await busy.json()).error.kind, "router_busy");
    const noNode = await queued;
    assert.equal(noNode.status, 503);
    assert.equal(noNode.headers.get("retry-after"), "1");
    const noNodeBody = await noNode.json();
    assert.equal(noNodeBody.error.kind, "no_node");
    assert.equal(noNodeBody.error.message, "no compatible node has an available slot");
    release();
    const answer = await running;
    assert.equal(answer.status, 200);
    await answer.arrayBuffer();
    await waitFor("completed", () => r.finished().some((f) => f.finish_reason === "completed"));
    const raw = await Deno.connect({ hostname: "127.0.0.1", port: Number(new URL(r.url).port) });
    await raw.write(
      new TextEncoder().encode(
        "POST /execute HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\nhello",
      ),
    );
    const buf = new Uint8Array(4096);
    const n = await raw.read(buf);
    raw.close();
    assert.match(new TextDecoder().decode(buf.subarray(0, n!)), /^HTTP\/1\.1 400/);
    // The lines are gathered and written together, a moment after the answers.
    const reasons = () => r.finished().map((f) => f.finish_reason);
    const all = ["request_rejected", "queue_full", "queue_timeout", "completed"];
    await waitFor("every finish reason", () => all.every((reason) => reasons().includes(reason)));
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: a node failing after the head is a 502, never replayed on another node", async () => {
  const r = await startRouter();
  const bad = new FakeNode(r.url, "gpu-bad");
  const good = new FakeNode(r.url, "gpu-good");
  let goodGot = 0;
  try {
    await bad.connect();
    await good.connect();
    const badSlot = await bad.openSlot(async (request) => {
      await request.body();
      request.socket.close(); // the tunnel drops after taking the body
    });
    await good.openSlot((request) => {
      goodGot++;
      request.respond(200);
      request.end();
    });
    await waitFor("capacity 2", async () => (await capacity(r.url)) === 2);
    const response = await fetch(`${r.url}/execute`, {
      method: "POST",
      body: "payload",
      headers: { "x-kcoral-node": "gpu-bad" },
    });
    assert.equal(response.status, 502);
    const body = await response.json();
    assert.equal(body.error.kind, "server_transport");
    assert.match(body.error.message, /not retried/);
    assert.equal(goodGot, 0, "replayed on the other node");
    await closed(badSlot);
    await waitFor(
      "tunnel_disconnected",
      () => r.finished().some((f) => f.finish_reason === "tunnel_disconnected"),
    );
  } finally {
    bad.close();
    good.close();
    await r.stop();
  }
});

Deno.test("router: an invalid response head is a 502 invalid_response; the node sees the reason", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-a");
  try {
    await node.connect();
    const slot = await node.openSlot((request) => {
      // Another request's head.
      request.socket.send(
        encodeFrame(crypto.randomUUID(), { status: 200, headers: [] }, new Uint8Array(0), false),
      );
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);
    const response = await fetch(`${r.url}/execute`, { method: "POST", body: "x" });
    assert.equal(response.status, 502);
    assert.equal((await response.json()).error.kind, "server_transport");
    const end = await closed(slot);
    assert.equal(end.code, 4010);
    assert.equal(end.reason, "invalid_response");
    await waitFor("finished", () => r.finished().length === 1);
    assert.equal(r.finished()[0].finish_reason, "invalid_response");
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: an early answer is delivered whole; the slot is discarded (request_rejected)", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-a");
  try {
    await node.connect();
    const bigAnswer = new Uint8Array(2 * 1024 * 1024).fill(9);
    const slot = await node.openSlot(async (request) => {
      // Answer before reading the upload (as a node-side 413 does).
      request.respond(413, [["content-type", "application/octet-stream"]]);
      await request.write(bigAnswer);
      request.end();
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);
    const upload = new ReadableStream<Uint8Array>({
      start(controller) {
        // More than a frame (a body that stalls within its first frame never reaches a node)...
        controller.enqueue(new Uint8Array(300 * 1024));
        // ...and never more: the client is still "uploading" when the answer ends.
      },
    });
    const response = await fetch(`${r.url}/execute`, { method: "POST", body: upload });
    assert.equal(response.status, 413);
    assert.equal((await response.arrayBuffer()).byteLength, bigAnswer.length);
    const end = await closed(slot);
    assert.equal(end.reason, "request_rejected");
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: a client that goes away cancels the slot (client_disconnected)", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-a");
  try {
    await node.connect();
    const slot = await node.openSlot(async (request) => {
      request.respond(200);
      await request.write(new Uint8Array(1024));
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);
    const controller = new AbortController();
    const response = await fetch(`${r.url}/execute`, {
      method: "POST",
      body: "x",
      signal: controller.signal,
    });
    const reader = response.body!.getReader();
    await reader.read();
    controller.abort();
    const end = await closed(slot);
    assert.equal(end.code, 4010);
    assert.equal(end.reason, "client_disconnected");
    assert.deepEqual(node.cancels.map((c) => c.reason), ["client_disconnected"]);
    await waitFor("finished", () => r.finished().length === 1);
    assert.equal(r.finished()[0].finish_reason, "client_disconnected");
    await waitFor("capacity 0 in progress 0", async () => {
      const h = await (await fetch(`${r.url}/health`)).json();
      return h.load.requests_in_progress === 0 && h.load.request_capacity === 0;
    });
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: a node's 503 is passed through and marks it saturated", async () => {
  const r = await startRouter(["--status-check-interval-seconds", "0.5"]);
  const node = new FakeNode(r.url, "gpu-a");
  try {
    await node.connect();
    await node.openSlot((request) => {
      request.respond(503, [["content-type", "application/json"]]);
      request.write(new TextEncoder().encode('{"status":"ERROR","error":{"kind":"busy"}}'))
        .then(() => request.end());
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);
    const response = await fetch(`${r.url}/execute`, { method: "POST", body: "x" });
    assert.equal(response.status, 503);
    assert.equal(response.headers.get("retry-after"), null, "the node's answer, unchanged");
    assert.equal((await response.json()).error.kind, "busy");
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: an incompatible node never receives work", async () => {
  const r = await startRouter();
  const first = new FakeNode(r.url, "gpu-a", { versions: { torch: "2.11" } });
  const other = new FakeNode(r.url, "gpu-b", { versions: { torch: "2.10" } });
  let otherGot = 0;
  try {
    await first.connect();
    await first.openSlot((request) => {
      request.respond(200);
      request.end();
    });
    await waitFor("first ready", async () => (await capacity(r.url)) === 1);
    await other.connect();
    await other.openSlot((request) => {
      otherGot++;
      request.respond(200);
      request.end();
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.equal(await capacity(r.url), 1);
    for (let i = 0; i < 6; i++) {
      const response = await fetch(`${r.url}/execute`, {
        method: "POST",
        body: "x",
        headers: { "x-kcoral-node": "gpu-b" },
      });
      assert.equal(response.headers.get("x-kcoral-node"), "gpu-a");
      await response.arrayBuffer();
    }
    assert.equal(otherGot, 0);
    assert.ok(r.lines.some((l) => / node_incompatible .*gpu-b/.test(l)));
  } finally {
    first.close();
    other.close();
    await r.stop();
  }
});

Deno.test("router: a wrong or missing token is refused before anything is read", async () => {
  const r = await startRouter(["--node-token", "s3cret"]);
  try {
    for (const token of [null, "wrong", ""]) {
      const headers: Record<string, string> = {};
      if (token !== null) headers.authorization = `Bearer ${token}`;
      const response = await fetch(`${r.url}${CONTROL_PATH}`, {
        headers: { ...headers, upgrade: "websocket" },
      });
      assert.equal(response.status, 401, String(token));
      assert.match(await response.text(), /invalid node bearer token/);
    }
    await assert.rejects(() => openLink(r.url, SLOT_PATH, "wrong"), /401/);
    const node = new FakeNode(r.url, "gpu-a");
    await node.connect("s3cret");
    node.close();
  } finally {
    await r.stop();
  }
});

Deno.test("router: hostile node peers are closed; other nodes keep serving", async () => {
  const r = await startRouter();
  const good = new FakeNode(r.url, "gpu-good");
  try {
    await good.connect();
    await good.openSlot((request) => {
      request.respond(200);
      request.end();
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);

    // A slot whose first message is not hello.
    const notHello = await openLink(r.url, SLOT_PATH);
    notHello.send(encodeMessage(healthyStatus("gpu-x")));
    assert.equal((await closed(notHello)).code, 4003);
    // A binary first message.
    const binary = await openLink(r.url, SLOT_PATH);
    binary.send(new Uint8Array([1, 2, 3]));
    assert.equal((await closed(binary)).code, 4003);
    // Not JSON; a wrong protocol version (an older node's text heads and ends); an invalid node id.
    const garbage = await openLink(r.url, CONTROL_PATH);
    garbage.send("{not json");
    assert.equal((await closed(garbage)).code, 4003);
    const version = await openLink(r.url, SLOT_PATH);
    version.send(
      encodeMessage({
        t: "hello",
        node_id: "gpu-x",
        server_instance_id: "i",
        slot_id: "s",
        protocol_version: 1,
      }),
    );
    assert.equal((await closed(version)).code, 4009);
    const badId = await openLink(r.url, CONTROL_PATH);
    badId.send(encodeMessage(healthyStatus("bad name")));
    assert.equal((await closed(badId)).code, 4003);
    // A registered slot that floods messages while idle, or sends data without a request.
    const flooder = new FakeNode(r.url, "gpu-flood");
    await flooder.connect();
    const flood = await flooder.openSlot(() => {});
    for (let i = 0; i < 1000; i++) {
      flood.send(encodeMessage({ t: "credit", request_id: crypto.randomUUID(), frames: 1 }));
    }
    // Closed at the first one (the rest may meet a closed connection: code 4010 or abnormal).
    await closed(flood);
    assert.ok(r.lines.some((l) => /slot|invalid/.test(l)));
    const stray = await flooder.openSlot(() => {});
    stray.send(encodeFrame(crypto.randomUUID(), null, new Uint8Array(10), false));
    assert.equal((await closed(stray)).code, 4010);
    // An oversized frame in the middle of a request.
    const oversized = await flooder.openSlot((request) => {
      request.respond(200);
      request.socket.send(frameWithRoom(request.id, null, 262_145));
    });
    const response = await fetch(`${r.url}/execute`, {
      method: "POST",
      body: "x",
      headers: { "x-kcoral-node": "gpu-flood" },
    });
    // The head came before the violation: the client sees the answer cut short.
    await assert.rejects(() => response.arrayBuffer());
    assert.equal((await closed(oversized)).reason, "invalid_response");
    flooder.close();
    // A broken handshake (no Sec-WebSocket-Key; no "upgrade" in Connection): a 400 naming it.
    for (const headers of [{ connection: "upgrade" }, { connection: "keep-alive" }]) {
      const handshake = await fetch(`${r.url}${SLOT_PATH}`, {
        headers: { upgrade: "websocket", ...headers },
      });
      assert.equal(handshake.status, 400);
      const refusal = await handshake.json();
      assert.equal(refusal.error.kind, "invalid_request");
      assert.match(refusal.error.message, /^invalid WebSocket handshake: /);
    }
    assert.ok(r.lines.some((l) => /node_link_refused .*code=invalid_request/.test(l)));
    assert.ok(!r.lines.some((l) => /TypeError|^ {4}at /.test(l)), "no stack trace");
    // A peer that never says anything is closed after the first-message timeout (10 s): not
    // waited for here; the others did not disturb the good node.
    for (let i = 0; i < 3; i++) {
      const ok = await fetch(`${r.url}/execute`, {
        method: "POST",
        body: "x",
        headers: { "x-kcoral-node": "gpu-good" },
      });
      assert.equal(ok.status, 200);
      assert.equal(ok.headers.get("x-kcoral-node"), "gpu-good");
      await ok.arrayBuffer();
    }
  } finally {
    good.close();
    await r.stop();
  }
});

Deno.test("router: a stop lets queued requests go (503) and finishes the running one", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-a");
  try {
    await node.connect();
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    await node.openSlot(async (request) => {
      await held;
      request.respond(200);
      await request.write(new TextEncoder().encode("done"));
      request.end();
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);
    const running = fetch(`${r.url}/execute`, { method: "POST", body: "a" });
    await waitFor("running", async () => {
      const h = await (await fetch(`${r.url}/health`)).json();
      return h.load.requests_in_progress === 1;
    });
    const queued = fetch(`${r.url}/execute`, { method: "POST", body: "b" });
    await waitFor("queued", async () => {
      const h = await (await fetch(`${r.url}/health`)).json();
      return h.load.requests_waiting === 1;
    });
    const stopping = r.stop();
    const letGo = await queued;
    assert.equal(letGo.status, 503);
    assert.equal(letGo.headers.get("retry-after"), "1");
    assert.equal((await letGo.json()).error.message, "router is shutting down");
    // While stopping: a new request is refused like any other (ids, Retry-After), /health is 503.
    const late = await r.router.fetch(
      new Request(`${r.url}/execute`, { method: "POST", body: "c" }),
    );
    assert.equal(late.status, 503);
    assert.equal(late.headers.get("retry-after"), "1");
    const lateBody = await late.json();
    assert.equal(lateBody.error.kind, "router_busy");
    assert.equal(lateBody.request_id, late.headers.get("x-request-id"));
    const health = await r.router.fetch(new Request(`${r.url}/health`));
    assert.equal(health.status, 503);
    assert.equal((await health.json()).load.request_capacity, 0);
    release();
    const answer = await running;
    assert.equal(await answer.text(), "done");
    await stopping;
  } finally {
    node.close();
    await r.stop();
  }
});

/** A raw HTTP/1.1 POST /execute (connection closed after it): the answer's head and body bytes. */
async function rawExecute(url: string): Promise<{ head: string; body: Uint8Array }> {
  const { hostname, port } = new URL(url);
  const conn = await Deno.connect({ hostname, port: Number(port) });
  await conn.write(new TextEncoder().encode(
    "POST /execute HTTP/1.1\r\nhost: router\r\ncontent-length: 1\r\nconnection: close\r\n\r\nx",
  ));
  const bytes = new Uint8Array(await new Response(conn.readable).arrayBuffer());
  let end = 0;
  while (
    !(bytes[end] === 13 && bytes[end + 1] === 10 && bytes[end + 2] === 13 && bytes[end + 3] === 10)
  ) end++;
  return {
    head: new TextDecoder().decode(bytes.subarray(0, end)).toLowerCase(),
    body: bytes.subarray(end + 4),
  };
}

Deno.test("router: an answer of one frame goes out whole with its own length; larger ones and live output stream", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-a");
  let answer: (request: import("./_fake_node.ts").FakeRequest) => Promise<void> = async () => {};
  try {
    await node.connect();
    await node.openSlot(async (request) => {
      await request.body();
      await answer(request);
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);

    // Small, whatever Content-Length the node declared: the bytes up to its end, with their length.
    answer = async (request) => {
      request.respond(200, [["content-type", "application/json"], ["content-length", "999"]]);
      await request.write(new TextEncoder().encode('{"a":'));
      await request.write(new TextEncoder().encode("1}"));
      request.end();
    };
    const small = await rawExecute(r.url);
    assert.match(small.head, /^http\/1\.1 200/);
    assert.match(small.head, /\r\ncontent-length: 7\r\n/);
    assert.doesNotMatch(small.head, /transfer-encoding/);
    assert.equal(new TextDecoder().decode(small.body), '{"a":1}');

    // Past one frame: streamed (chunked), every byte in order.
    const large = Uint8Array.from({ length: 300_000 }, (_, i) => (i * 31 + (i >> 11)) & 0xff);
    answer = async (request) => {
      request.respond(200, [["content-type", "application/octet-stream"]]);
      await request.write(large);
      request.end();
    };
    const response = await fetch(`${r.url}/execute`, { method: "POST", body: "x" });
    assert.equal(response.headers.get("content-length"), null);
    assert.deepEqual(new Uint8Array(await response.arrayBuffer()), large);

    // Live output: its first piece reaches the client before the node has sent the rest.
    let more!: () => void;
    const moreWanted = new Promise<void>((resolve) => (more = resolve));
    answer = async (request) => {
      request.respond(200, [["content-type", "application/vnd.kcoral.live-output"]]);
      await request.write(new TextEncoder().encode("first"));
      await moreWanted;
      await request.write(new TextEncoder().encode("second"));
      request.end();
    };
    const live = await fetch(`${r.url}/execute`, { method: "POST", body: "x" });
    const reader = live.body!.getReader();
    assert.equal(new TextDecoder().decode((await reader.read()).value), "first");
    more();
    let rest = "";
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
      rest += new TextDecoder().decode(chunk.value);
    }
    assert.equal(rest, "second");
    await waitFor(
      "three completed",
      () => r.finished().filter((f) => f.finish_reason === "completed").length === 3,
    );
    assert.deepEqual(r.finished().map((f) => f.response_bytes), ["7", "300000", "11"]);
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: an answer with a status that has no body goes out without one", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-a");
  try {
    await node.connect();
    let declared = true;
    await node.openSlot(async (request) => {
      await request.body();
      // Taken whole when it declares its length, streamed when it does not.
      request.respond(204, declared ? [["content-length", "3"]] : []);
      await request.write(new Uint8Array([1, 2, 3]));
      request.end();
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);
    for (let i = 0; i < 2; i++) {
      declared = i === 0;
      const response = await fetch(`${r.url}/execute`, { method: "POST", body: "x" });
      assert.equal(response.status, 204);
      assert.equal(response.body, null);
    }
    await waitFor("two completed", () => r.finished().length === 2);
    assert.deepEqual(r.finished().map((f) => f.finish_reason), ["completed", "completed"]);
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: a client that leaves the queue gets an answer nobody reads, and its log line says so", async () => {
  const registry = new NodeRegistry(
    defaultRegistryConfig({ maxQueuedRequests: 4, queueWaitTimeoutMs: 30_000 }),
  );
  const lines: string[] = [];
  const events = new EventLog({
    logDir: null,
    console: true,
    programs: false,
    consoleWrite: (line) => lines.push(line),
  });
  try {
    const client = new AbortController();
    const answered = forwardExecute(
      new Request("http://router/execute", { method: "POST", body: "x", signal: client.signal }),
      { registry, maxRequestBytes: 1 << 20, events },
    );
    await new Promise((resolve) => setTimeout(resolve, 50)); // waiting: no node has joined
    client.abort();
    const response = await answered; // an answer, not a thrown RangeError (status 0)
    assert.equal(response.status, 499);
    await response.body?.cancel();
    const finished = lines.filter((line) => line.includes(" request_finished "));
    assert.equal(finished.length, 1);
    assert.match(finished[0], /finish_reason=client_disconnected/);
  } finally {
    registry.close();
  }
});

Deno.test("router: a body of one frame goes with its head and end in one message, and so may the answer", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-w");
  const seen: { oneFrame: boolean; body: string; length: number | null }[] = [];
  try {
    await node.connect();
    await node.openSlot(async (request) => {
      const body = await request.body();
      seen.push({
        oneFrame: request.cameInOneFrame,
        body: new TextDecoder().decode(body.subarray(0, 20)),
        length: request.head.content_length,
      });
      const answer = new TextEncoder().encode(`{"got":${body.length}}`);
      if (body.length <= 262_144) {
        request.respondComplete(200, [["content-length", String(answer.length)]], answer);
      } else {
        request.respond(200);
        await request.write(answer);
        request.end();
      }
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);

    const small = await fetch(`${r.url}/execute`, { method: "POST", body: "hello" });
    assert.equal(small.status, 200);
    assert.equal(small.headers.get("content-length"), "9");
    assert.equal(small.headers.get("x-kcoral-node"), "gpu-w");
    assert.equal(await small.text(), '{"got":5}');
    const empty = await fetch(`${r.url}/execute`, { method: "POST" });
    assert.equal(await empty.text(), '{"got":0}');
    // Larger than one frame: the head alone, frames of bytes, the end.
    const large = new Uint8Array(300_000).fill(120);
    const big = await fetch(`${r.url}/execute`, { method: "POST", body: large });
    assert.equal(await big.text(), '{"got":300000}');
    assert.deepEqual(seen.map((s) => [s.oneFrame, s.length]), [
      [true, 5],
      [true, 0],
      [false, 300_000],
    ]);
    assert.equal(seen[0].body, "hello");

    // A client that declares more than it sends: 400, and nothing reached the node (no cancel);
    // the one slot serves the next request.
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(new URL(r.url).port) });
    await conn.write(
      new TextEncoder().encode(
        "POST /execute HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhello",
      ),
    );
    await conn.closeWrite();
    const reply = new Uint8Array(4096);
    const n = await conn.read(reply);
    conn.close();
    assert.match(new TextDecoder().decode(reply.subarray(0, n ?? 0)), /^HTTP\/1\.1 400/);
    // Log lines come as attempts settle (a streamed answer's after its node's end): any order.
    await waitFor("its log line", () => r.finished().length === 4);
    assert.deepEqual(r.finished().map((f) => f.finish_reason).sort(), [
      "client_disconnected",
      "completed",
      "completed",
      "completed",
    ]);
    const after = await fetch(`${r.url}/execute`, { method: "POST", body: "again" });
    assert.equal(await after.text(), '{"got":5}');
    assert.equal(seen.length, 4);
    assert.deepEqual(node.cancels, []);
    assert.equal(node.sockets.filter((s) => s.readyState === WebSocket.OPEN).length, 2);
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: a frame from a node with a request head, or a body before its head, is a 502 invalid_response", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-w");
  try {
    await node.connect();
    for (const wrong of ["request head", "body first"]) {
      const socket = await node.openSlot((request) => {
        request.socket.send(
          wrong === "request head"
            ? encodeFrame(request.id, request.head, new Uint8Array(0), true)
            : encodeFrame(request.id, null, new Uint8Array([1]), true),
        );
      });
      await waitFor("capacity", async () => (await capacity(r.url)) === 1);
      const response = await fetch(`${r.url}/execute`, { method: "POST", body: "x" });
      assert.equal(response.status, 502);
      assert.equal((await response.json()).error.kind, "server_transport");
      const close = await closed(socket);
      assert.equal(close.reason, "invalid_response");
      await waitFor("no capacity", async () => (await capacity(r.url)) === 0);
    }
    await waitFor("log lines", () => r.finished().length === 2);
    assert.deepEqual(r.finished().map((f) => f.finish_reason), [
      "invalid_response",
      "invalid_response",
    ]);
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: a small body held back takes no slot; a slot that goes away meanwhile is not used", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-w");
  const served: string[] = [];
  try {
    await node.connect();
    const handler = (which: string) => async (request: FakeRequest) => {
      const body = new TextDecoder().decode(await request.body());
      served.push(`${which}:${body}`);
      const answer = new TextEncoder().encode(which);
      request.respondComplete(200, [["content-length", String(answer.length)]], answer);
    };
    const first = await node.openSlot(handler("first"));
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);
    // The client sends its head (a body of 10 declared) and holds the body back.
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(new URL(r.url).port) });
    await conn.write(
      new TextEncoder().encode("POST /execute HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n"),
    );
    // The body is read before a slot is taken (issue 44: a stalled body never holds one).
    const load = async () => (await (await fetch(`${r.url}/health`)).json()).load;
    for (let i = 0; i < 3; i++) {
      assert.deepEqual(
        [(await load()).requests_in_progress, (await load()).requests_waiting],
        [0, 0],
      );
    }
    // Meanwhile the slot's connection goes away and the node opens another.
    first.close();
    await node.openSlot(handler("second"));
    await conn.write(new TextEncoder().encode("0123456789"));
    const reply = new Uint8Array(4096);
    let text = "";
    const deadline = setTimeout(() => conn.close(), 10_000);
    try {
      while (!text.endsWith("second")) {
        const n = await conn.read(reply);
        if (n === null) break;
        text += new TextDecoder().decode(reply.subarray(0, n));
      }
    } catch {
      // closed at the deadline: the assertions below say what came
    } finally {
      clearTimeout(deadline);
    }
    try {
      conn.close();
    } catch {
      // already closed
    }
    assert.match(text, /^HTTP\/1\.1 200/);
    assert.ok(text.endsWith("second"), text);
    assert.deepEqual(served, ["second:0123456789"]);
    await waitFor("its log line", () => r.finished().length === 1);
    assert.equal(r.finished()[0].finish_reason, "completed");
  } finally {
    node.close();
    await r.stop();
  }
});

/** Sends a raw HTTP/1.1 request to the Router; returns the connection (read or close it). */
async function rawRequest(url: string, head: string, body = ""): Promise<Deno.TcpConn> {
  const { hostname, port } = new URL(url);
  const conn = await Deno.connect({ hostname, port: Number(port) });
  await conn.write(new TextEncoder().encode(head + "\r\n\r\n" + body));
  return conn;
}

/** Everything the server sends until it closes the connection. */
async function readAll(conn: Deno.TcpConn): Promise<string> {
  const buffer = new Uint8Array(65536);
  let text = "";
  for (let n = await conn.read(buffer); n !== null; n = await conn.read(buffer)) {
    text += new TextDecoder().decode(buffer.subarray(0, n));
  }
  conn.close();
  return text;
}

for (const phase of ["before the response head", "while a small answer is taken whole"]) {
  Deno.test(`router: a client gone ${phase} gives the slot up (client_disconnected)`, async () => {
    const r = await startRouter();
    const node = new FakeNode(r.url, "gpu-a");
    try {
      await node.connect();
      let reached!: () => void;
      const arrived = new Promise<void>((resolve) => (reached = resolve));
      const slot = await node.openSlot((request) => {
        // The node works on and on: no head, or a head of a small answer and no end.
        if (phase.startsWith("while")) request.respond(200, [["content-length", "10"]]);
        reached();
      });
      await waitFor("capacity", async () => (await capacity(r.url)) === 1);
      const conn = await rawRequest(
        r.url,
        "POST /execute HTTP/1.1\r\nhost: router\r\ncontent-length: 1",
        "x",
      );
      await arrived;
      conn.close();
      let timer!: ReturnType<typeof setTimeout>;
      const end = await Promise.race([
        closed(slot),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new Error("the slot was kept")), 5000);
        }),
      ]).finally(() => clearTimeout(timer));
      assert.equal(end.reason, "client_disconnected");
      assert.deepEqual(node.cancels.map((c) => c.reason), ["client_disconnected"]);
      await waitFor("finished", () => r.finished().length === 1);
      assert.equal(r.finished()[0].finish_reason, "client_disconnected");
      const health = await (await fetch(`${r.url}/health`)).json();
      assert.equal(health.load.requests_in_progress, 0);
    } finally {
      node.close();
      await r.stop();
    }
  });
}

Deno.test("router: a response head with headers no answer can carry is a 502 invalid_response", async () => {
  for (const bad of [["bad name", "1"], ["x-split", "a\nb"]] as [string, string][]) {
    const r = await startRouter();
    const node = new FakeNode(r.url, "gpu-a");
    try {
      await node.connect();
      const slot = await node.openSlot((request) => {
        request.respond(200, [["content-type", "application/json"], bad]);
        request.end();
      });
      await waitFor("capacity", async () => (await capacity(r.url)) === 1);
      const response = await fetch(`${r.url}/execute`, { method: "POST", body: "x" });
      assert.equal(response.status, 502, JSON.stringify(bad));
      const body = await response.json();
      assert.equal(body.error.kind, "server_transport");
      assert.equal(body.request_id, response.headers.get("x-request-id"));
      assert.equal((await closed(slot)).reason, "invalid_response");
      await waitFor("finished", () => r.finished().length === 1);
      assert.equal(r.finished()[0].finish_reason, "invalid_response");
    } finally {
      node.close();
      await r.stop();
    }
  }
});

Deno.test("router: a node's repeated response headers reach the client as separate lines", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-a");
  try {
    await node.connect();
    await node.openSlot((request) => {
      request.respond(200, [
        ["x-repeated", "1"],
        ["X-Repeated", "2"],
        ["set-cookie", "a=1"],
        ["set-cookie", "b=2"],
        ["content-length", "2"],
      ]);
      request.write(new TextEncoder().encode("ok")).then(() => request.end());
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);
    const text = await readAll(
      await rawRequest(
        r.url,
        "POST /execute HTTP/1.1\r\nhost: router\r\nconnection: close\r\ncontent-length: 1",
        "x",
      ),
    );
    const lines = text.split("\r\n").map((line) => line.toLowerCase());
    assert.deepEqual(lines.filter((l) => l.startsWith("x-repeated:")), [
      "x-repeated: 1",
      "x-repeated: 2",
    ]);
    assert.deepEqual(lines.filter((l) => l.startsWith("set-cookie:")), [
      "set-cookie: a=1",
      "set-cookie: b=2",
    ]);
    assert.ok(text.endsWith("\r\n\r\nok"), text);
  } finally {
    node.close();
    await r.stop();
  }
});

Deno.test("router: a Content-Length past 2^53 is 413 request_too_large, not 400", async () => {
  const r = await startRouter();
  try {
    // The answer comes before any of the body (which is never sent): read up to its JSON's end.
    const conn = await rawRequest(
      r.url,
      "POST /execute HTTP/1.1\r\nhost: router\r\ncontent-length: 9007199254740993",
    );
    const buffer = new Uint8Array(4096);
    let text = "";
    while (!text.endsWith("}")) {
      const n = await conn.read(buffer);
      if (n === null) break;
      text += new TextDecoder().decode(buffer.subarray(0, n));
    }
    conn.close();
    assert.match(text, /^HTTP\/1\.1 413 /);
    assert.match(text, /"kind":"request_too_large"/);
  } finally {
    await r.stop();
  }
});

Deno.test("router: a Content-Length repeated with one value stands for it; a node gets the body", async () => {
  const r = await startRouter();
  const node = new FakeNode(r.url, "gpu-a");
  try {
    await node.connect();
    const bodies: string[] = [];
    await node.openSlot(async (request) => {
      bodies.push(new TextDecoder().decode(await request.body()));
      request.respond(200, [["content-type", "text/plain"]]);
      request.end();
    });
    await waitFor("capacity", async () => (await capacity(r.url)) === 1);
    const conn = await rawRequest(
      r.url,
      "POST /execute HTTP/1.1\r\nhost: router\r\nconnection: close\r\ncontent-length: 3\r\n" +
        "content-length: 3",
      "abc",
    );
    const text = await readAll(conn);
    assert.match(text, /^HTTP\/1\.1 200 /);
    assert.deepEqual(bodies, ["abc"]);
  } finally {
    await node.close();
    await r.stop();
  }
});

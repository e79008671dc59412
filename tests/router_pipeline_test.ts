/**
 * The stages of a routed `POST /execute` without sockets (router/pipeline.ts): every answer the
 * Router makes itself is a `Rejection` with the spec's kind and status (spec router §2.2 "Error
 * body"), its length declared, its request id in header and body, and one `request_finished` line.
 */
import assert from "node:assert/strict";
import { EventLog } from "../http/events.ts";
import { Rejection } from "../http/rejection.ts";
import { BodyTimeoutError } from "../http/request_body.ts";
import { MAX_DATA_BYTES } from "../link/messages.ts";
import { RequestTrace, routerRejections } from "../router/finish.ts";
import { receiveRequest } from "../router/intake.ts";
import { defaultRegistryConfig } from "../router/options.ts";
import { forwardExecute } from "../router/pipeline.ts";
import { NodeRegistry, type RegistryConfig } from "../router/registry.ts";

/** An event log whose `request_finished` lines are kept, parsed. */
function recordedEvents() {
  const lines: string[] = [];
  const events = new EventLog({
    logDir: null,
    console: true,
    programs: false,
    consoleWrite: (line) => lines.push(line),
  });
  const finished = () =>
    lines.filter((line) => line.includes(" request_finished ")).map((line) =>
      Object.fromEntries([...line.matchAll(/(\w+)=(\S*)/g)].map((m) => [m[1], m[2]]))
    );
  return { events, finished };
}

/** The ERROR body of `response`, checked against its headers. */
async function errorBodyOf(response: Response) {
  const bytes = await response.bytes();
  assert.equal(response.headers.get("content-length"), String(bytes.length));
  assert.equal(response.headers.get("content-type"), "application/json");
  const body = JSON.parse(new TextDecoder().decode(bytes));
  assert.equal(body.status, "ERROR");
  assert.equal(body.request_id, response.headers.get("x-request-id"));
  return body as { request_id: string; error: { kind: string; message: string } };
}

/** One request through `forwardExecute` with no node; its answer and its log line. */
async function forwardWithoutNodes(
  request: Request,
  config: Partial<RegistryConfig> = {},
  before: (registry: NodeRegistry) => void = () => {},
) {
  const registry = new NodeRegistry(defaultRegistryConfig(config));
  const { events, finished } = recordedEvents();
  let finishedCalls = 0;
  before(registry);
  try {
    const response = await forwardExecute(request, {
      registry,
      maxRequestBytes: 1024,
      events,
      onFinished: () => finishedCalls++,
    });
    const body = await errorBodyOf(response);
    assert.equal(finishedCalls, 1);
    const lines = finished();
    assert.equal(lines.length, 1);
    assert.equal(lines[0].request_id, body.request_id);
    assert.equal(registry.health().load.requests_in_progress, 0);
    return { response, body, line: lines[0] };
  } finally {
    registry.close();
  }
}

const post = (body: BodyInit | null, headers: Record<string, string> = {}, signal?: AbortSignal) =>
  new Request("http://router/execute", { method: "POST", body, headers, signal });

/** `bytes` as a byte stream, as the Router's connections give a body (BYOB reads). */
const byteStream = (bytes: Uint8Array) =>
  new ReadableStream<Uint8Array>({
    type: "bytes",
    start(controller) {
      controller.enqueue(bytes);
      controller.close();
    },
  });

Deno.test("router intake: a Content-Length that is no length is a 400 invalid_request, length declared", async () => {
  const { response, body, line } = await forwardWithoutNodes(
    post("abc", { "content-length": "3, 4" }),
  );
  assert.equal(response.status, 400);
  assert.deepEqual(body.error, { kind: "invalid_request", message: "invalid Content-Length" });
  assert.equal(response.headers.get("retry-after"), null);
  assert.equal(line.http_status, "400");
  assert.equal(line.finish_reason, "request_rejected");
  assert.equal(line.error_kind, "invalid_request");
  assert.equal(line.node, "");
});

Deno.test("router intake: a declared length past the limit is 413; a small body of another length is 400", async () => {
  const limits = { maxRequestBytes: 1024 };
  const tooLarge = await receiveRequest(post("x", { "content-length": "2048" }), limits)
    .then(() => null, (error) => error);
  assert.ok(tooLarge instanceof Rejection);
  assert.equal(tooLarge.status, 413);
  assert.equal(tooLarge.kind, "request_too_large");
  const short = await receiveRequest(post("abc", { "content-length": "5" }), limits)
    .then(() => null, (error) => error);
  assert.ok(short instanceof Rejection);
  assert.equal(short.status, 400);
  assert.equal(short.message, "Content-Length does not match request body");
  // A body of one frame is read whole before a slot; of a larger one (a byte stream), its first
  // frame.
  const whole = await receiveRequest(post("abc", { "content-length": "3" }), limits);
  assert.deepEqual([whole.body?.length, whole.length, whole.prefix], [3, 3, null]);
  const empty = await receiveRequest(post(null), limits);
  assert.deepEqual([empty.body?.length, empty.prefix], [0, null]);
  const large = { maxRequestBytes: 1 << 20 };
  const declared = await receiveRequest(
    post(byteStream(new Uint8Array(300_000)), { "content-length": "300000" }),
    large,
  );
  assert.deepEqual([declared.body, declared.prefix?.length], [null, MAX_DATA_BYTES]);
  // Without a length: whole when it ends within a frame, else a frame and one byte more.
  const undeclaredSmall = await receiveRequest(post(byteStream(new Uint8Array(3))), large);
  assert.deepEqual([undeclaredSmall.body?.length, undeclaredSmall.prefix], [3, null]);
  const undeclared = await receiveRequest(post(byteStream(new Uint8Array(300_000))), large);
  assert.deepEqual([undeclared.body, undeclared.prefix?.length], [null, MAX_DATA_BYTES + 1]);
  // A larger body that ends within its first frame is not its declared length.
  const shortLarge = await receiveRequest(
    post(byteStream(new Uint8Array(100_000)), { "content-length": "300000" }),
    large,
  ).then(() => null, (error) => error);
  assert.ok(shortLarge instanceof Rejection);
  assert.equal(shortLarge.status, 400);
  assert.equal(shortLarge.message, "Content-Length does not match request body");
});

Deno.test("router intake: a body that stopped arriving (the connection's body timeout) is a 408 timeout", async () => {
  for (const length of ["2", "300000"]) {
    const stalled = new ReadableStream<Uint8Array>({
      type: "bytes",
      start(controller) {
        controller.enqueue(new Uint8Array(1)); // one byte, then the connection cut it
        controller.error(new BodyTimeoutError(1000));
      },
    });
    const rejection = await receiveRequest(
      post(stalled, { "content-length": length }),
      { maxRequestBytes: 1 << 20 },
    ).then(() => null, (error) => error);
    assert.ok(rejection instanceof Rejection, length);
    assert.equal(rejection.status, 408);
    assert.equal(rejection.kind, "timeout");
    assert.equal(rejection.message, "request body not received in time: no bytes for 1 s");
  }
});

Deno.test("router admission: a full queue, an ended wait and a stop are 503s with Retry-After", async () => {
  const full = await forwardWithoutNodes(post("x"), { maxQueuedRequests: 0 });
  assert.equal(full.response.status, 503);
  assert.equal(full.response.headers.get("retry-after"), "1");
  assert.deepEqual(full.body.error, { kind: "router_busy", message: "router queue is full" });
  assert.equal(full.line.finish_reason, "queue_full");

  const ended = await forwardWithoutNodes(post("x"), {
    maxQueuedRequests: 1,
    queueWaitTimeoutMs: 0,
  });
  assert.equal(ended.response.status, 503);
  assert.equal(ended.body.error.kind, "no_node");
  assert.equal(ended.line.finish_reason, "queue_timeout");

  const stopping = await forwardWithoutNodes(post("x"), {}, (registry) => registry.close());
  assert.equal(stopping.response.status, 503);
  assert.equal(stopping.response.headers.get("retry-after"), "1");
  assert.deepEqual(stopping.body.error, {
    kind: "router_busy",
    message: "router is shutting down",
  });
  assert.equal(stopping.line.finish_reason, "queue_timeout");
});

Deno.test("router admission: a client gone while it waits gets a 499 nobody reads, logged with status 0", async () => {
  const client = new AbortController();
  client.abort();
  const gone = await forwardWithoutNodes(post("x", {}, client.signal), { maxQueuedRequests: 1 });
  assert.equal(gone.response.status, 499);
  assert.equal(gone.body.error.kind, "invalid_request");
  assert.equal(gone.line.http_status, "0");
  assert.equal(gone.line.finish_reason, "client_disconnected");
});

Deno.test("router finish: one line per attempt, however many ways it ends", async () => {
  const { events, finished } = recordedEvents();
  let calls = 0;
  const trace = new RequestTrace(events, () => calls++);
  trace.node = "gpu-a";
  trace.status = 200;
  trace.reason = "completed";
  trace.finish();
  const late = trace.rejected(routerRejections.transport("invalid_response"));
  assert.equal(late.status, 502);
  assert.equal((await errorBodyOf(late)).error.kind, "server_transport");
  trace.finish();
  assert.equal(calls, 1);
  const lines = finished();
  assert.equal(lines.length, 1);
  assert.equal(lines[0].finish_reason, "completed");
  assert.equal(lines[0].node, "gpu-a");
});

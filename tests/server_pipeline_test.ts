/**
 * The `/execute` pipeline driven without `Deno.serve`: a `Request` built in code, its body a
 * stream arriving in pieces (as a node linked to a Router feeds the requests it tunnels), gives
 * the same answers and log records as over HTTP.
 */
import assert from "node:assert/strict";
import { createApp } from "../server/app.ts";
import { callProgram, multipartBody } from "./_server.ts";

Deno.test("pipeline: requests without a listener, bodies in pieces, answers and records", async () => {
  const app = createApp({
    device: "cpu",
    sandbox: "none",
    logConsole: false,
    logDir: null,
    diskCacheDir: null,
  });
  const events: Record<string, unknown>[] = [];
  app.subscribe((e) => events.push(e));
  await app.start();
  try {
    const { body, contentType } = multipartBody([{
      name: "program",
      contentType: "application/json",
      body: JSON.stringify(callProgram("def f(x):\n    return x * 2\n", "f", [21])),
    }]);
    const pieces = ReadableStream.from(
      Array.from({ length: Math.ceil(body.length / 7) }, (_, i) => body.subarray(i * 7, i * 7 + 7)),
    );
    const id = "0f6c2b4e-1111-4222-8333-444455556666";
    const response = await app.execute(
      new Request("http://node/execute", {
        method: "POST",
        body: pieces,
        headers: { "content-type": contentType, "x-request-id": id },
      }),
      "10.0.0.9",
    );
    assert.equal(response.status, 200);
    assert.equal(response.headers.get("x-request-id"), id);
    const json = await response.json();
    assert.deepEqual(json.results, { out: { type: "integer", value: 42 } });
    const received = events.find((e) => e.event === "request_received" && e.request_id === id)!;
    assert.equal(received.client, "10.0.0.9");
    const finished = events.find((e) => e.event === "request_finished" && e.request_id === id)!;
    assert.equal(finished.finish_reason, "completed");

    // A malformed one: the same 400 and record as over HTTP.
    const bad = await app.execute(
      new Request("http://node/execute", {
        method: "POST",
        body: "not multipart",
        headers: { "content-type": "text/plain" },
      }),
    );
    assert.equal(bad.status, 400);
    const error = (await bad.json()).error;
    assert.deepEqual(error, { kind: "parse", message: "expected a multipart/form-data request" });
  } finally {
    await app.shutdown();
  }
});

Deno.test("pipeline: an application not started answers 503 busy", async () => {
  const app = createApp({ device: "cpu", sandbox: "none", logConsole: false, logDir: null });
  const response = await app.execute(new Request("http://node/execute", { method: "POST" }));
  assert.equal(response.status, 503);
  assert.equal((await response.json()).error.kind, "busy");
  await app.shutdown();
});

/**
 * The `/execute` pipeline driven without `Deno.serve`: a `Request` built in code, its body a
 * stream arriving in pieces (as a node linked to a Router feeds the requests it tunnels), gives
 * the same answers and log records as over HTTP; so does a body in hand (a `WholeBodyRequest`,
 * a node's small tunnelled body), under the same limits.
 */
import assert from "node:assert/strict";
import { executeTunnelled } from "../server/app.ts";
import { callProgram, multipartBody, testApp } from "./_server.ts";

Deno.test("pipeline: requests without a listener, bodies in pieces, answers and records", async () => {
  const { app, events } = testApp();
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
  const { app } = testApp();
  const response = await app.execute(new Request("http://node/execute", { method: "POST" }));
  assert.equal(response.status, 503);
  assert.equal((await response.json()).error.kind, "busy");
  await app.shutdown();
});

Deno.test("pipeline: a body in hand (WholeBodyRequest) gets the answers and records a Request gets", async () => {
  const { app, events } = testApp({ maxRequestBytes: 4096 });
  await app.start();
  const whole = (headers: Record<string, string>, bytes: () => Promise<Uint8Array>) => {
    const request = { headers: new Headers(headers), bytes, discard: () => discarded++ };
    let discarded = 0;
    return { request, discarded: () => discarded };
  };
  try {
    const { body, contentType } = multipartBody([{
      name: "program",
      contentType: "application/json",
      body: JSON.stringify(callProgram("def f(x):\n    return x * 2\n", "f", [21])),
    }]);
    const records = (id: string) => events.filter((e) => e.request_id === id);
    const ids = [crypto.randomUUID(), crypto.randomUUID()];
    const answers = [];
    for (const [k, id] of ids.entries()) {
      const headers = {
        "content-type": contentType,
        "content-length": String(body.length),
        "x-request-id": id,
      };
      answers.push(
        await executeTunnelled(
          app,
          k === 0
            ? whole(headers, () => Promise.resolve(body)).request
            : new Request("http://node/execute", { method: "POST", body, headers }),
          "10.0.0.9",
        ),
      );
    }
    for (const [k, answer] of answers.entries()) {
      assert.equal(answer.status, 200);
      assert.equal(answer.headers.get("x-request-id"), ids[k]);
      assert.deepEqual((await answer.json()).results, { out: { type: "integer", value: 42 } });
    }
    const [a, b] = ids.map((id) => records(id));
    assert.deepEqual(a.map((e) => e.event), b.map((e) => e.event));
    const received = a.find((e) => e.event === "request_received")!;
    assert.equal(received.client, "10.0.0.9");
    assert.equal(received.content_length, String(body.length));

    // Declared over the limit: 413 before the body is asked for, and the body is discarded.
    const declared = whole(
      { "content-type": contentType, "content-length": "5000" },
      () => Promise.reject(new Error("not to be read")),
    );
    const tooLarge = await executeTunnelled(app, declared.request, null);
    assert.equal(tooLarge.status, 413);
    assert.equal((await tooLarge.json()).error.kind, "request_too_large");
    assert.equal(declared.discarded(), 1);
    // More bytes than the limit, whatever was declared: 413 too.
    const counted = await executeTunnelled(
      app,
      whole({ "content-type": contentType }, () => Promise.resolve(new Uint8Array(4097))).request,
      null,
    );
    assert.equal(counted.status, 413);
    await counted.body?.cancel();

    // A body that never arrives (the tunnel failed): 400, with the reason, as a body cut short.
    const cut = await executeTunnelled(
      app,
      whole({ "content-type": contentType }, () => Promise.reject(new Error("tunnel: gone")))
        .request,
      null,
    );
    assert.equal(cut.status, 400);
    assert.deepEqual((await cut.json()).error, {
      kind: "parse",
      message: "the request body could not be read: tunnel: gone",
    });

    // A stop while the body is still arriving: 503 busy, and the body is discarded.
    const pending = whole({ "content-type": contentType }, () => new Promise(() => {}));
    const answer = executeTunnelled(app, pending.request, null);
    await new Promise((resolve) => setTimeout(resolve, 20));
    await app.shutdown();
    const stopped = await answer;
    assert.equal(stopped.status, 503);
    assert.equal((await stopped.json()).error.kind, "busy");
    assert.equal(pending.discarded(), 1);
  } finally {
    await app.shutdown();
  }
});

Deno.test("pipeline: an application not started discards a body in hand (503 busy)", async () => {
  const { app } = testApp();
  let discarded = false;
  const response = await executeTunnelled(app, {
    headers: new Headers(),
    bytes: () => Promise.resolve(new Uint8Array(0)),
    discard: () => (discarded = true),
  }, null);
  assert.equal(response.status, 503);
  assert.ok(discarded);
  await response.body?.cancel();
  await app.shutdown();
});

import assert from "node:assert/strict";
import { BodyBuffers } from "../../http/body_buffers.ts";
import { HashThreads } from "../../protocol/hash_threads.ts";
import { discardBody, Intake, invalidRequest } from "./intake.ts";

Deno.test("intake: a small body is read and released", async () => {
  const hashes = new HashThreads(1);
  const intake = new Intake({
    maxRequestBytes: 1024,
    hashes,
    bodies: new BodyBuffers(1, 1 << 20, (n) => new ArrayBuffer(n)),
    mirrors: new BodyBuffers(1, 1 << 20, (n) => new SharedArrayBuffer(n)),
    store: null,
    track: () => {},
  });
  const received = await intake.receive(new Request("http://x/", { method: "POST", body: "hi" }));
  assert.equal(received.body.length, 2);
  received.release();
  hashes.close();
});

Deno.test("intake: discardBody discards a whole body and cancels a stream", async () => {
  let discarded = false;
  await discardBody({
    headers: new Headers(),
    bytes: () => Promise.resolve(new Uint8Array(0)),
    discard: () => (discarded = true),
  });
  assert.ok(discarded);
  await discardBody(new Request("http://x/", { method: "POST", body: "unwanted" }));
});

Deno.test("intake: invalidRequest is a 400 logged as invalid_request", () => {
  const rejection = invalidRequest("duplicate JSON key: 'a'");
  assert.equal(rejection.status, 400);
  assert.equal(rejection.fields.error_kind, "invalid_request");
});

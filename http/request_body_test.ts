// Receiving request bodies (http/request_body.ts): small bodies in one allocation, large ones
// read in place into a pooled buffer while an observer scans and hashes them.
import assert from "node:assert/strict";
import { LARGE_BODY_BYTES, readRequestBody } from "./request_body.ts";
import { PartDigests } from "../protocol/part_digests.ts";
import { encodeMultipart } from "../protocol/multipart_encode.ts";
import { parseMultipart } from "../protocol/multipart_parse.ts";
import { sha256Hex } from "../protocol/hash.ts";
import { randomBytes } from "../tests/_bytes.ts";
import { declaredLength } from "./request_body.ts";

function request(body: Uint8Array<ArrayBuffer>, contentType = "application/octet-stream"): Request {
  return new Request("http://x/execute", {
    method: "POST",
    body,
    headers: { "content-type": contentType, "content-length": String(body.length) },
  });
}

Deno.test("request body: small bodies are read whole, without the pool", async () => {
  const data = randomBytes(1000);
  let taken = 0;
  const got = await readRequestBody(request(data), 1 << 20, {
    take: (size) => (taken++, new ArrayBuffer(size)),
    observer: () => undefined,
  });
  assert.deepEqual(got?.body, data);
  assert.equal(got?.pooled, false);
  assert.equal(taken, 0);
  const tooLarge = new Request("http://x/execute", { method: "POST", body: data });
  assert.equal(
    await readRequestBody(tooLarge, 999, {
      take: () => new ArrayBuffer(0),
      observer: () => undefined,
    }),
    null,
  );
});

for (const source of ["byte stream", "buffer"] as const) {
  Deno.test(`request body: a large body (${source}) lands in the pooled buffer, observed`, async () => {
    const blob = randomBytes(LARGE_BODY_BYTES + 12345);
    const encoded = encodeMultipart([
      { name: "program", contentType: "application/json", body: new TextEncoder().encode("{}") },
      { name: `blob:${sha256Hex(blob)}`, contentType: "application/octet-stream", body: blob },
    ]);
    const pool = new ArrayBuffer(encoded.body.length + 100); // bigger than needed, as a reused one
    const poolSize = pool.byteLength;
    const headers = new Headers({ "content-type": encoded.contentType });
    let digests: PartDigests | undefined;
    let sent = 0;
    const stream = new ReadableStream({
      type: "bytes",
      pull(controller) {
        const next = Math.min(encoded.body.length, sent + 1_000_003);
        controller.enqueue(encoded.body.slice(sent, next));
        sent = next;
        if (sent === encoded.body.length) controller.close();
      },
    });
    const incoming = source === "buffer"
      ? request(encoded.body, encoded.contentType)
      : new Request("http://x/execute", {
        method: "POST",
        body: stream,
        headers: {
          "content-type": encoded.contentType,
          "content-length": String(encoded.body.length),
        },
      });
    const got = await readRequestBody(incoming, 1 << 30, {
      take: () => pool,
      observer: () => digests = PartDigests.forMultipart(headers),
    });
    assert.ok(got && got.pooled && got.digests === digests);
    assert.equal(got.body.length, encoded.body.length);
    assert.equal(got.body.byteOffset, 0);
    assert.equal(got.body.buffer.byteLength, poolSize); // the pooled memory...
    if (source === "byte stream") assert.ok(pool.detached); // ...moved by the BYOB reads
    else assert.equal(got.body.buffer, pool); // ...filled by copies
    assert.deepEqual(got.body, encoded.body);
    await digests!.settle();
    const parts = parseMultipart(got.body, encoded.contentType.split("boundary=")[1], {
      marks: digests!.marksFor(got.body),
    });
    assert.equal(digests!.lookup(parts[1].body), sha256Hex(blob));
  });
}

Deno.test("request_body: declaredLength", () => {
  if (declaredLength(new Headers({ "content-length": "3, 3" })) !== 3) throw new Error();
  if (!Number.isNaN(declaredLength(new Headers({ "content-length": "3, 4" })))) throw new Error();
  if (declaredLength(new Headers()) !== null) throw new Error();
});

// Digests computed while a multipart response arrives (client/_part_digests.ts), and the
// aligned placement of the first binary payload; end to end, a corrupted part is still caught.
import assert from "node:assert/strict";
import { PartDigests } from "../client/_part_digests.ts";
import { HashThread } from "../client/_hash_thread.ts";
import { Client, Program, ProtocolError } from "../mod.ts";
import { encodeMultipart } from "../protocol/multipart.ts";
import { sha256Hex } from "../protocol/hash.ts";
import { parseMultipart } from "../protocol/multipart.ts";
import { completed, fakeServer } from "./fixtures/protocol/fake_server.ts";

function body(parts: Uint8Array[], json = "{}") {
  return encodeMultipart([
    { name: "result", contentType: "application/json", body: new TextEncoder().encode(json) },
    ...parts.map((bytes, i) => ({
      name: `return:${i}`,
      contentType: "application/octet-stream",
      body: bytes,
    })),
  ]);
}

function random(n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i += 65536) crypto.getRandomValues(out.subarray(i, i + 65536));
  return out;
}

Deno.test("part digests: every payload hashed in arbitrary arrival steps; first one aligned", async () => {
  const payloads = [random(9_000_001), new Uint8Array(0), random(70)];
  const thread = new HashThread();
  for (
    const [json, threaded] of [
      ["{}", false],
      [`{"k":"${"x".repeat(5)}"}`, true],
      [`{"k":"${"y".repeat(6)}"}`, false],
      [`{"k":"${"z".repeat(7)}"}`, true],
    ] as const
  ) {
    const encoded = body(payloads, json);
    const digests = PartDigests.forResponse(
      new Headers({ "content-type": encoded.contentType }),
      threaded ? thread : undefined,
    )!;
    const pad = digests.pad(encoded.body.subarray(0, 16384));
    const buffer = new Uint8Array(pad + encoded.body.length).subarray(pad);
    let received = 0;
    // Byte by byte through the first headers, then ever larger steps.
    for (const [step, until] of [[1, 300], [5, 2000], [4096, 3 << 20], [77_777, 6 << 20]]) {
      while (received < Math.min(until, buffer.length)) {
        const next = Math.min(buffer.length, received + step);
        buffer.set(encoded.body.subarray(received, next), received);
        received = next;
        await digests.update(buffer, received);
      }
    }
    while (received < buffer.length) {
      const next = Math.min(buffer.length, received + (1 << 20));
      buffer.set(encoded.body.subarray(received, next), received);
      received = next;
      await digests.update(buffer, received);
    }
    await digests.settle();
    const parts = parseMultipart(buffer, encoded.contentType.split("boundary=")[1]);
    assert.equal(parts.length, 4);
    for (const part of parts) assert.equal(digests.lookup(part.body), sha256Hex(part.body));
    assert.equal(parts[1].body.byteOffset % 8, 0, `pad ${pad}`);
    // Bytes that are not exactly a payload seen are unknown, not guessed.
    assert.equal(digests.lookup(parts[1].body.subarray(1)), undefined);
    assert.equal(digests.lookup(parts[1].body.slice()), undefined);
  }
  assert.equal(
    PartDigests.forResponse(new Headers({ "content-type": "application/json" })),
    undefined,
  );
});

Deno.test("part digests: a corrupted payload still fails the hash check", async () => {
  const data = random(9 << 20); // large enough to be hashed on the client's thread
  const declared = sha256Hex(data);
  data[12345] ^= 1; // the bytes sent no longer match the digest the result declares
  const results = `{"t":{"type":"bytes","part":"return:0","sha256":"${declared}"}}`;
  const encoded = body([data], completed("r1", results));
  const server = fakeServer(() =>
    new Response(encoded.body, { headers: { "content-type": encoded.contentType } })
  );
  try {
    await using client = new Client(server.url);
    const program = new Program();
    program.return_({
      key: "t",
      value: program.upload({ kind: "bytes", value: new Uint8Array(1) }),
    });
    await assert.rejects(
      client.execute(program),
      (error: unknown) =>
        error instanceof ProtocolError &&
        error.message.includes(
          `blob hash mismatch: declared ${declared}, computed ${sha256Hex(data)}`,
        ),
    );
  } finally {
    await server.close();
  }
});

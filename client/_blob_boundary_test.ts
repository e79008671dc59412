import assert from "node:assert/strict";
import { blobBoundary, noteBlobs, unscannedBlobs } from "./_blob_boundary.ts";
import { boundaryOccursIn } from "../protocol/multipart_encode.ts";
import { Program } from "../mod.ts";

Deno.test("blob boundary: kept while absent from new blobs, re-drawn when one holds it", () => {
  const owner = {};
  const first = new Uint8Array(1000);
  noteBlobs(owner, [first], [first]);
  const boundary = blobBoundary(owner)!;
  assert.match(boundary, /^kcoral-[0-9a-f]{32}$/);
  const second = new Uint8Array(500);
  noteBlobs(owner, [first, second], [second]);
  assert.equal(blobBoundary(owner), boundary); // nothing to re-draw
  // A blob holding the delimiter forces a new boundary, absent from every blob.
  const holder = new TextEncoder().encode(`x\r\n--${boundary}\r\n`);
  noteBlobs(owner, [first, second, holder], [holder]);
  const next = blobBoundary(owner)!;
  assert.notEqual(next, boundary);
  for (const blob of [first, second, holder]) assert.ok(!boundaryOccursIn(blob, next));
  assert.equal(blobBoundary({}), undefined);
});

Deno.test("blob boundary: a program's uploads keep its boundary out of every blob", () => {
  const program = new Program();
  program.upload({ kind: "module", source: "x = 1\n" });
  assert.equal(blobBoundary(program), undefined); // no blobs yet
  program.upload({ kind: "bytes", value: new Uint8Array(64) });
  const boundary = blobBoundary(program)!;
  program.upload({ kind: "bytes", value: new TextEncoder().encode(`\r\n--${boundary}`) });
  const next = blobBoundary(program)!;
  assert.notEqual(next, boundary);
  for (const blob of program.blobs.values()) assert.ok(!boundaryOccursIn(blob, next));
});

Deno.test("blob boundary: adopted blobs join unscanned, other blobs still set the boundary", async () => {
  const { adoptBytes } = await import("./_known_digests.ts");
  const { sha256Hex } = await import("../protocol/hash.ts");
  const program = new Program();
  const adopted = new TextEncoder().encode("a result passed on");
  adoptBytes(adopted, sha256Hex(adopted));
  program.upload({ kind: "bytes", value: adopted });
  assert.equal(blobBoundary(program), undefined); // nothing scanned
  assert.deepEqual([...unscannedBlobs(program)], [adopted]);
  program.upload({ kind: "bytes", value: new Uint8Array(64) });
  assert.ok(blobBoundary(program));
  assert.equal(unscannedBlobs(program).size, 1);
  assert.equal(unscannedBlobs(new Program()).size, 0);
});

import assert from "node:assert/strict";
import { BlobStore } from "../cache/cache_memory.ts";
import { sha256Hex } from "../../protocol/hash.ts";
import { WorkerFileError } from "../workers/worker_files.ts";
import { fillKeptDigests, keepReturns } from "./kept_returns.ts";
import { FileSourceError, HashThreads } from "../../protocol/hash_threads.ts";

async function setup() {
  const dir = await Deno.makeTempDir();
  const store = new BlobStore(`${dir}/blobs`, 64 << 20);
  const hashes = new HashThreads(1);
  let placeholders = 0;
  const write = async (name: string, bytes: Uint8Array) => {
    await Deno.writeFile(`${dir}/${name}`, bytes);
    const placeholder = `kcoral-kept-${(++placeholders).toString(16).padStart(32, "0")}`;
    return { path: `${dir}/${name}`, size: bytes.length, placeholder, sha256: sha256Hex(bytes) };
  };
  const blobFiles = () => [...Deno.readDirSync(`${dir}/blobs`)].map((e) => e.name).sort();
  return {
    store,
    hashes,
    write,
    blobFiles,
    async [Symbol.asyncDispose]() {
      hashes.close();
      store.close();
      await Deno.remove(dir, { recursive: true });
    },
  };
}

Deno.test("keepReturns: copies each value into the cache under the digest it computed", async () => {
  await using t = await setup();
  const big = new Uint8Array(9 << 20).map((_, i) => i * 7);
  const parts = [await t.write("kept-0", big), await t.write("kept-1", new Uint8Array(0))];
  const digests = await keepReturns(parts, {
    store: t.store,
    maxBytes: 10 << 20,
    hashes: t.hashes,
  });
  assert.deepEqual(digests, parts.map((part) => part.sha256));
  for (const part of parts) assert.ok(t.store.has(part.sha256));
  assert.deepEqual(await Deno.readFile(t.store.path(parts[0].sha256)), big);
  assert.equal(t.store.retainedBytes, big.length); // retained (LRU), not pinned
  assert.deepEqual(t.blobFiles(), parts.map((p) => p.sha256).sort());
});

Deno.test("keepReturns: a worker's malformed placeholder, size or total is refused and nothing is cached", async () => {
  await using t = await setup();
  const part = await t.write("kept-0", new TextEncoder().encode("honest bytes"));
  const target = { store: t.store, maxBytes: 1024, hashes: t.hashes };
  const refused = async (
    parts: typeof part[],
    message: RegExp,
    keep: typeof target | null = target,
  ) =>
    await assert.rejects(
      () => keepReturns(parts, keep),
      (e: unknown) => e instanceof WorkerFileError && message.test(e.message),
    );
  await refused([{ ...part, placeholder: "00".repeat(32) }], /has a malformed placeholder/);
  await refused([{ ...part, placeholder: `${part.placeholder}"` }], /has a malformed placeholder/);
  await refused([{ ...part, size: part.size - 1 }], /has 12 bytes, not 11/);
  await refused([part, part], /over the request's/, {
    store: t.store,
    maxBytes: part.size,
    hashes: t.hashes,
  });
  await refused([part], /did not ask for/, null);
  assert.deepEqual(t.blobFiles(), []); // no copy left behind
  assert.ok(!t.store.has(part.sha256));
});

Deno.test("fillKeptDigests: each placeholder, once as a JSON string, becomes its digest", () => {
  const [a, b] = ["1", "2"].map((k) => `kcoral-kept-${k.padStart(32, "0")}`);
  const kept = [{ path: "kept-0", size: 1, placeholder: a }, {
    path: "kept-1",
    size: 2,
    placeholder: b,
  }];
  const digests = ["aa".repeat(32), "bb".repeat(32)];
  const node = (p: string) => `{"type":"kept","kind":"bytes","sha256":"${p}","size":1}`;
  const results = `{"x":${node(a)},"y":{"type":"array","value":[${node(b)}]}}`;
  assert.deepEqual(JSON.parse(fillKeptDigests(results, kept, digests)), {
    x: JSON.parse(node(digests[0])),
    y: { type: "array", value: [JSON.parse(node(digests[1]))] },
  });
  assert.equal(fillKeptDigests("{}", [], []), "{}");
  const refused = (text: string, message: RegExp) =>
    assert.throws(
      () => fillKeptDigests(text, kept, digests),
      (e: unknown) => e instanceof WorkerFileError && message.test(e.message),
    );
  refused(`{"x":${node(a)}}`, /kept-1's placeholder nowhere/);
  refused(`{"x":${node(a)},"y":${node(b)},"s":{"type":"string","value":"${b}"}}`, /twice/);
  // Not as a whole JSON string (inside a longer one): not its place.
  refused(`{"x":${node(a)},"s":{"type":"string","value":"${b}x"}}`, /nowhere/);
});

Deno.test("keepReturns: with hashing threads, several values are copied at once, digests in order", async () => {
  await using t = await setup();
  const hashes = new HashThreads(2);
  try {
    const values = Array.from(
      { length: 11 },
      (_, k) => new Uint8Array((k + 1) * (700 << 10)).map((_, i) => (i * 13 + k) & 0xff),
    );
    const parts = await Promise.all(values.map((bytes, k) => t.write(`kept-${k}`, bytes)));
    const total = values.reduce((sum, bytes) => sum + bytes.length, 0);
    const digests = await keepReturns(parts, { store: t.store, maxBytes: total, hashes });
    assert.deepEqual(digests, parts.map((part) => part.sha256));
    for (const [k, part] of parts.entries()) {
      assert.deepEqual(await Deno.readFile(t.store.path(part.sha256)), values[k]);
    }
    // A value that is not the size the worker stated fails the lot; no copy is left behind.
    const more = await t.write("kept-x", new Uint8Array(3 << 20).fill(7));
    const short = { ...more, size: more.size + 1 };
    await assert.rejects(
      () => keepReturns([more, short], { store: t.store, maxBytes: 8 << 20, hashes }),
      (e: unknown) =>
        e instanceof WorkerFileError && /has \d+ bytes, not|changed size/.test(e.message),
    );
    assert.equal(t.blobFiles().filter((name) => name.startsWith(".kept-")).length, 0);
  } finally {
    hashes.close();
  }
});

Deno.test("keepReturns: a source that changed under the copy is the worker's fault, other failures the server's", async () => {
  await using t = await setup();
  const part = await t.write("kept-0", new Uint8Array(64).fill(1));
  const failing = (error: Error) => ({ copyHashing: () => Promise.reject(error) });
  await assert.rejects(
    () =>
      keepReturns([part], {
        store: t.store,
        maxBytes: 64,
        hashes: failing(new FileSourceError(`${part.path} changed size`)),
      }),
    (e: unknown) =>
      e instanceof WorkerFileError && /kept return .*kept-0 changed size/.test(e.message),
  );
  await assert.rejects(
    () =>
      keepReturns([part], {
        store: t.store,
        maxBytes: 64,
        hashes: failing(new Error("No space left on device")),
      }),
    (e: unknown) => !(e instanceof WorkerFileError) && /No space left/.test(String(e)),
  );
  assert.deepEqual(t.blobFiles(), []); // nothing cached, no copy left
});

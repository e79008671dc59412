/** The memory blob cache (LRU, pinning, capacity/4) and the disk file cache (spec server §6). */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { DiskFileCache } from "./cache_disk.ts";
import { BlobStore } from "./cache_memory.ts";
import { resolveBlobs } from "./blobs.ts";
import { parseProgram } from "../../protocol/program.ts";

const sha = (bytes: Uint8Array) => createHash("sha256").update(bytes).digest("hex");
const bytesOf = (n: number, fill: number) => new Uint8Array(n).fill(fill);
const exists = (path: string) => {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
};

Deno.test("memory cache: LRU eviction of unpinned blobs, hits refresh recency", async () => {
  const dir = await Deno.makeTempDir();
  const store = new BlobStore(`${dir}/blobs`, 400);
  const [a, b, c] = [bytesOf(100, 1), bytesOf(100, 2), bytesOf(100, 3)];
  for (const blob of [a, b, c]) {
    await store.putPinned(sha(blob), blob, true);
    store.unpin([sha(blob)]);
  }
  assert.equal(store.retainedBytes, 300);
  assert.ok(store.has(sha(a))); // a becomes most recent
  const d = bytesOf(100, 4);
  const e = bytesOf(100, 5);
  await store.putPinned(sha(d), d, true);
  store.unpin([sha(d)]);
  await store.putPinned(sha(e), e, true); // over capacity: evicts the least recent (b)
  store.unpin([sha(e)]);
  assert.equal(store.has(sha(b)), false);
  assert.equal(exists(store.path(sha(b))), false, "evicted files are deleted");
  for (const blob of [a, c, d, e]) assert.ok(store.has(sha(blob)));
  assert.deepEqual(await Deno.readFile(store.path(sha(a))), a);
  store.close();
  await Deno.remove(dir, { recursive: true });
});

Deno.test("memory cache: a large dropped blob is unlinked off the event loop, never a new copy", async () => {
  const dir = await Deno.makeTempDir();
  // The large-file unlink waits for the test's go, as a busy thread pool would make it.
  const unlinking: string[] = [];
  const go = Promise.withResolvers<void>();
  const store = new BlobStore(`${dir}/blobs`, 1 << 20, async (path) => {
    unlinking.push(path);
    await go.promise;
    await Deno.remove(path);
  });
  const [a, b] = [bytesOf(250_000, 1), bytesOf(250_000, 2)];
  const big = bytesOf(400_000, 3); // over a quarter of the capacity: kept only while pinned
  for (const blob of [a, b]) {
    await store.putPinned(sha(blob), blob, true);
    store.unpin([sha(blob)]);
  }
  await store.putPinned(sha(big), big, true);
  store.unpin([sha(big)]); // transient: dropped now
  assert.equal(store.has(sha(big)), false);
  assert.equal(exists(store.path(sha(big))), false, "out of the blob's name at once");
  assert.equal(unlinking.length, 1);
  assert.notEqual(unlinking[0], store.path(sha(big)), "the file is unlinked under another name");
  // Stored again before the old file's unlink ran: the new file must survive it.
  await store.putPinned(sha(big), big, true);
  go.resolve();
  await store.unlinked();
  assert.deepEqual(await Deno.readFile(store.path(sha(big))), big);
  store.unpin([sha(big)]);
  // LRU eviction of large blobs goes the same way.
  const [c, d, e] = [bytesOf(250_000, 4), bytesOf(250_000, 5), bytesOf(250_000, 6)];
  for (const blob of [c, d, e]) {
    await store.putPinned(sha(blob), blob, true);
    store.unpin([sha(blob)]);
  }
  assert.equal(store.has(sha(a)), false, "the least recent went");
  await store.unlinked();
  const names = [...Deno.readDirSync(store.dir)].map((entry) => entry.name).sort();
  assert.deepEqual(names, [b, c, d, e].map(sha).sort(), "only the retained blobs' files are left");
  store.close();
  await Deno.remove(dir, { recursive: true });
});

Deno.test("memory cache: pinned blobs are never evicted; oversized ones serve only their request", async () => {
  const dir = await Deno.makeTempDir();
  const store = new BlobStore(`${dir}/blobs`, 400);
  const pinned = bytesOf(100, 9);
  await store.putPinned(sha(pinned), pinned, true); // stays pinned
  for (let i = 0; i < 6; i++) {
    const blob = bytesOf(100, 10 + i);
    await store.putPinned(sha(blob), blob, true);
    store.unpin([sha(blob)]);
  }
  assert.ok(store.has(sha(pinned)), "a pinned blob survives eviction pressure");
  const big = bytesOf(101, 7); // over capacity/4
  await store.putPinned(sha(big), big, true);
  assert.ok(exists(store.path(sha(big))), "usable while its request runs");
  store.unpin([sha(big)]);
  assert.equal(store.has(sha(big)), false, "not retained afterwards");
  assert.equal(exists(store.path(sha(big))), false);
  assert.equal(store.pinExisting([sha(big)]), false);
  store.close();
  await Deno.remove(dir, { recursive: true });
});

Deno.test("memory cache: a file written elsewhere is adopted by rename, or dropped if stored", async () => {
  const dir = await Deno.makeTempDir();
  const store = new BlobStore(`${dir}/blobs`, 400);
  const blob = bytesOf(100, 3);
  const spool = (name: string) => {
    Deno.writeFileSync(`${store.dir}/${name}`, blob);
    return `${store.dir}/${name}`;
  };
  assert.equal(await store.adoptPinned(sha(blob), spool(".spool-1"), 100, true), true);
  assert.deepEqual(await Deno.readFile(store.path(sha(blob))), blob);
  assert.equal(exists(`${store.dir}/.spool-1`), false);
  // Already stored: the second file is deleted, the blob pinned once more.
  assert.equal(await store.adoptPinned(sha(blob), spool(".spool-2"), 100, true), false);
  assert.equal(exists(`${store.dir}/.spool-2`), false);
  store.unpin([sha(blob)]);
  store.unpin([sha(blob)]);
  assert.ok(store.has(sha(blob)));
  // A failed rename stores nothing and leaves the file to the caller.
  const other = bytesOf(50, 4);
  await assert.rejects(store.adoptPinned(sha(other), `${store.dir}/.missing`, 50, true));
  assert.equal(store.has(sha(other)), false);
  store.close();
  await Deno.remove(dir, { recursive: true });
});

Deno.test("blob resolution: a spool file that cannot be taken over is deleted, the blob written", async () => {
  const dir = await Deno.makeTempDir();
  const store = new BlobStore(`${dir}/blobs`, 400);
  const blob = bytesOf(100, 6);
  const program = parseProgram(JSON.stringify({
    instructions: [{ op: "upload", id: "u", kind: "bytes", blob: sha(blob) }],
  }));
  const spool = `${store.dir}/.spool-x`;
  Deno.writeFileSync(spool, blob);
  // A directory in the blob's place makes the rename fail (the failed write then clears it).
  Deno.mkdirSync(store.path(sha(blob)));
  const resolved = await resolveBlobs(program, new Map([[sha(blob), blob]]), {
    store,
    disk: new DiskFileCache(null, 0),
    spooled: () => spool,
  });
  assert.equal(resolved.kind, "ready");
  assert.deepEqual(await Deno.readFile(store.path(sha(blob))), blob); // written anew
  assert.equal(exists(spool), false);
  store.close();
  await Deno.remove(dir, { recursive: true });
});

Deno.test("disk cache: layout v1/<2 hex>/<sha256>, hash re-verified, corrupt = miss", async () => {
  const dir = await Deno.makeTempDir();
  const cache = new DiskFileCache(dir, 1 << 20);
  await cache.prepare();
  const blob = new TextEncoder().encode("file contents");
  const key = sha(blob);
  await cache.putBatch([[key, blob]]);
  const path = `${dir}/v1/${key.slice(0, 2)}/${key}`;
  assert.ok(exists(path));
  assert.deepEqual(await cache.get(key), blob);
  await Deno.writeFile(path, new TextEncoder().encode("tampered!!!!!"));
  assert.equal(await cache.get(key), null, "a corrupt object is a miss");
  await Deno.remove(path);
  await Deno.symlink("/etc/hostname", path);
  assert.equal(await cache.get(key), null, "a symlink is never followed");
  await Deno.remove(dir, { recursive: true });
});

Deno.test("disk cache: mtime LRU eviction to capacity; stale temporaries removed; disabled forms", async () => {
  const dir = await Deno.makeTempDir();
  const cache = new DiskFileCache(dir, 250);
  await cache.prepare();
  const blobs = [bytesOf(100, 1), bytesOf(100, 2)];
  await cache.putBatch(blobs.map((b) => [sha(b), b]));
  const old = new Date(Date.now() - 60_000);
  const p0 = `${dir}/v1/${sha(blobs[0]).slice(0, 2)}/${sha(blobs[0])}`;
  Deno.utimeSync(p0, old, old);
  assert.deepEqual(await cache.get(sha(blobs[0])), blobs[0], "a read bumps the mtime");
  const p1 = `${dir}/v1/${sha(blobs[1]).slice(0, 2)}/${sha(blobs[1])}`;
  Deno.utimeSync(p1, old, old);
  const third = bytesOf(100, 3);
  const stale = `${dir}/v1/aa/.tmp-crashed`;
  Deno.mkdirSync(`${dir}/v1/aa`, { recursive: true });
  Deno.writeFileSync(stale, new Uint8Array(1));
  Deno.utimeSync(stale, new Date(0), new Date(0));
  await cache.putBatch([[sha(third), third]]);
  assert.equal(await cache.get(sha(blobs[1])), null, "the least recently used object went");
  assert.deepEqual(await cache.get(sha(blobs[0])), blobs[0]);
  assert.deepEqual(await cache.get(sha(third)), third);
  assert.equal(exists(stale), false);
  await cache.putBatch([[sha(bytesOf(300, 4)), bytesOf(300, 4)]]); // larger than the capacity
  assert.equal(await cache.get(sha(bytesOf(300, 4))), null);
  assert.equal(new DiskFileCache(null, 100).enabled, false);
  assert.equal(new DiskFileCache(dir, 0).enabled, false);
  await Deno.remove(dir, { recursive: true });
});

import assert from "node:assert/strict";
import { EventLog } from "../../http/events.ts";
import { encodeMultipart } from "../../protocol/multipart_encode.ts";
import { DiskFileCache } from "../cache/cache_disk.ts";
import { BlobStore } from "../cache/cache_memory.ts";
import { resolveServerConfig } from "../config.ts";
import { admitRequest } from "./admission.ts";

Deno.test("admission: a program without blobs is admitted with the default timeout", async () => {
  const program = '{"instructions":[{"op":"upload","kind":"module","source":"","id":"m"}]}';
  const { body, contentType } = encodeMultipart([
    { name: "program", contentType: "application/json", body: new TextEncoder().encode(program) },
  ]);
  const store = new BlobStore(await Deno.makeTempDir(), 1 << 20);
  const admitted = await admitRequest(
    {
      config: resolveServerConfig({ device: "cpu", diskCacheDir: null }),
      events: new EventLog({ logDir: null, console: false, programs: false }),
      caches: { store, disk: new DiskFileCache(null, 0) },
    },
    {
      body,
      digests: undefined,
      receiveStart: 0,
      blobsResolved() {},
      noteDiskWrite() {},
      release() {},
    },
    contentType,
    "0f6c2b4e-1111-4222-8333-444455556666",
  );
  assert.equal(admitted.kind, "admitted");
  assert.equal(admitted.kind === "admitted" && admitted.timeoutSeconds, 300);
  if (admitted.kind === "admitted") admitted.releaseBlobs();
  store.close(); // removes its directory
});

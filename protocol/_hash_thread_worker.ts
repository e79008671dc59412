// Worker side of client/_hash_thread.ts: incremental SHA-256 per id over transferred buffers,
// each buffer sent back for reuse.
import { createHash, type Hash } from "node:crypto";

const hashes = new Map<number, Hash>();
const scope = self as unknown as Worker;

scope.onmessage = (event: MessageEvent) => {
  const message = event.data;
  if (message.t === "update") {
    let hash = hashes.get(message.id);
    if (!hash) hashes.set(message.id, hash = createHash("sha256"));
    hash.update(new Uint8Array(message.buffer, 0, message.length));
    scope.postMessage({ t: "buffer", buffer: message.buffer }, [message.buffer]);
  } else if (message.t === "digest") {
    const hash = hashes.get(message.id) ?? createHash("sha256");
    hashes.delete(message.id);
    scope.postMessage({ t: "digest", id: message.id, hex: hash.digest("hex") });
  }
};

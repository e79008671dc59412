// Worker side of protocol/_hash_thread.ts: incremental SHA-256 per id over transferred buffers
// (each sent back for reuse) or over ranges of shared memory.
import { createHash, type Hash } from "node:crypto";

const hashes = new Map<number, Hash>();
const scope = self as unknown as Worker;

scope.onmessage = (event: MessageEvent) => {
  const message = event.data;
  if (message.t === "update") {
    _hash(message.id).update(new Uint8Array(message.buffer, 0, message.length));
    scope.postMessage({ t: "buffer", buffer: message.buffer }, [message.buffer]);
  } else if (message.t === "shared") {
    // Bytes the sender keeps unchanged in shared memory until it asks for the digest.
    _hash(message.id).update(new Uint8Array(message.buffer, message.offset, message.length));
  } else if (message.t === "digest") {
    const hash = hashes.get(message.id) ?? createHash("sha256");
    hashes.delete(message.id);
    scope.postMessage({ t: "digest", id: message.id, hex: hash.digest("hex") });
  }
};

function _hash(id: number): Hash {
  let hash = hashes.get(id);
  if (!hash) hashes.set(id, hash = createHash("sha256"));
  return hash;
}

// Worker thread of server/hash_pool.ts: SHA-256 of a range of a SharedArrayBuffer.
import { createHash } from "node:crypto";

interface _Job {
  id: number;
  buffer: SharedArrayBuffer;
  offset: number;
  length: number;
}

(self as unknown as Worker).onmessage = (event: MessageEvent<_Job>) => {
  const { id, buffer, offset, length } = event.data;
  try {
    const digest = createHash("sha256").update(new Uint8Array(buffer, offset, length)).digest(
      "hex",
    );
    (self as unknown as Worker).postMessage({ id, digest });
  } catch (error) {
    (self as unknown as Worker).postMessage({ id, error: String(error) });
  }
};

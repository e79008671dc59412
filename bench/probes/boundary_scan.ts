/**
 * The client's multipart encoding of two 64 MiB payloads, which scans them for the drawn
 * boundary (upstream re-draws it until no payload contains it).
 *
 *   deno run -A bench/probes/boundary_scan.ts
 *
 * @module
 */
import { encodeMultipartChunks } from "../../protocol/multipart_encode.ts";
import { randomBytes } from "../_programs.ts";
const n = 64 << 20;
const a = randomBytes(n), b = randomBytes(n);
for (let k = 0; k < 5; k++) {
  const t0 = performance.now();
  encodeMultipartChunks([
    { name: "program", contentType: "application/json", body: new Uint8Array(100) },
    { name: "blob:x", contentType: "application/octet-stream", body: a },
    { name: "blob:y", contentType: "application/octet-stream", body: b },
  ]);
  console.log("encode", (performance.now() - t0).toFixed(1));
}

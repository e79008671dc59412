import { concatBytes, releaseBuffer } from "./bytes.ts";

Deno.test("bytes: concatBytes", () => {
  const joined = concatBytes([new Uint8Array([1]), new Uint8Array([2, 3])]);
  if (joined.length !== 3 || joined[2] !== 3) throw new Error("unexpected");
});

Deno.test("bytes: releaseBuffer", () => {
  const bytes = new Uint8Array(1 << 18).subarray(37);
  releaseBuffer(bytes);
  if (bytes.length !== 0 || bytes.buffer.byteLength !== 0) throw new Error("still attached");
});

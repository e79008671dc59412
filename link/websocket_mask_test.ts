import { maskInto } from "./websocket_mask.ts";

Deno.test("websocket mask: maskInto", () => {
  const key = new Uint8Array([1, 2, 3, 4]);
  const out = new Uint8Array(5);
  maskInto(new Uint8Array([1, 2, 3, 4, 5]), key, out);
  if (out.join() !== "0,0,0,0,4") throw new Error(`unexpected ${out}`);
  // The same bytes as the second piece of a message, one byte in:
  maskInto(new Uint8Array([2, 3, 4, 1]), key, out, 1);
  if (out.subarray(0, 4).join() !== "0,0,0,0") throw new Error(`unexpected ${out}`);
});

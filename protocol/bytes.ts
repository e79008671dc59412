/**
 * Joining byte chunks (one allocation, `TypedArray.set` copies).
 *
 * @module
 */

/**
 * Concatenates `chunks` into one new array.
 *
 * @example
 * ```ts
 * import { concatBytes } from "./bytes.ts";
 * const joined = concatBytes([new Uint8Array([1]), new Uint8Array([2, 3])]);
 * if (joined.length !== 3 || joined[2] !== 3) throw new Error("unexpected");
 * ```
 */
export function concatBytes(chunks: readonly Uint8Array[]): Uint8Array<ArrayBuffer> {
  let length = 0;
  for (const chunk of chunks) length += chunk.length;
  const out = new Uint8Array(length);
  let offset = 0;
  for (const chunk of chunks) {
    out.set(chunk, offset);
    offset += chunk.length;
  }
  return out;
}

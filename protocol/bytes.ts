/**
 * Byte chunks: joining them (one allocation, `TypedArray.set` copies), and giving a buffer's memory
 * back as soon as it is no longer read.
 *
 * @module
 */

/** Concatenates `chunks` into one new array. */
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

/**
 * Gives the memory behind `bytes` back now rather than at a later garbage collection: its
 * `ArrayBuffer` is detached (`transfer(0)`), so every view on it becomes empty. For a buffer that
 * nothing in JavaScript reads again; an op that took it (a socket write in flight) holds its own
 * reference, and the memory goes when that ends. Large buffers received or sent one after another
 * (a 64 MiB answer as 256 KiB WebSocket messages) otherwise pile up until a collection, and each
 * new one lands on freshly mapped pages (page faults on every copy into it). A buffer that cannot
 * be detached (shared, WebAssembly memory) is left as it is.
 */
export function releaseBuffer(bytes: Uint8Array): void {
  const buffer = bytes.buffer;
  if (!(buffer instanceof ArrayBuffer) || buffer.detached) return;
  try {
    buffer.transfer(0);
  } catch {
    // not detachable: collected as usual
  }
}

/**
 * Length-prefixed JSON frames over a worker slot's pipes (docs/architecture.md §2.1):
 * a 4-byte big-endian length, then that many bytes of UTF-8 JSON (one object).
 *
 * @module
 */
import { concatBytes } from "../protocol/bytes.ts";

/** One decoded frame: a JSON object with a string `t` (its type). */
export type Frame = { t: string; c?: number; [key: string]: unknown };

/** The largest frame either side may send; bulk bytes travel as files, never as frames. */
export const MAX_FRAME_BYTES = 64 * 1024 * 1024;

const _encoder = new TextEncoder();
const _decoder = new TextDecoder("utf-8", { fatal: true });

/** Encodes one frame: length prefix and JSON body in a single buffer. */
export function encodeFrame(frame: Frame): Uint8Array {
  const body = _encoder.encode(JSON.stringify(frame));
  const out = new Uint8Array(4 + body.length);
  new DataView(out.buffer).setUint32(0, body.length);
  out.set(body, 4);
  return out;
}

/**
 * Reads frames from a byte stream until it ends. Throws if a frame is malformed or larger
 * than {@linkcode MAX_FRAME_BYTES}; a stream that ends mid-frame ends the iteration.
 */
export async function* readFrames(
  stream: ReadableStream<Uint8Array>,
): AsyncGenerator<Frame, void, void> {
  let buffer: Uint8Array = new Uint8Array(0);
  for await (const chunk of stream) {
    buffer = buffer.length === 0 ? chunk : concatBytes([buffer, chunk]);
    let offset = 0;
    while (buffer.length - offset >= 4) {
      const length = new DataView(buffer.buffer, buffer.byteOffset + offset, 4).getUint32(0);
      if (length > MAX_FRAME_BYTES) throw new Error(`worker frame too large: ${length} bytes`);
      if (buffer.length - offset - 4 < length) break;
      const body = buffer.subarray(offset + 4, offset + 4 + length);
      offset += 4 + length;
      const frame = JSON.parse(_decoder.decode(body));
      if (frame === null || typeof frame !== "object" || typeof frame.t !== "string") {
        throw new Error("worker frame is not an object with a string 't'");
      }
      yield frame as Frame;
    }
    buffer = offset === buffer.length ? new Uint8Array(0) : buffer.slice(offset);
  }
}

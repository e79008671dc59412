/**
 * Length-prefixed JSON frames over a worker slot's pipes: a 4-byte big-endian length, then UTF-8
 * JSON (one object), optionally a NUL byte and a binary tail (a `run` frame's program).
 *
 * @module
 */

/** One decoded frame: a JSON object with a string `t` (its type). */
export type Frame = { t: string; c?: number; [key: string]: unknown };

/** The largest frame either side may send; bulk bytes travel as files, never as frames. */
export const MAX_FRAME_BYTES = 64 * 1024 * 1024;

const _encoder = new TextEncoder();
const _decoder = new TextDecoder("utf-8", { fatal: true });

/** Encodes one frame in one buffer: length prefix, JSON body and, given a `tail`, NUL and tail. */
export function encodeFrame(frame: Frame, tail?: Uint8Array): Uint8Array {
  const body = _encoder.encode(JSON.stringify(frame));
  const length = body.length + (tail ? 1 + tail.length : 0);
  const out = new Uint8Array(4 + length);
  new DataView(out.buffer).setUint32(0, length);
  out.set(body, 4);
  if (tail) out.set(tail, 5 + body.length);
  return out;
}

/**
 * Reads frames from a byte stream until it ends; throws for a malformed frame or one over
 * `maxBytes`. A frame's chunks are joined once, when complete (joining as they come is quadratic).
 */
export async function* readFrames(
  stream: ReadableStream<Uint8Array>,
  maxBytes: number = MAX_FRAME_BYTES,
): AsyncGenerator<Frame, void, void> {
  const pending = new _Chunks();
  for await (const chunk of stream) {
    pending.push(chunk);
    while (pending.length >= 4) {
      const length = new DataView(pending.peek(4).buffer).getUint32(0);
      if (length > maxBytes) throw new Error(`worker frame too large: ${length} bytes`);
      if (pending.length < 4 + length) break;
      const body = pending.take(4 + length).subarray(4);
      const frame = JSON.parse(_decoder.decode(body));
      if (frame === null || typeof frame !== "object" || typeof frame.t !== "string") {
        throw new Error("worker frame is not an object with a string 't'");
      }
      yield frame as Frame;
    }
  }
}

/** Received bytes not yet framed: a list of chunks, joined only when taken. */
class _Chunks {
  #chunks: Uint8Array[] = [];
  #length = 0;

  get length(): number {
    return this.#length;
  }

  push(chunk: Uint8Array): void {
    if (chunk.length === 0) return;
    this.#chunks.push(chunk);
    this.#length += chunk.length;
  }

  /** A copy of the first `n` bytes (n ≤ length), left in place. */
  peek(n: number): Uint8Array {
    const out = new Uint8Array(n);
    let filled = 0;
    for (const chunk of this.#chunks) {
      const part = chunk.subarray(0, n - filled);
      out.set(part, filled);
      filled += part.length;
      if (filled === n) break;
    }
    return out;
  }

  /** The first `n` bytes (n ≤ length), removed: a view when one chunk holds them, else a copy. */
  take(n: number): Uint8Array {
    const first = this.#chunks[0];
    const out = first.length >= n ? first.subarray(0, n) : this.peek(n);
    this.#length -= n;
    for (let left = n; left > 0;) {
      const chunk = this.#chunks[0];
      if (chunk.length <= left) {
        this.#chunks.shift();
        left -= chunk.length;
      } else {
        this.#chunks[0] = chunk.subarray(left);
        left = 0;
      }
    }
    return out;
  }
}

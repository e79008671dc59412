/**
 * Synchronous text output of `kcoral run` (stdout, stderr): whole strings, UTF-8.
 *
 * @module
 */

/** Where bytes go: `Deno.stdout`, `Deno.stderr`, or a test buffer. */
export interface ByteSink {
  /** Write some of `bytes`; returns how many were written. */
  writeSync(bytes: Uint8Array): number;
}

const _encoder = new TextEncoder();

/**
 * Write all of `text` to `sink` as UTF-8 (lone surrogates become U+FFFD).
 *
 * @example
 * ```ts
 * import { MemorySink, writeText } from "./io.ts";
 * const sink = new MemorySink();
 * writeText(sink, "kcoral: saved artifacts to out\n");
 * ```
 */
export function writeText(sink: ByteSink, text: string): void {
  let bytes = _encoder.encode(text);
  while (bytes.length > 0) bytes = bytes.subarray(sink.writeSync(bytes));
}

/**
 * An in-memory {@linkcode ByteSink} (for tests and for capturing output).
 *
 * @example
 * ```ts
 * import { MemorySink, writeText } from "./io.ts";
 * const sink = new MemorySink();
 * writeText(sink, "héllo");
 * sink.text(); // "héllo"
 * ```
 */
export class MemorySink implements ByteSink {
  readonly #chunks: Uint8Array[] = [];

  /** Keep a copy of `bytes`; always writes them all. */
  writeSync(bytes: Uint8Array): number {
    this.#chunks.push(bytes.slice());
    return bytes.length;
  }

  /** Everything written so far. */
  bytes(): Uint8Array {
    const total = this.#chunks.reduce((sum, chunk) => sum + chunk.length, 0);
    const all = new Uint8Array(total);
    let offset = 0;
    for (const chunk of this.#chunks) {
      all.set(chunk, offset);
      offset += chunk.length;
    }
    return all;
  }

  /** Everything written so far, decoded as UTF-8. */
  text(): string {
    return new TextDecoder().decode(this.bytes());
  }
}

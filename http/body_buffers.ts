/**
 * Reused receive buffers for large request bodies (first touch of fresh memory costs ~0.6 ms per
 * MiB on VMs). A buffer goes back only when nothing of its request can read it; a BYOB reader
 * transfers it on every read, so the last `ArrayBuffer` returned is the one to give back. The owner
 * drops idle buffers ({@linkcode BodyBuffers.clear}) a while after the last use.
 *
 * @module
 */

/** What a {@linkcode BodyBuffers} pool reports. */
export interface BodyBuffersOptions {
  /** Called whenever a buffer is taken or given back (e.g. to time dropping idle ones). */
  onUse?: () => void;
}

/**
 * A pool keeping up to `keep` buffers of at most `maxBytes` each (the largest are kept), made by
 * `create`: plain `ArrayBuffer`s for bodies, `SharedArrayBuffer` mirrors that hashing threads read.
 */
export class BodyBuffers<B extends ArrayBufferLike> {
  readonly #keep: number;
  readonly #maxBytes: number;
  readonly #create: (size: number) => B;
  readonly #onUse: () => void;
  #free: B[] = [];

  /**
   * Keeps at most `keep` idle buffers of at most `maxBytes` bytes each, new ones from `create`;
   * `options.onUse` hears of every take and give.
   */
  constructor(
    keep: number,
    maxBytes: number,
    create: (size: number) => B,
    options: BodyBuffersOptions = {},
  ) {
    this.#keep = keep;
    this.#maxBytes = maxBytes;
    this.#create = create;
    this.#onUse = options.onUse ?? (() => {});
  }

  /** Idle buffers held (for tests and diagnostics). */
  get idle(): number {
    return this.#free.length;
  }

  /** A buffer of at least `size` bytes; its contents are whatever was there before. */
  take(size: number): B {
    this.#onUse();
    let best = -1;
    for (let i = 0; i < this.#free.length; i++) {
      const length = this.#free[i].byteLength;
      if (length >= size && (best < 0 || length < this.#free[best].byteLength)) best = i;
    }
    return best >= 0 ? this.#free.splice(best, 1)[0] : this.#create(size);
  }

  /** Returns `buffer` (taken from here) for reuse; detached or oversized ones are dropped. */
  give(buffer: B): void {
    this.#onUse();
    if ((buffer as { detached?: boolean }).detached || buffer.byteLength > this.#maxBytes) return;
    if (this.#free.includes(buffer)) return;
    this.#free.push(buffer);
    this.#free.sort((a, b) => b.byteLength - a.byteLength);
    this.#free.length = Math.min(this.#free.length, this.#keep);
  }

  /** Drops every idle buffer. */
  clear(): void {
    this.#free = [];
  }
}

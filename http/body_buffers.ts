/**
 * Reused receive buffers for large request bodies. Touching fresh memory is slow on VMs (the
 * H200 host pays ~0.6 ms per MiB on first touch), and a 128 MiB upload otherwise lands in a new
 * allocation every time. A buffer goes back to the pool only when nothing of its request can
 * read it any more, and idle ones are dropped after a while without large bodies, so an idle server
 * does not hold them. (A BYOB reader transfers the buffer on every read: what comes back is a new
 * `ArrayBuffer` object over the same memory, which is the one to give back.)
 *
 * @module
 */

/**
 * A pool keeping up to `keep` buffers of at most `maxBytes` each (the largest are kept), made by
 * `create`: plain `ArrayBuffer`s for bodies, `SharedArrayBuffer` mirrors that hashing threads
 * read.
 */
export class BodyBuffers<B extends ArrayBufferLike> {
  readonly #keep: number;
  readonly #maxBytes: number;
  readonly #create: (size: number) => B;
  readonly #releaseAfterMs: number;
  #free: B[] = [];
  /** When a buffer was last taken or given back. */
  #lastUse = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;

  /**
   * Keeps at most `keep` idle buffers of at most `maxBytes` bytes each, new ones from `create`;
   * with `releaseAfterMs`, idle buffers are dropped once none was taken or given back for that
   * long (the timer never keeps the process alive; {@linkcode clear} stops it).
   */
  constructor(
    keep: number,
    maxBytes: number,
    create: (size: number) => B,
    options: { releaseAfterMs?: number } = {},
  ) {
    this.#keep = keep;
    this.#maxBytes = maxBytes;
    this.#create = create;
    this.#releaseAfterMs = options.releaseAfterMs ?? Infinity;
  }

  /** Idle buffers held (for tests and diagnostics). */
  get idle(): number {
    return this.#free.length;
  }

  /** A buffer of at least `size` bytes; its contents are whatever was there before. */
  take(size: number): B {
    this.#lastUse = performance.now();
    let best = -1;
    for (let i = 0; i < this.#free.length; i++) {
      const length = this.#free[i].byteLength;
      if (length >= size && (best < 0 || length < this.#free[best].byteLength)) best = i;
    }
    return best >= 0 ? this.#free.splice(best, 1)[0] : this.#create(size);
  }

  /** Returns `buffer` (taken from here) for reuse; detached or oversized ones are dropped. */
  give(buffer: B): void {
    if ((buffer as { detached?: boolean }).detached || buffer.byteLength > this.#maxBytes) return;
    if (this.#free.includes(buffer)) return;
    this.#free.push(buffer);
    this.#free.sort((a, b) => b.byteLength - a.byteLength);
    this.#free.length = Math.min(this.#free.length, this.#keep);
    this.#lastUse = performance.now();
    this.#armRelease(this.#releaseAfterMs);
  }

  /** Drops every idle buffer (and stops the release timer). */
  clear(): void {
    this.#free = [];
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #armRelease(delay: number): void {
    if (this.#timer !== undefined || !Number.isFinite(delay)) return;
    const timer = setTimeout(() => {
      this.#timer = undefined;
      const idleFor = performance.now() - this.#lastUse;
      if (idleFor >= this.#releaseAfterMs) this.clear();
      else this.#armRelease(this.#releaseAfterMs - idleFor);
    }, delay);
    Deno.unrefTimer(timer);
    this.#timer = timer;
  }
}

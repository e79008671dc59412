/**
 * SHA-256 of large request blobs on worker threads. A request body over
 * {@linkcode SHARED_BODY_MIN_BYTES} is received into a `SharedArrayBuffer`, so every blob in it
 * can be hashed at the same time, each on its own thread, without copying, while the event loop
 * keeps serving other requests. Smaller or unshared buffers are hashed inline.
 *
 * @module
 */
import { sha256Hex } from "../protocol/hash.ts";

/** Bodies at least this large are received into shared memory and hashed off-thread. */
export const SHARED_BODY_MIN_BYTES = 8 * 1024 * 1024;

/** Blobs smaller than this are hashed inline (a thread hop costs more). */
const _OFF_THREAD_MIN_BYTES = 1024 * 1024;

interface _Pending {
  resolve: (digest: string) => void;
  reject: (error: Error) => void;
}

/** A lazily started pool of hashing threads. */
export class HashPool {
  readonly #size: number;
  #workers: Worker[] = [];
  #next = 0;
  #jobId = 0;
  #pending = new Map<number, _Pending>();
  #closed = false;

  /** Up to `size` threads (default: the cores less one, between 1 and 4). */
  constructor(size = Math.max(1, Math.min(4, (navigator.hardwareConcurrency ?? 2) - 1))) {
    this.#size = size;
  }

  /** The SHA-256 (lowercase hex) of `bytes`. */
  digest(bytes: Uint8Array): Promise<string> {
    if (
      this.#closed || !(bytes.buffer instanceof SharedArrayBuffer) ||
      bytes.length < _OFF_THREAD_MIN_BYTES
    ) {
      return Promise.resolve(sha256Hex(bytes));
    }
    const worker = this.#worker();
    const id = ++this.#jobId;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      worker.postMessage({
        id,
        buffer: bytes.buffer,
        offset: bytes.byteOffset,
        length: bytes.length,
      });
    });
  }

  /** Starts every thread now (their start-up then overlaps the receipt of a large body). */
  warm(): void {
    if (this.#closed) return;
    while (this.#workers.length < this.#size) this.#worker();
  }

  /** Stops the threads; digests still pending fail. */
  close(): void {
    this.#closed = true;
    for (const worker of this.#workers) worker.terminate();
    this.#workers = [];
    for (const pending of this.#pending.values()) pending.reject(new Error("hash pool closed"));
    this.#pending.clear();
  }

  #worker(): Worker {
    if (this.#workers.length < this.#size) {
      const worker = new Worker(new URL("./_hash_worker.ts", import.meta.url), { type: "module" });
      worker.onmessage = (event: MessageEvent<{ id: number; digest?: string; error?: string }>) => {
        const pending = this.#pending.get(event.data.id);
        if (!pending) return;
        this.#pending.delete(event.data.id);
        if (event.data.digest !== undefined) pending.resolve(event.data.digest);
        else pending.reject(new Error(`hashing failed: ${event.data.error}`));
      };
      worker.onerror = (event) => {
        event.preventDefault();
        for (const pending of this.#pending.values()) {
          pending.reject(new Error(`hashing thread failed: ${event.message}`));
        }
        this.#pending.clear();
      };
      this.#workers.push(worker);
      return worker;
    }
    return this.#workers[this.#next++ % this.#workers.length];
  }
}

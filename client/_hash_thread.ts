// SHA-256 on a worker thread for large response payloads: the reading thread copies each new
// stretch into one of a few reused 4 MiB buffers (a copy costs a fraction of hashing) and goes
// on reading while the worker hashes. Used by client/_part_digests.ts for big bodies.

const _PIECE = 4 * 1024 * 1024;
const _BUFFERS = 6;

/** One hashing thread with a ring of transfer buffers; started on first use. */
export class HashThread {
  #worker: Worker | null = null;
  #free: ArrayBuffer[] = [];
  #created = 0;
  #waiting: (() => void)[] = [];
  #nextId = 0;
  #digests = new Map<number, { resolve: (hex: string) => void; reject: (e: Error) => void }>();
  #failure: Error | null = null;

  /** A new incremental hash; feed it with {@linkcode update}, end it with {@linkcode digest}. */
  open(): number {
    return ++this.#nextId;
  }

  /** Appends `bytes` to hash `id` (copied; `bytes` may change afterwards). */
  async update(id: number, bytes: Uint8Array): Promise<void> {
    for (let offset = 0; offset < bytes.length; offset += _PIECE) {
      const piece = bytes.subarray(offset, Math.min(bytes.length, offset + _PIECE));
      const buffer = await this.#buffer();
      new Uint8Array(buffer, 0, piece.length).set(piece);
      this.#start().postMessage({ t: "update", id, buffer, length: piece.length }, [buffer]);
    }
  }

  /** The hex digest of everything given to `id`. */
  digest(id: number): Promise<string> {
    if (this.#failure) return Promise.reject(this.#failure);
    return new Promise((resolve, reject) => {
      this.#digests.set(id, { resolve, reject });
      this.#start().postMessage({ t: "digest", id });
    });
  }

  /** Stops the thread; pending digests fail. */
  close(): void {
    this.#worker?.terminate();
    this.#worker = null;
    this.#fail(new Error("the hashing thread was closed"));
  }

  async #buffer(): Promise<ArrayBuffer> {
    for (;;) {
      if (this.#failure) throw this.#failure;
      const free = this.#free.pop();
      if (free) return free;
      if (this.#created < _BUFFERS) {
        this.#created++;
        return new ArrayBuffer(_PIECE);
      }
      await new Promise<void>((resolve) => this.#waiting.push(resolve));
    }
  }

  #start(): Worker {
    if (this.#worker) return this.#worker;
    const worker = new Worker(new URL("./_hash_thread_worker.ts", import.meta.url), {
      type: "module",
    });
    worker.onmessage = (event: MessageEvent) => {
      const message = event.data;
      if (message.t === "buffer") {
        this.#free.push(message.buffer);
        this.#waiting.shift()?.();
      } else if (message.t === "digest") {
        const pending = this.#digests.get(message.id);
        this.#digests.delete(message.id);
        pending?.resolve(message.hex);
      }
    };
    worker.onerror = (event) => {
      event.preventDefault();
      this.#fail(new Error(`hashing thread failed: ${event.message}`));
    };
    return this.#worker = worker;
  }

  #fail(error: Error): void {
    this.#failure = error;
    for (const pending of this.#digests.values()) pending.reject(error);
    this.#digests.clear();
    for (const wake of this.#waiting.splice(0)) wake();
  }
}

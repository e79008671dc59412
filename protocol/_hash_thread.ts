// SHA-256 on worker threads for large bodies: the reading thread copies each new stretch into
// one of a few reused 4 MiB buffers (a copy costs a fraction of hashing) and goes on reading
// while the worker hashes; or, for bytes it mirrors in a SharedArrayBuffer, only says which
// range to hash, so reading never waits for hashing. Used by protocol/_part_digests.ts.

const _PIECE = 4 * 1024 * 1024;
const _BUFFERS = 6;

/** Incremental SHA-256 digests computed elsewhere (one thread or several). */
export interface HashSink {
  /** A new incremental hash. */
  open(): number;
  /**
   * Appends `bytes` to hash `id`: copied from ordinary memory; read in place from a
   * `SharedArrayBuffer` (which must then stay unchanged until the digest resolves).
   */
  update(id: number, bytes: Uint8Array): Promise<void>;
  /** The hex digest of everything given to `id`. */
  digest(id: number): Promise<string>;
}

/** Several hashing threads: each hash runs on the thread with the fewest open hashes. */
export class HashThreads implements HashSink {
  readonly #threads: HashThread[];
  readonly #owner = new Map<number, HashThread>();
  readonly #open = new Map<HashThread, number>();
  #nextId = 0;

  /** `count` threads, each started on first use. */
  constructor(count: number) {
    this.#threads = Array.from({ length: Math.max(1, count) }, () => new HashThread());
  }

  /** A new incremental hash on the least busy thread (a failed thread is replaced first). */
  open(): number {
    for (let i = 0; i < this.#threads.length; i++) {
      const thread = this.#threads[i];
      if (thread.failed) {
        this.#open.delete(thread); // hashes still owned by it fail on their own
        this.#threads[i] = new HashThread();
      }
    }
    let best = this.#threads[0];
    for (const thread of this.#threads) {
      if ((this.#open.get(thread) ?? 0) < (this.#open.get(best) ?? 0)) best = thread;
    }
    const id = ++this.#nextId;
    this.#owner.set(id, best);
    this.#open.set(best, (this.#open.get(best) ?? 0) + 1);
    return id;
  }

  /** Appends `bytes` to hash `id`. */
  update(id: number, bytes: Uint8Array): Promise<void> {
    return this.#thread(id).update(id, bytes);
  }

  /** The hex digest of `id`. */
  async digest(id: number): Promise<string> {
    const thread = this.#thread(id);
    try {
      return await thread.digest(id);
    } finally {
      this.#owner.delete(id);
      this.#open.set(thread, (this.#open.get(thread) ?? 1) - 1);
    }
  }

  /** Starts every thread now (their start-up then overlaps what comes before the hashing). */
  warm(): void {
    for (const thread of this.#threads) thread.warm();
  }

  /** Stops every thread. */
  close(): void {
    for (const thread of this.#threads) thread.close();
  }

  #thread(id: number): HashThread {
    const thread = this.#owner.get(id);
    if (!thread) throw new Error(`unknown hash ${id}`);
    return thread;
  }
}

/** One hashing thread with a ring of transfer buffers; started on first use. */
export class HashThread implements HashSink {
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

  /**
   * Appends `bytes` to hash `id`. Bytes in ordinary memory are copied (they may change
   * afterwards; when all transfer buffers are in flight this waits for one). Bytes in a
   * `SharedArrayBuffer` are read there by the thread, without a copy and without waiting: they
   * must stay unchanged until {@linkcode digest} of `id` resolves.
   */
  async update(id: number, bytes: Uint8Array): Promise<void> {
    if (bytes.buffer instanceof SharedArrayBuffer) {
      if (this.#failure) throw this.#failure;
      this.#start().postMessage({
        t: "shared",
        id,
        buffer: bytes.buffer,
        offset: bytes.byteOffset,
        length: bytes.length,
      });
      return;
    }
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

  /** Whether the thread failed or was closed (it hashes nothing any more). */
  get failed(): boolean {
    return this.#failure !== null;
  }

  /** Starts the thread now. */
  warm(): void {
    if (!this.#failure) this.#start();
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
      worker.terminate(); // an uncaught error leaves the worker dead: never used again
      this.#worker = null;
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

/**
 * SHA-256 of large bodies on worker threads: reading copies each stretch into a reused 4 MiB buffer
 * (or, for SharedArrayBuffer bytes, just names the range) and goes on while a worker hashes; a
 * thread can also spool shared bytes to a file. Used by part_digests.ts.
 *
 * @module
 */

const _PIECE = 4 * 1024 * 1024;
const _BUFFERS = 6;

/** Incremental SHA-256 digests and spool files computed and written elsewhere. */
export interface HashSink {
  /** A new incremental hash; end it with {@linkcode digest} (or {@linkcode drop}). */
  open(): number;
  /**
   * A new spool: the bytes given to it are written to the new file `path` instead of hashed (only
   * bytes in shared memory; any other update leaves it without file). End it with
   * {@linkcode written} (or {@linkcode drop}).
   */
  spool(path: string): number;
  /**
   * Appends `bytes` to hash or spool `id`: copied from ordinary memory; read in place from a
   * `SharedArrayBuffer` (which must then stay unchanged until the digest or written resolves).
   */
  update(id: number, bytes: Uint8Array): Promise<void>;
  /** The hex digest of everything given to hash `id`. */
  digest(id: number): Promise<string>;
  /** Once spool `id`'s writes are done: the bytes its file got, or `null` when it has none. */
  written(id: number): Promise<number | null>;
  /**
   * Forgets hash or spool `id` without an end; a spool's file is deleted by its thread. `false`
   * when its thread is gone (nothing of `id` runs any more, and its file is left).
   */
  drop(id: number): boolean;
}

/** The file a copy must find at its path: the inode its caller opened and checked. */
export interface FileIdentity {
  /** `Deno.FileInfo.ino`. */
  ino: number | null;
  /** `Deno.FileInfo.dev`. */
  dev: number;
}

/**
 * A copy refused because its source is not the file its caller opened and checked: another
 * inode at the path, another size, or a size that changed during the copy.
 *
 * @example
 * ```ts
 * import { FileSourceError } from "./hash_threads.ts";
 *
 * const error = new FileSourceError("/staging/kept-0 changed size");
 * console.assert(error instanceof Error && error.name === "FileSourceError");
 * ```
 */
export class FileSourceError extends Error {
  override name = "FileSourceError";
}

/** Copies a file into a new one while hashing it, elsewhere than the calling thread. */
export interface FileCopier {
  /**
   * Copies the `size` bytes of the regular file at `from` (which must be `identity`) into the
   * new file `to` (mode 0644) while hashing them; resolves with their hex SHA-256. Rejects when
   * the file is another or has another size ({@linkcode FileSourceError}), or the copy fails (`to`
   * may then be left).
   */
  copyHashing(from: string, to: string, size: number, identity: FileIdentity): Promise<string>;
}

/** Several hashing threads: each hash runs on the thread with the fewest open hashes. */
export class HashThreads implements HashSink, FileCopier {
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
    const thread = this.#leastBusy();
    const id = ++this.#nextId;
    this.#own(id, thread);
    return id;
  }

  /** A new spool on the least busy thread (so not the one hashing the same bytes, if any other). */
  spool(path: string): number {
    const thread = this.#leastBusy();
    const id = ++this.#nextId;
    thread.startSpool(id, path);
    this.#own(id, thread);
    return id;
  }

  /** Appends `bytes` to `id`. */
  update(id: number, bytes: Uint8Array): Promise<void> {
    return this.#thread(id).update(id, bytes);
  }

  /** The hex digest of hash `id`. */
  async digest(id: number): Promise<string> {
    const thread = this.#thread(id);
    try {
      return await thread.digest(id);
    } finally {
      this.#forget(id, thread);
    }
  }

  /** Copies `from` to `to` while hashing it, on the least busy thread ({@linkcode FileCopier}). */
  async copyHashing(
    from: string,
    to: string,
    size: number,
    identity: FileIdentity,
  ): Promise<string> {
    const thread = this.#leastBusy();
    const id = ++this.#nextId;
    this.#own(id, thread);
    try {
      return await thread.copyHashing(from, to, size, identity, id);
    } finally {
      this.#forget(id, thread);
    }
  }

  /** The bytes spool `id` wrote (`null`: no file). */
  async written(id: number): Promise<number | null> {
    const thread = this.#thread(id);
    try {
      return await thread.written(id);
    } finally {
      this.#forget(id, thread);
    }
  }

  /** Forgets `id` (a spool's file is deleted); `false` when its thread is gone. */
  drop(id: number): boolean {
    const thread = this.#owner.get(id);
    if (!thread) return false;
    this.#forget(id, thread);
    return thread.drop(id);
  }

  #leastBusy(): HashThread {
    for (let i = 0; i < this.#threads.length; i++) {
      const thread = this.#threads[i];
      if (thread.failed) {
        this.#open.delete(thread); // ids still owned by it fail on their own
        this.#threads[i] = new HashThread();
      }
    }
    let best = this.#threads[0];
    for (const thread of this.#threads) {
      if ((this.#open.get(thread) ?? 0) < (this.#open.get(best) ?? 0)) best = thread;
    }
    return best;
  }

  #own(id: number, thread: HashThread): void {
    this.#owner.set(id, thread);
    this.#open.set(thread, (this.#open.get(thread) ?? 0) + 1);
  }

  #forget(id: number, thread: HashThread): void {
    this.#owner.delete(id);
    this.#open.set(thread, (this.#open.get(thread) ?? 1) - 1);
  }

  /** Starts every thread now (their start-up then overlaps what comes before the hashing). */
  warm(): void {
    for (const thread of this.#threads) thread.warm();
  }

  /**
   * Stops every thread with nothing open; each starts again on its next use. An idle thread
   * collects no garbage, so the shared buffers it was sent stay allocated until it ends.
   */
  rest(): void {
    for (let i = 0; i < this.#threads.length; i++) {
      const thread = this.#threads[i];
      if ((this.#open.get(thread) ?? 0) > 0) continue;
      thread.close();
      this.#open.delete(thread);
      this.#threads[i] = new HashThread();
    }
  }

  /** Stops every thread. */
  close(): void {
    for (const thread of this.#threads) thread.close();
  }

  #thread(id: number): HashThread {
    const thread = this.#owner.get(id);
    if (!thread) throw new Error(`unknown hash or spool ${id}`);
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
  #replies = new Map<
    number,
    { resolve: (value: string | number | null) => void; reject: (e: Error) => void }
  >();
  #failure: Error | null = null;

  /** A new incremental hash; feed it with {@linkcode update}, end it with {@linkcode digest}. */
  open(): number {
    return ++this.#nextId;
  }

  /** A new spool writing to the new file `path`; end it with {@linkcode written}. */
  spool(path: string): number {
    const id = ++this.#nextId;
    this.startSpool(id, path);
    return id;
  }

  /**
   * Starts spool `id` writing to `path`, numbered by the caller ({@linkcode HashThreads}, whose ids
   * never meet this thread's own).
   */
  startSpool(id: number, path: string): void {
    if (!this.#failure) this.#start().postMessage({ t: "spool", id, path });
  }

  /**
   * Appends `bytes` to `id`. Bytes in ordinary memory are copied (they may change afterwards; when
   * all transfer buffers are in flight this waits for one). Bytes in a `SharedArrayBuffer` are read
   * there by the thread, without a copy and without waiting: they must stay unchanged until the
   * digest or written of `id` resolves.
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

  /** Forgets `id` without an end; a spool's file is deleted there. `false`: the thread is gone. */
  drop(id: number): boolean {
    if (this.#failure) return false;
    this.#start().postMessage({ t: "drop", id });
    return true;
  }

  /** The hex digest of everything given to hash `id`. */
  digest(id: number): Promise<string> {
    return this.#ask("digest", id) as Promise<string>;
  }

  /**
   * Copies `from` to `to` while hashing it ({@linkcode FileCopier}), numbered `id` (by default
   * this thread's next; {@linkcode HashThreads} numbers its own).
   */
  copyHashing(
    from: string,
    to: string,
    size: number,
    identity: FileIdentity,
    id = ++this.#nextId,
  ): Promise<string> {
    const copy = { from, to, size, ino: identity.ino, dev: identity.dev };
    return this.#ask("copy", id, copy) as Promise<string>;
  }

  /** Once spool `id`'s writes are done: the bytes its file got (`null`: none). */
  written(id: number): Promise<number | null> {
    return this.#ask("written", id) as Promise<number | null>;
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

  #ask(
    t: "digest" | "written" | "copy",
    id: number,
    more: Record<string, unknown> = {},
  ): Promise<string | number | null> {
    if (this.#failure) return Promise.reject(this.#failure);
    return new Promise((resolve, reject) => {
      this.#replies.set(id, { resolve, reject });
      this.#start().postMessage({ ...more, t, id });
    });
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
    const worker = new Worker(new URL("./hash_thread_worker.ts", import.meta.url), {
      type: "module",
    });
    worker.onmessage = (event: MessageEvent) => {
      const message = event.data;
      if (message.t === "buffer") {
        this.#free.push(message.buffer);
        this.#waiting.shift()?.();
      } else if (message.t === "reply") {
        const pending = this.#replies.get(message.id);
        this.#replies.delete(message.id);
        if (message.error === undefined) pending?.resolve(message.value);
        else pending?.reject(new (message.source ? FileSourceError : Error)(message.error));
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
    for (const pending of this.#replies.values()) pending.reject(error);
    this.#replies.clear();
    for (const wake of this.#waiting.splice(0)) wake();
  }
}

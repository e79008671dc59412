/**
 * One hashing thread shared by a client's requests: started for the first large response,
 * kept a moment after the last one that used it (for the next), then stopped, because a live
 * `Worker` keeps the process from exiting and an unclosed client must not.
 *
 * @module
 */

import { HashThread } from "../protocol/hash_threads.ts";

/** Multipart responses this large are hashed on a thread while they arrive. */
const _THREAD_HASH_BYTES = 8 * 1024 * 1024;

/**
 * Whether a response with these headers is large enough to hash on the thread: a declared
 * length of 8 MiB or more, or no length at all. A Router streams only answers larger than one
 * node-link frame (256 KiB; smaller ones come whole, with their length), so an answer of unknown
 * length is taken as large.
 *
 * @example
 * ```ts
 * import { hashesOnThread } from "./_shared_hash_thread.ts";
 *
 * if (hashesOnThread(new Headers({ "content-length": "1024" }))) throw new Error("small");
 * if (!hashesOnThread(new Headers())) throw new Error("a chunked answer is large");
 * ```
 */
export function hashesOnThread(headers: Headers): boolean {
  const declared = headers.get("content-length");
  return declared === null || Number(declared) >= _THREAD_HASH_BYTES;
}

/** How long an unused thread is kept for the next large response. */
const _IDLE_MS = 1000;

/** A lazily started, idle-stopped {@linkcode HashThread}. */
export class SharedHashThread {
  #thread: HashThread | null = null;
  #closed = false;
  /** Responses being hashed on {@linkcode #thread}. */
  #users = 0;
  #idle: ReturnType<typeof setTimeout> | undefined;

  /** The thread for one more response (none once closed); pair with {@linkcode release}. */
  take(): HashThread | undefined {
    if (this.#closed) return undefined; // a thread started now would never be stopped
    clearTimeout(this.#idle);
    this.#idle = undefined;
    this.#users++;
    if (this.#thread?.failed) this.#thread = null; // replaced, not reused
    return this.#thread ??= new HashThread();
  }

  /** A response taken with {@linkcode take} is done with the thread. */
  release(): void {
    if (--this.#users > 0 || this.#thread === null) return;
    // Kept a moment for the next large response, then stopped.
    this.#idle = setTimeout(() => {
      this.#idle = undefined;
      this.#thread?.close();
      this.#thread = null;
    }, _IDLE_MS);
  }

  /** Stops the thread now; later `take`s get none. */
  close(): void {
    this.#closed = true;
    clearTimeout(this.#idle);
    this.#thread?.close();
    this.#thread = null;
  }
}

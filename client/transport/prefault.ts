/**
 * Page prefaulting for large answers of the HTTP/1.1 transport, a second-order optimisation
 * kept apart so it can be removed (docs/decisions/client-transport.md: 63 vs 80 ms for a 64 MiB
 * answer on the H200 VM). After a large Content-Length answer the next one is likely as large
 * (the same program again), so while the next request waits for its answer, a buffer of that
 * size has its pages touched in the background; the answer is then read into memory that no
 * longer faults.
 *
 * @module
 */

/** A Content-Length body this large makes the next request prepare a touched buffer. */
const _PREFAULT_MIN = 8 * 1024 * 1024;
/** The prepared buffer exceeds the last body by this much (the JSON part's length varies). */
export const PREFAULT_SLACK = 64 * 1024;
/**
 * Pages are touched this many bytes at a time, yielding to the event loop in between (an
 * answer waits for at most one slice: ~0.15 ms on the H200 VM).
 */
const _PREFAULT_SLICE = 256 * 1024;
/** Responses that are not large before the expectation of a large one is dropped. */
const _PREFAULT_KEEP = 2;

/**
 * When a request prepares a buffer, and for what size: after a large answer, one request at a
 * time (each of many concurrent ones would hold one) prepares one as large.
 */
export class PrefaultPlan {
  #lastLargeBody = 0;
  /** A request is preparing a buffer for an answer as large as the last large one. */
  #preparing = false;
  #smallSinceLarge = 0;
  #hits = 0;

  /** The answer size a starting request prepares for (0: none); pass it to `end` afterwards. */
  begin(): number {
    const prepare = this.#preparing ? 0 : this.#lastLargeBody;
    if (prepare > 0) this.#preparing = true;
    return prepare;
  }

  /** The request that `begin` gave `prepared` has ended (answered or failed). */
  end(prepared: number): void {
    if (prepared > 0) this.#preparing = false;
  }

  /** An answer was read: into a buffer of `bytes` (0: none), `prefaulted` or not. */
  record(bytes: number, prefaulted: boolean): void {
    if (prefaulted) this.#hits++;
    if (bytes >= _PREFAULT_MIN) {
      this.#lastLargeBody = bytes;
      this.#smallSinceLarge = 0;
    } else if (++this.#smallSinceLarge >= _PREFAULT_KEEP) {
      // A small answer in between is expected (a CACHE_MISS before the resend); two end it.
      this.#lastLargeBody = 0;
    }
  }

  /** Answers read into a prepared buffer. */
  get hits(): number {
    return this.#hits;
  }
}

/**
 * A buffer whose pages are touched in the background (slices, yielding to the event loop in
 * between), so the response read into it does not fault them in as the bytes arrive: on the H200
 * VM fresh memory costs ~0.6 ms per MiB to touch, half of what receiving 64 MiB takes.
 */
export class Prefault {
  readonly #buffer: Uint8Array;
  #stopped = false;
  #touched = 0;

  /** Allocates `size` bytes and starts touching them. */
  constructor(size: number) {
    this.#buffer = new Uint8Array(size);
    void this.#touch();
  }

  /**
   * The buffer for a body of `total` bytes if it fits without waste, or for a body of unknown
   * length (`total` undefined: a chunked one, which grows out of it if larger); touching stops.
   */
  take(total?: number): Uint8Array | null {
    this.stop();
    const size = this.#buffer.length;
    if (total === undefined) return this.#buffer;
    return size >= total && size - total <= 2 * PREFAULT_SLACK ? this.#buffer : null;
  }

  /** Stops touching pages. */
  stop(): void {
    this.#stopped = true;
  }

  /** Bytes touched so far. */
  get touched(): number {
    return this.#touched;
  }

  async #touch(): Promise<void> {
    for (let at = 0; at < this.#buffer.length && !this.#stopped; at += _PREFAULT_SLICE) {
      this.#buffer.fill(0, at, at + _PREFAULT_SLICE); // a write faults each page in
      this.#touched = Math.min(this.#buffer.length, at + _PREFAULT_SLICE);
      await _yieldToIo();
    }
  }
}

const _NOTHING = new Uint8Array(0);

/**
 * Lets pending I/O (the socket read of the answer) run before the next slice. It must pass
 * through the event loop's poll phase: a MessagePort message does not (Deno delivers messages
 * ahead of socket reads, so a loop of them held a waiting answer back until all 64 MiB were
 * touched), and timers are clamped to ~2 ms. The smallest async op that needs no permission
 * does it in ~10 µs.
 */
async function _yieldToIo(): Promise<void> {
  await crypto.subtle.digest("SHA-256", _NOTHING);
}

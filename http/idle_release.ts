/**
 * The moment to give memory back: a while after the last use of something large (a body buffer
 * taken or given back), once nothing is in flight. The release then runs once, off every request's
 * path, and not again before the next use (docs/decisions/memory-after-large-requests.md, "Memory
 * comes back after large requests").
 *
 * @module
 */

/** What an {@linkcode IdleRelease} waits for and does. */
export interface IdleReleaseOptions {
  /** How long after the last {@linkcode IdleRelease.touch} the release is due, in ms. */
  afterMs: number;
  /** Whether work is in flight now (a due release waits for it); default: never. */
  busy?: () => boolean;
  /** How often a due release looks again while busy, in ms (default: `afterMs`, at most 1000). */
  retryMs?: number;
  /** Gives the memory back. */
  release: () => void;
}

/**
 * Runs `release` once, `afterMs` after the last {@linkcode touch} and when not `busy`. Its timer
 * never keeps the process alive; {@linkcode close} stops it.
 */
export class IdleRelease {
  readonly #o: Required<IdleReleaseOptions>;
  #lastUse = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;

  /** Waits with `options`; nothing is due before the first {@linkcode touch}. */
  constructor(options: IdleReleaseOptions) {
    this.#o = {
      busy: () => false,
      retryMs: Math.min(options.afterMs, 1000),
      ...options,
    };
  }

  /** Whether a release is due (touched since the last one). */
  get pending(): boolean {
    return this.#timer !== undefined;
  }

  /** Something large was used now: the release comes `afterMs` from here. */
  touch(): void {
    this.#lastUse = performance.now();
    if (this.#timer === undefined) this.#arm(this.#o.afterMs);
  }

  /** Stops waiting (nothing is released). */
  close(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #arm(delay: number): void {
    const timer = setTimeout(() => this.#due(), Math.max(0, delay));
    Deno.unrefTimer(timer);
    this.#timer = timer;
  }

  #due(): void {
    const idleFor = performance.now() - this.#lastUse;
    if (idleFor < this.#o.afterMs) return this.#arm(this.#o.afterMs - idleFor);
    if (this.#o.busy()) return this.#arm(this.#o.retryMs);
    this.#timer = undefined;
    this.#o.release();
  }
}

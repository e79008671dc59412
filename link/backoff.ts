/**
 * Delays of the node supervisor (spec router §5.3): an exponential backoff that starts at its
 * minimum, doubles after each use and stops at its maximum until it is reset; jitter applied
 * *after* that cap (so a delay can exceed the maximum by the jitter fraction); and a sleep that
 * shutdown interrupts. The supervisor's restarts use backoff with jitter, its control
 * connection's reconnects backoff without (spec router §7 item 21).
 *
 * @module
 */

/**
 * Exponential backoff: {@linkcode Backoff.next} gives the current delay, then doubles it up to
 * the maximum; {@linkcode Backoff.reset} returns to the minimum. Units are the caller's.
 */
export class Backoff {
  /** The first delay, and the one after a reset. */
  readonly min: number;
  /** The largest delay. */
  readonly max: number;
  #current: number;

  /** A backoff from `min` to `max`; both positive and finite, `min ≤ max` (else `RangeError`). */
  constructor(min: number, max: number) {
    if (!(min > 0 && Number.isFinite(min) && max >= min && Number.isFinite(max))) {
      throw new RangeError(`invalid backoff bounds ${min}..${max}`);
    }
    this.min = min;
    this.max = max;
    this.#current = min;
  }

  /** The delay to use now; the next call gives twice as much, up to the maximum. */
  next(): number {
    const delay = this.#current;
    this.#current = Math.min(this.#current * 2, this.max);
    return delay;
  }

  /** Back to the minimum (after a stable run, or an acknowledged connection). */
  reset(): void {
    this.#current = this.min;
  }
}

/**
 * `delay × U[1 − jitter, 1 + jitter]`; `jitter` 0 gives `delay` exactly. `random` is a uniform
 * draw in [0, 1) (`Math.random` by default).
 */
export function withJitter(
  delay: number,
  jitter: number,
  random: () => number = Math.random,
): number {
  if (jitter === 0) return delay;
  return delay * (1 - jitter + 2 * jitter * random());
}

/**
 * Waits `ms` milliseconds; resolves `false` at once (clearing the timer) if `signal` aborts
 * first or has already aborted, `true` when the full time passed.
 */
export function sleepUnlessAborted(ms: number, signal?: AbortSignal): Promise<boolean> {
  if (signal?.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const done = (slept: boolean) => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", aborted);
      resolve(slept);
    };
    const aborted = () => done(false);
    const timer = setTimeout(() => done(true), Math.max(0, ms));
    signal?.addEventListener("abort", aborted, { once: true });
  });
}

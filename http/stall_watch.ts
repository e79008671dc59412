/**
 * Noticing reads that make no progress, with one timer for all of them (a timer per request
 * costs the Router's hot path more than it gains; decisions.md, "The Router finishes an attempt
 * without a timer"): each watched read notes its progress, and a read that has made none for
 * `timeoutMs` is told so once, within about `timeoutMs + tickMs`.
 *
 * ```
 *  watch(onStall) ─▶ { progress(), done() }   (a Set entry and a time)
 *  every tickMs (after start()) ─▶ no progress for timeoutMs ─▶ onStall()
 * ```
 *
 * @module
 */

/** One watched read. */
export interface WatchedRead {
  /** Bytes arrived: the read is not stalled. */
  progress(): void;
  /** The read ended (stops watching it). */
  done(): void;
}

interface _Entry {
  last: number;
  onStall: () => void;
}

/**
 * Reads watched for progress, one timer for all.
 *
 * @example
 * ```ts
 * import { StallWatch } from "./stall_watch.ts";
 *
 * let clock = 0;
 * const watch = new StallWatch(1000, 250, () => clock);
 * let stalled = false;
 * const read = watch.watch(() => (stalled = true));
 * clock = 900;
 * read.progress();
 * clock = 1500;
 * watch.check();
 * if (stalled) throw new Error("it made progress at 900");
 * clock = 2000;
 * watch.check();
 * if (!stalled) throw new Error("no progress for 1100 ms");
 * watch.close();
 * ```
 */
export class StallWatch {
  /** How long a read may go without progress. */
  readonly timeoutMs: number;
  readonly #tickMs: number;
  readonly #now: () => number;
  readonly #entries = new Set<_Entry>();
  #timer: ReturnType<typeof setInterval> | null = null;

  /** Reads stalled after `timeoutMs` without progress, looked at every `tickMs`. */
  constructor(
    timeoutMs: number,
    tickMs = Math.min(250, timeoutMs / 4),
    now: () => number = () => performance.now(),
  ) {
    this.timeoutMs = timeoutMs;
    this.#tickMs = Math.max(1, tickMs);
    this.#now = now;
  }

  /** Watches a read; `onStall` runs once if it makes no progress for the timeout. */
  watch(onStall: () => void): WatchedRead {
    const entry: _Entry = { last: this.#now(), onStall };
    this.#entries.add(entry);
    return {
      progress: () => entry.last = this.#now(),
      done: () => this.#entries.delete(entry),
    };
  }

  /**
   * Starts the timer (it does not keep the process alive; a `Set` entry is all a watched read
   * costs). Idempotent.
   */
  start(): void {
    if (this.#timer !== null) return;
    this.#timer = setInterval(() => this.check(), this.#tickMs);
    Deno.unrefTimer(this.#timer);
  }

  /** Tells the reads without progress for the timeout (the timer's work; callable directly). */
  check(): void {
    const due = this.#now() - this.timeoutMs;
    for (const entry of this.#entries) {
      if (entry.last > due) continue;
      this.#entries.delete(entry);
      entry.onStall();
    }
  }

  /** Reads watched now. */
  get watching(): number {
    return this.#entries.size;
  }

  /** Stops the timer and forgets every read. Idempotent. */
  close(): void {
    this.#entries.clear();
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
  }
}

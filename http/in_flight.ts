/**
 * Requests in flight and the drain of a graceful stop: once stopping, new requests are turned away,
 * and every request that finishes reports how many are left (`shutdown_waiting`), until none is
 * (spec server §1.1; seed 003: a stopped node "waits for active requests to finish").
 *
 * @module
 */
import type { EventLog } from "./events.ts";

/** Counts requests in flight and drains them. */
export class InFlight {
  readonly #events: EventLog;
  #count = 0;
  #closing = false;
  #idle: (() => void) | null = null;

  /** Reports the drain's progress to `events`. */
  constructor(events: EventLog) {
    this.#events = events;
  }

  /** Requests in flight. */
  get count(): number {
    return this.#count;
  }

  /** Whether a stop has begun (new requests are to be turned away). */
  get closing(): boolean {
    return this.#closing;
  }

  /** A request begins. */
  enter(): void {
    this.#count++;
  }

  /** A request ends (while stopping, reports how many are left). */
  leave(): void {
    this.#count--;
    if (this.#closing) {
      this.#events.emit("INFO", "shutdown_waiting", { remaining: this.#count });
    }
    if (this.#count === 0) this.#idle?.();
  }

  /** Begins the stop (`shutdown_started`) and resolves once no request is in flight. */
  async drain(): Promise<void> {
    this.#closing = true;
    this.#events.emit("INFO", "shutdown_started", { remaining: this.#count });
    if (this.#count > 0) await new Promise<void>((resolve) => (this.#idle = resolve));
  }
}

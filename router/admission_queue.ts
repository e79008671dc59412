/**
 * The Router's admission queue (spec router §3): a bounded set of places for requests that
 * found no free slot, each waiting until a slot frees up, its deadline passes or its client
 * goes away.
 *
 * ```
 * admit(take)
 *   take() ──slot──▶ done                     (no queue place is used when capacity is free)
 *   no place left ──▶ RouterBusy              (max 0: anything not placed at once is refused)
 *   take a place; deadline = now + wait timeout
 *   loop: park ─▶ take() ──slot──▶ done       (parked before the re-check: no lost wake-up)
 *         wait ─▶ woken ──▶ loop
 *              ─▶ deadline ──▶ NoNode
 *              ─▶ signal aborted ──▶ the signal's reason
 *              ─▶ close() ──▶ RouterStopping
 *   the place is given back however the wait ends
 * ```
 *
 * A released slot wakes one waiter ({@linkcode AdmissionQueue.wakeOne}, the oldest); every
 * other change of state wakes them all ({@linkcode AdmissionQueue.wakeAll}). A waiter woken alone
 * that gives up (its signal was aborted) passes the wake-up on, so a freed slot never sits idle
 * while another request waits.
 *
 * @module
 */

/** The queue is full: the request was not placed and can be retried (HTTP 503 `router_busy`). */
export class RouterBusy extends Error {
  /** The error kind of the Router's error body. */
  readonly kind = "router_busy";
  /** Creates the error. */
  constructor(message = "router queue is full") {
    super(message);
    this.name = "RouterBusy";
  }
}

/**
 * No slot freed up before the wait ended: the request was not sent to a node and can be retried
 * (HTTP 503 `no_node`).
 */
export class NoNode extends Error {
  /** The error kind of the Router's error body. */
  readonly kind = "no_node";
  /** Creates the error. */
  constructor(message = "no compatible node became available before the queue timeout") {
    super(message);
    this.name = "NoNode";
  }
}

/**
 * The Router is stopping: waiters are let go, and nothing more is admitted. A {@linkcode NoNode}
 * (the request never reached a node).
 */
export class RouterStopping extends NoNode {
  /** Creates the error. */
  constructor() {
    super("router stopping");
    this.name = "RouterStopping";
  }
}

/** The bounds of an {@linkcode AdmissionQueue}. */
export interface AdmissionLimits {
  /** Requests that may wait at once (`--max-queued-requests`); 0 refuses every wait. */
  maxWaiting: number;
  /** How long one request may wait, in ms (`--queue-wait-timeout-seconds`); 0 allowed. */
  waitTimeoutMs: number;
}

/** The longest delay `setTimeout` takes (about 24.8 days); longer waits are cut to it. */
const LONGEST_TIMER_MS = 2 ** 31 - 1;

/** Why a parked waiter resumed. */
type Wake = "one" | "all" | "timeout" | "abort" | "closed";

/** One parked wait: settled once, by whichever comes first. */
interface Ticket {
  readonly promise: Promise<Wake>;
  settle(why: Wake): void;
}

/**
 * The bounded wait for capacity. What "capacity" is belongs to the caller: `take` either takes
 * something (and returns it) or returns `null`.
 */
export class AdmissionQueue {
  readonly #maxWaiting: number;
  readonly #waitTimeoutMs: number;
  /** Parked waiters, oldest first (a `Set` keeps insertion order). */
  readonly #parked = new Set<Ticket>();
  #placesInUse = 0;
  #closed = false;

  /** Creates an empty queue. */
  constructor(limits: AdmissionLimits) {
    if (!Number.isInteger(limits.maxWaiting) || limits.maxWaiting < 0) {
      throw new RangeError("maxWaiting must be a non-negative integer");
    }
    if (!(limits.waitTimeoutMs >= 0)) throw new RangeError("waitTimeoutMs must be non-negative");
    this.#maxWaiting = limits.maxWaiting;
    this.#waitTimeoutMs = Math.min(limits.waitTimeoutMs, LONGEST_TIMER_MS);
  }

  /** Queue places in use: requests waiting now (`/health`'s `requests_waiting`). */
  get waiting(): number {
    return this.#placesInUse;
  }

  /**
   * What `take` gives, at once if it can, otherwise after waiting in the queue. Rejects with
   * {@linkcode RouterBusy} when no place is left, {@linkcode NoNode} when the wait times out,
   * {@linkcode RouterStopping} once the queue is closed, or the signal's reason when it is aborted
   * (before or while waiting; a function giving the signal is called only when the request has to
   * wait). `take` is called synchronously and must not block.
   */
  async admit<T>(
    take: () => T | null,
    abortSignal?: AbortSignal | (() => AbortSignal),
  ): Promise<T> {
    if (this.#closed) throw new RouterStopping();
    if (typeof abortSignal !== "function") abortSignal?.throwIfAborted();
    const immediate = take();
    if (immediate !== null) return immediate;
    // Asked for only now: a request that gets a slot at once never reads its signal.
    const signal = typeof abortSignal === "function" ? abortSignal() : abortSignal;
    signal?.throwIfAborted();
    if (this.#placesInUse >= this.#maxWaiting) throw new RouterBusy();
    this.#placesInUse++;
    let expired = false;
    let ticket: Ticket | null = null;
    const timer = setTimeout(() => {
      expired = true;
      ticket?.settle("timeout");
    }, this.#waitTimeoutMs);
    const onAbort = () => ticket?.settle("abort");
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      while (true) {
        // Parked before the re-check, so a change between the two is never missed.
        ticket = this.#park();
        const taken = take();
        if (taken !== null) return taken;
        if (this.#closed) throw new RouterStopping();
        if (signal?.aborted) throw signal.reason;
        if (expired) throw new NoNode();
        const why = await ticket.promise;
        ticket = null;
        if (why === "closed") throw new RouterStopping();
        if (why === "abort") throw signal?.reason;
        if (why === "timeout") throw new NoNode();
        if (signal?.aborted) {
          // Woken for a freed slot but gone: hand the slot's wake-up to the next waiter.
          if (why === "one") this.wakeOne();
          throw signal.reason;
        }
      }
    } finally {
      if (ticket !== null) this.#parked.delete(ticket);
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      this.#placesInUse--;
    }
  }

  /** Wakes the oldest waiter (a slot was given back). */
  wakeOne(): void {
    for (const ticket of this.#parked) {
      ticket.settle("one");
      return;
    }
  }

  /** Wakes every waiter (any other change of state). */
  wakeAll(): void {
    for (const ticket of [...this.#parked]) ticket.settle("all");
  }

  /** Stops: every waiter and every later `admit` rejects with {@linkcode RouterStopping}. */
  close(): void {
    this.#closed = true;
    for (const ticket of [...this.#parked]) ticket.settle("closed");
  }

  #park(): Ticket {
    const { promise, resolve } = Promise.withResolvers<Wake>();
    const ticket: Ticket = {
      promise,
      settle: (why) => {
        if (!this.#parked.delete(ticket)) return;
        resolve(why);
      },
    };
    this.#parked.add(ticket);
    return ticket;
  }
}

/**
 * The per-GPU lease (spec server §3): owned by the front-end so a killed worker cannot leak it.
 * One FIFO over all GPUs. A request for a specific GPU set blocks only its GPUs for later
 * waiters; a request for "any n GPUs" that cannot be satisfied blocks every GPU, so a waiting
 * set never holds a subset and is never starved by single-GPU work behind it.
 *
 * @module
 */

/** Who holds or waits for a lease (a request, or a worker being initialized). */
export interface LeaseHolder {
  /** Request id, or a label such as `init:gpu0/w3`. */
  readonly id: string;
  /** `true` for a worker initialization (never named as an interfered request). */
  readonly initialization?: boolean;
}

interface _Waiter {
  holder: LeaseHolder;
  gpus?: readonly number[];
  count?: number;
  since: number;
  resolve: (gpus: number[]) => void;
  reject: (error: Error) => void;
}

interface _Hold {
  gpus: number[];
  since: number;
}

/** One finished lease interval on a GPU. */
export interface LeaseInterval {
  /** `performance.now()` when the lease was granted. */
  from: number;
  /** `performance.now()` when it was released. */
  to: number;
  /** The holder's id. */
  holderId: string;
  /** The holder was a worker initialization, not a request. */
  initialization: boolean;
}

/** A GPU's lease now and its recent holds ({@linkcode GpuLeases.timeline}). */
export interface LeaseTimeline {
  /** The current holder, or `null` when the GPU is free. */
  holder: { holderId: string; initialization: boolean; since: number } | null;
  /** Finished holds, oldest first (the last 256). */
  holds: LeaseInterval[];
}

const _HISTORY = 256;

/** A waiter was removed before it got the lease. */
export class LeaseCancelled extends Error {
  /** Creates the error. */
  constructor(message = "lease request cancelled") {
    super(message);
    this.name = "LeaseCancelled";
  }
}

/** The lease arbiter of one server. */
export class GpuLeases {
  /** The physical GPU ids under arbitration. */
  readonly gpus: readonly number[];
  #heldBy = new Map<number, LeaseHolder>();
  #holds = new Map<LeaseHolder, _Hold>();
  #queue: _Waiter[] = [];
  #history = new Map<number, LeaseInterval[]>();
  #gates = new Map<number, Promise<void>>();

  /** Creates an arbiter for `gpus` (duplicates are ignored). */
  constructor(gpus: readonly number[]) {
    this.gpus = [...new Set(gpus)];
    for (const gpu of this.gpus) this.#history.set(gpu, []);
  }

  /** The GPUs `holder` holds now (empty if none). */
  heldBy(holder: LeaseHolder): readonly number[] {
    return this.#holds.get(holder)?.gpus ?? [];
  }

  /** Number of waiters in the FIFO. */
  get waiting(): number {
    return this.#queue.length;
  }

  /**
   * GPU `gpu` as an operator sees it: who holds it now (and since when) and its last finished
   * holds, oldest first (`performance.now()` clock). Copies; `null` for a GPU not managed here.
   */
  timeline(gpu: number): LeaseTimeline | null {
    const history = this.#history.get(gpu);
    if (!history) return null;
    const current = this.#heldBy.get(gpu);
    return {
      holder: current
        ? {
          holderId: current.id,
          initialization: current.initialization === true,
          since: this.#holds.get(current)!.since,
        }
        : null,
      holds: history.map((interval) => ({ ...interval })),
    };
  }

  /**
   * Waits for exactly the GPU set `gpus`; resolves with the milliseconds waited. A holder that
   * already holds that set gets it at once (0 ms).
   */
  async acquire(holder: LeaseHolder, gpus: readonly number[]): Promise<number> {
    const held = this.#holds.get(holder);
    if (held) {
      if (_sameSet(held.gpus, gpus)) return 0;
      throw new Error(`${holder.id} already holds GPUs ${held.gpus.join(",")}`);
    }
    for (const gpu of gpus) {
      if (!this.#history.has(gpu)) throw new Error(`GPU ${gpu} is not managed by this server`);
    }
    const start = performance.now();
    await new Promise<number[]>((resolve, reject) => {
      this.#queue.push({ holder, gpus: [...gpus], since: start, resolve, reject });
      this.#dispatch();
    });
    return performance.now() - start;
  }

  /**
   * Takes exactly `gpus` now if that needs no wait: all free and no request waiting in the
   * FIFO. Returns whether `holder` holds them (also when it already did).
   */
  tryAcquire(holder: LeaseHolder, gpus: readonly number[]): boolean {
    const held = this.#holds.get(holder);
    if (held) return _sameSet(held.gpus, gpus);
    if (gpus.some((g) => !this.#history.has(g) || this.#heldBy.has(g))) return false;
    if (this.#queue.some((w) => !w.holder.initialization)) return false;
    this.#grant(holder, [...gpus]);
    return true;
  }

  /** Waits for any `count` free GPUs; resolves with the set granted and the wait. */
  async acquireCount(
    holder: LeaseHolder,
    count: number,
  ): Promise<{ gpus: number[]; waitMs: number }> {
    if (this.#holds.has(holder)) throw new Error(`${holder.id} already holds a lease`);
    if (count < 1 || count > this.gpus.length) {
      throw new Error(`cannot lease ${count} of ${this.gpus.length} GPUs`);
    }
    const start = performance.now();
    const gpus = await new Promise<number[]>((resolve, reject) => {
      this.#queue.push({ holder, count, since: start, resolve, reject });
      this.#dispatch();
    });
    return { gpus, waitMs: performance.now() - start };
  }

  /** Releases what `holder` holds; returns how long it was held (0 if nothing was). */
  release(holder: LeaseHolder): number {
    const hold = this.#holds.get(holder);
    if (!hold) return 0;
    const now = performance.now();
    this.#holds.delete(holder);
    for (const gpu of hold.gpus) {
      this.#heldBy.delete(gpu);
      const history = this.#history.get(gpu)!;
      history.push({
        from: hold.since,
        to: now,
        holderId: holder.id,
        initialization: holder.initialization === true,
      });
      if (history.length > _HISTORY) history.shift();
    }
    this.#dispatch();
    return now - hold.since;
  }

  /** Removes `holder`'s pending requests (their promises reject with {@linkcode LeaseCancelled}). */
  cancel(holder: LeaseHolder, reason?: string): void {
    const mine = this.#queue.filter((w) => w.holder === holder);
    if (mine.length === 0) return;
    this.#queue = this.#queue.filter((w) => w.holder !== holder);
    for (const waiter of mine) waiter.reject(new LeaseCancelled(reason));
    this.#dispatch();
  }

  /** Whether `holder` is waiting in the FIFO. */
  isWaiting(holder: LeaseHolder): boolean {
    return this.#queue.some((w) => w.holder === holder);
  }

  /**
   * Which request held any of `gpus` at time `at` (`performance.now()` clock), other than
   * `except`: the current holder or one from the history; `null` if none. Worker
   * initializations are not requests and are never named.
   */
  holderAt(gpus: readonly number[], at: number, except?: LeaseHolder): string | null {
    for (const gpu of gpus) {
      const current = this.#heldBy.get(gpu);
      if (
        current && current !== except && !current.initialization &&
        this.#holds.get(current)!.since <= at
      ) {
        return current.id;
      }
      const history = this.#history.get(gpu) ?? [];
      for (let i = history.length - 1; i >= 0; i--) {
        const interval = history[i];
        if (interval.initialization || interval.holderId === except?.id) continue;
        if (interval.from <= at && at <= interval.to) return interval.holderId;
      }
    }
    return null;
  }

  /**
   * The per-GPU initialization gate: admits one worker initializer per GPU at a time (FIFO),
   * so replacements interleave with requests in the lease FIFO instead of racing them.
   * Resolves with the function that opens the gate again.
   */
  async initializationGate(gpus: readonly number[]): Promise<() => void> {
    const sorted = [...new Set(gpus)].sort((a, b) => a - b);
    const opens: (() => void)[] = [];
    for (const gpu of sorted) {
      const previous = this.#gates.get(gpu) ?? Promise.resolve();
      let open!: () => void;
      const mine = new Promise<void>((resolve) => (open = resolve));
      this.#gates.set(gpu, previous.then(() => mine));
      await previous;
      opens.push(() => {
        open();
        if (this.#gates.get(gpu) === mine) this.#gates.delete(gpu);
      });
    }
    let opened = false;
    return () => {
      if (opened) return;
      opened = true;
      for (const open of opens) open();
    };
  }

  #dispatch(): void {
    // Requests first, in FIFO order. Worker initializations (replacement contexts) only take
    // GPUs no waiting request wants: a request never waits behind a context creation while
    // ready workers exist, and when none is ready no request waits here, so inits proceed.
    const blocked = new Set<number>();
    let allBlocked = false;
    const remaining = new Set<_Waiter>(this.#queue);
    const granted: [_Waiter, number[]][] = [];
    const grant = (waiter: _Waiter, gpus: number[]) => {
      this.#grant(waiter.holder, gpus);
      granted.push([waiter, gpus]);
      remaining.delete(waiter);
    };
    for (const waiter of this.#queue) {
      if (waiter.holder.initialization) continue;
      if (allBlocked) break;
      if (waiter.gpus) {
        if (waiter.gpus.every((g) => !this.#heldBy.has(g) && !blocked.has(g))) {
          grant(waiter, [...waiter.gpus]);
        } else {
          for (const g of waiter.gpus) blocked.add(g);
        }
      } else {
        const free = this.gpus.filter((g) => !this.#heldBy.has(g) && !blocked.has(g));
        if (free.length >= waiter.count!) grant(waiter, free.slice(0, waiter.count!));
        else allBlocked = true;
      }
    }
    if (!allBlocked) {
      for (const waiter of this.#queue) {
        if (!waiter.holder.initialization || !remaining.has(waiter)) continue;
        const gpus = waiter.gpus ?? [];
        if (gpus.every((g) => !this.#heldBy.has(g) && !blocked.has(g))) grant(waiter, [...gpus]);
        else for (const g of gpus) blocked.add(g);
      }
    }
    this.#queue = this.#queue.filter((w) => remaining.has(w));
    for (const [waiter, gpus] of granted) waiter.resolve(gpus);
  }

  #grant(holder: LeaseHolder, gpus: number[]): void {
    this.#holds.set(holder, { gpus, since: performance.now() });
    for (const gpu of gpus) this.#heldBy.set(gpu, holder);
  }
}

function _sameSet(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((x) => b.includes(x));
}

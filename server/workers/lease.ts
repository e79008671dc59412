/**
 * The per-GPU lease, owned by the front-end so a killed worker cannot leak it. One FIFO over all
 * GPUs: a waiting set blocks its GPUs (an unsatisfiable "any n" blocks all) so it is never starved.
 * Holders are requests (always alone), worker initializations and teardowns; an initialization may
 * share GPUs that only teardowns hold when {@linkcode LeaseHolder.joinsTeardown} says so.
 *
 * @module
 */

/** Who holds or waits for a lease (a request, a worker being initialized or torn down). */
export interface LeaseHolder {
  /** Request id, or a label such as `init:gpu0/w3`. */
  readonly id: string;
  /** `true` for a worker initialization (never named as an interfered request). */
  readonly initialization?: boolean;
  /** `true` for a retiring worker's exit; only {@linkcode GpuLeases.handOver} grants one. */
  readonly teardown?: boolean;
  /** For an initialization: whether it may share GPUs that only teardowns hold now. */
  readonly joinsTeardown?: () => boolean;
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
  /** The holder was a worker's teardown, not a request. */
  teardown: boolean;
}

/** A current holder of a GPU. */
export interface LeaseHolding {
  /** The holder's id. */
  holderId: string;
  /** A worker initialization. */
  initialization: boolean;
  /** A worker teardown. */
  teardown: boolean;
  /** `performance.now()` when it was granted. */
  since: number;
}

/** A GPU's lease now and its recent holds ({@linkcode GpuLeases.timeline}). */
export interface LeaseTimeline {
  /** The current holder (a request if one holds it, else the earliest), or `null` when free. */
  holder: LeaseHolding | null;
  /** Every current holder (more than one only for an initialization beside a teardown). */
  holders: LeaseHolding[];
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
  #heldBy = new Map<number, Set<LeaseHolder>>();
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

  /** GPU `gpu`'s holders now and its last finished holds (copies; `null`: not managed here). */
  timeline(gpu: number): LeaseTimeline | null {
    const history = this.#history.get(gpu);
    if (!history) return null;
    const holders = [...(this.#heldBy.get(gpu) ?? [])].map((h) => ({
      holderId: h.id,
      initialization: h.initialization === true,
      teardown: h.teardown === true,
      since: this.#holds.get(h)!.since,
    })).sort((a, b) => a.since - b.since);
    return {
      holder: holders.find((h) => !h.initialization && !h.teardown) ?? holders[0] ?? null,
      holders,
      holds: history.map((interval) => ({ ...interval })),
    };
  }

  /** Waits for exactly the GPU set `gpus`; resolves with the milliseconds waited. */
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

  /** Takes `gpus` if all are free and no request waits; whether `holder` holds them. */
  tryAcquire(holder: LeaseHolder, gpus: readonly number[]): boolean {
    const held = this.#holds.get(holder);
    if (held) return _sameSet(held.gpus, gpus);
    if (gpus.some((g) => !this.#history.has(g) || this.#heldBy.has(g))) return false;
    if (holder.teardown) throw new Error("a teardown is only handed over");
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
    const held = this.#end(holder, performance.now());
    if (held !== null) this.#dispatch();
    return held ?? 0;
  }

  /**
   * Passes what `holder` holds to `teardown` with no gap another request could take; returns how
   * long `holder` held it (0 if nothing).
   */
  handOver(holder: LeaseHolder, teardown: LeaseHolder): number {
    if (!teardown.teardown) throw new Error(`${teardown.id} is not a teardown holder`);
    if (this.#holds.has(teardown)) throw new Error(`${teardown.id} already holds a lease`);
    const hold = this.#holds.get(holder);
    if (!hold) return 0;
    const now = performance.now();
    this.#end(holder, now);
    this.#grant(teardown, hold.gpus, now);
    this.#dispatch();
    return now - hold.since;
  }

  /** Ends `holder`'s hold at `now` (history kept); its length, or `null` if it held nothing. */
  #end(holder: LeaseHolder, now: number): number | null {
    const hold = this.#holds.get(holder);
    if (!hold) return null;
    this.#holds.delete(holder);
    for (const gpu of hold.gpus) {
      const holders = this.#heldBy.get(gpu)!;
      holders.delete(holder);
      if (holders.size === 0) this.#heldBy.delete(gpu);
      const history = this.#history.get(gpu)!;
      history.push({
        from: hold.since,
        to: now,
        holderId: holder.id,
        initialization: holder.initialization === true,
        teardown: holder.teardown === true,
      });
      if (history.length > _HISTORY) history.shift();
    }
    return now - hold.since;
  }

  /** Removes `holder`'s pending requests (rejected with {@linkcode LeaseCancelled}). */
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

  /** Which request (not an init or teardown) other than `except` held any of `gpus` at `at`. */
  holderAt(gpus: readonly number[], at: number, except?: LeaseHolder): string | null {
    for (const gpu of gpus) {
      for (const current of this.#heldBy.get(gpu) ?? []) {
        if (
          current !== except && !current.initialization && !current.teardown &&
          this.#holds.get(current)!.since <= at
        ) {
          return current.id;
        }
      }
      const history = this.#history.get(gpu) ?? [];
      for (let i = history.length - 1; i >= 0; i--) {
        const interval = history[i];
        if (interval.initialization || interval.teardown || interval.holderId === except?.id) {
          continue;
        }
        if (interval.from <= at && at <= interval.to) return interval.holderId;
      }
    }
    return null;
  }

  /**
   * Admits one worker initializer per GPU at a time (FIFO), so replacements interleave with
   * requests instead of racing them. Resolves with the function that opens the gate again.
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
    // Requests first, in FIFO order; initializations only take GPUs no waiting request wants
    // (or, when allowed, GPUs only teardowns hold).
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
        const free = gpus.every((g) => !this.#heldBy.has(g) && !blocked.has(g));
        const beside = !free && gpus.every((g) => this.#onlyTeardowns(g) && !blocked.has(g)) &&
          waiter.holder.joinsTeardown?.() === true;
        if (free || beside) grant(waiter, [...gpus]);
        else for (const g of gpus) blocked.add(g);
      }
    }
    this.#queue = this.#queue.filter((w) => remaining.has(w));
    for (const [waiter, gpus] of granted) waiter.resolve(gpus);
  }

  #grant(holder: LeaseHolder, gpus: number[], now = performance.now()): void {
    this.#holds.set(holder, { gpus, since: now });
    for (const gpu of gpus) {
      const holders = this.#heldBy.get(gpu);
      if (holders) holders.add(holder);
      else this.#heldBy.set(gpu, new Set([holder]));
    }
  }

  /** Whether `gpu` is free or held by teardowns only. */
  #onlyTeardowns(gpu: number): boolean {
    for (const holder of this.#heldBy.get(gpu) ?? []) if (!holder.teardown) return false;
    return true;
  }
}

function _sameSet(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((x) => b.includes(x));
}

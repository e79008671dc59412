/**
 * The worker pool: one seat per worker (`gpu<N>/w<i>` or `cpu/w<i>`), each backed by a slot
 * (zygote) and its current ready child. Requests take a seat on the least-loaded GPU or wait in
 * one FIFO. A seat given back is idle at once and readied (fresh workspace and results directory)
 * in the background; a retiring child is replaced in the background, its device context created
 * under the initialization gate and the lease after the old child is gone, or deferred when
 * requests already wait for a seat (docs/decisions/deferred-worker-context.md).
 *
 * @module
 */
import type { EventLog } from "../../http/events.ts";
import { emptyDirectory, SeatWorkspaces } from "./workspace.ts";
import type { GpuLeases, LeaseHolder } from "./lease.ts";
import { Slot, type SlotCommand } from "./slot.ts";
import type { ChildInit, ChildReady, SeatChild, SeatSlot } from "./worker_handles.ts";

/** Seat states. `replacing` seats do not count in `request_capacity`. */
export type SeatState = "starting" | "idle" | "busy" | "replacing" | "broken";

/** One worker seat. */
export interface Seat {
  /** Stable name: `gpu<N>/w<i>` or `cpu/w<i>`. */
  readonly label: string;
  /** Index in the pool. */
  readonly index: number;
  /** Physical GPU ids the seat's workers use (empty on CPU). */
  readonly gpus: readonly number[];
  /** The seat's per-request workspaces (the current one is where its next request runs). */
  readonly workspaces: SeatWorkspaces;
  /** Results directory on the host. */
  readonly resultsDir: string;
  /** Current state. */
  state: SeatState;
  /** The slot (zygote), when running. */
  slot: SeatSlot | null;
  /** The ready child, when idle or busy. */
  child: SeatChild | null;
  /** Generation counter (increments per child). */
  generation: number;
  /** Settles once the seat is readied for its next request: `false` when that failed. */
  ready: Promise<boolean>;
}

/** Everything the pool needs from its server. */
export interface PoolOptions {
  /** Seats to create: their labels and GPUs. */
  seats: { label: string; gpus: number[] }[];
  /** Per-seat directories live under `<runtimeDir>/slots/<index>`. */
  runtimeDir: string;
  /** Workers run in a sandbox (workspaces are bound at `/work`, with reserved directories). */
  sandboxed: boolean;
  /** The lease arbiter (`null` on CPU servers). */
  leases: GpuLeases | null;
  /** How to start a seat's zygote. */
  slotCommand: (seat: Seat) => SlotCommand;
  /** Environment for a new child of `seat` (e.g. `CUDA_VISIBLE_DEVICES`). */
  childEnv: (seat: Seat) => { env: Record<string, string>; unset: string[] };
  /** Requests a child serves before it retires (0: forever). */
  maxRequestsPerWorker: number;
  /** Event log. */
  events: EventLog;
  /** How long one zygote may take to import its modules. */
  slotStartTimeoutMs?: number;
  /** Starts a seat's slot (default: {@linkcode Slot.start}; tests pass fakes). */
  startSlot?: (label: string, command: SlotCommand, timeoutMs?: number) => Promise<SeatSlot>;
}

/** No worker became free in time, or the pool is shutting down. */
export class PoolBusy extends Error {
  /** Creates the error. */
  constructor(message = "server saturated") {
    super(message);
    this.name = "PoolBusy";
  }
}

interface _Waiter {
  resolve: (seat: Seat) => void;
  reject: (error: Error) => void;
}

/** The pool of worker seats. */
export class WorkerPool {
  /** All seats, in creation order. */
  readonly seats: Seat[];
  /** Target and versions reported by the first worker. */
  target: Record<string, string> = {};
  /** Versions reported by the first worker. */
  versions: Record<string, string> = {};
  #options: PoolOptions;
  #idle = new Map<string, Seat[]>(); // per GPU key, LIFO
  #assigned = new Map<string, number>(); // per GPU key
  #waiters: _Waiter[] = [];
  #waiterSignals = new Set<() => void>();
  #closing = false;
  #inProgress = 0;
  #background = new Set<Promise<void>>();

  /** Creates the seats (nothing starts until {@linkcode WorkerPool.start}). */
  constructor(options: PoolOptions) {
    this.#options = options;
    this.seats = options.seats.map((spec, index) => ({
      label: spec.label,
      index,
      gpus: spec.gpus,
      workspaces: new SeatWorkspaces(
        `${options.runtimeDir}/slots/${index}/ws`,
        `${options.runtimeDir}/trash`,
        options.sandboxed,
      ),
      resultsDir: `${options.runtimeDir}/slots/${index}/results`,
      state: "starting" as SeatState,
      slot: null,
      child: null,
      generation: 0,
      ready: Promise.resolve(true),
    }));
  }

  /** Starts every seat (zygotes in parallel, then contexts), checks all share one target. */
  async start(): Promise<void> {
    for (const seat of this.seats) {
      await seat.workspaces.create();
      Deno.mkdirSync(seat.resultsDir, { recursive: true, mode: 0o700 });
    }
    const readies: ChildReady[] = [];
    let phaseSeat: Seat | null = null;
    try {
      await Promise.all(this.seats.map(async (seat) => {
        try {
          await this.#startSlot(seat);
        } catch (error) {
          phaseSeat ??= seat;
          throw error;
        }
      }));
      for (const seat of this.seats) {
        phaseSeat = seat;
        readies.push(await this.#newChild(seat, true));
      }
    } catch (error) {
      this.#failed(phaseSeat ?? this.seats[0], "startup", error);
      throw error;
    }
    const first = readies[0];
    this.target = first?.target ?? {};
    this.versions = first?.versions ?? {};
    for (const [i, ready] of readies.entries()) {
      if (JSON.stringify(ready.target) !== JSON.stringify(this.target)) {
        throw new Error(
          `a pool serves one target: ${this.seats[0].label} reports ${
            JSON.stringify(this.target)
          } but ${this.seats[i].label} reports ${JSON.stringify(ready.target)}`,
        );
      }
    }
    for (const seat of this.seats) this.#makeIdle(seat);
  }

  /** Load counters for `/health`. */
  load(): { request_capacity: number; requests_in_progress: number; requests_waiting: number } {
    const replacing = this.seats.filter((s) => s.state !== "idle" && s.state !== "busy").length;
    return {
      request_capacity: this.#closing ? 0 : this.seats.length - replacing,
      requests_in_progress: this.#inProgress,
      requests_waiting: this.#waiters.length,
    };
  }

  /** Number of seats with a request. */
  get busyWorkers(): number {
    return this.seats.filter((s) => s.state === "busy").length;
  }

  /** Whether shutdown has begun. */
  get closing(): boolean {
    return this.#closing;
  }

  /**
   * Takes a seat (an idle one on the least-loaded GPU, else waits in the FIFO up to `timeoutMs`)
   * and waits until it is readied. Throws {@linkcode PoolBusy}, or `signal`'s reason on abort.
   */
  async acquire(timeoutMs: number, signal?: AbortSignal): Promise<Seat> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const seat = await this.#take(Math.max(0, deadline - performance.now()), signal);
      if (await seat.ready) return seat;
      this.release(seat, {
        oldExit: seat.child?.exited ?? Promise.resolve(),
        reason: "sandbox_cleanup",
      });
    }
  }

  #take(timeoutMs: number, signal?: AbortSignal): Promise<Seat> {
    if (this.#closing) return Promise.reject(new PoolBusy());
    const seat = this.#takeIdle();
    if (seat) return Promise.resolve(this.#assign(seat));
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise<Seat>((resolve, reject) => {
      const settled = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", left);
      };
      const waiter: _Waiter = {
        resolve: (s) => {
          settled();
          resolve(s);
        },
        reject: (e) => {
          settled();
          reject(e);
        },
      };
      const leave = (error: unknown) => {
        this.#waiters = this.#waiters.filter((w) => w !== waiter);
        settled();
        reject(error);
      };
      const left = () => leave(signal!.reason);
      const timer = setTimeout(() => leave(new PoolBusy()), timeoutMs);
      signal?.addEventListener("abort", left, { once: true });
      this.#waiters.push(waiter);
      for (const waiting of [...this.#waiterSignals]) waiting();
    });
  }

  /**
   * Gives a seat back after a request; it is readied in the background, or with `retiring`
   * replaced once `oldExit` resolves (`since`: when `worker_exited`'s `teardown_ms` starts).
   */
  release(seat: Seat, retiring: Retiring | null): void {
    this.#inProgress--;
    const key = _key(seat);
    this.#assigned.set(key, (this.#assigned.get(key) ?? 1) - 1);
    if (!retiring && seat.child && !seat.child.exit && seat.slot && !seat.slot.dead) {
      seat.ready = this.#readied(seat);
      this.#makeIdle(seat);
      return;
    }
    this.#retire(seat, retiring);
  }

  /** Marks `seat` as replacing (`worker_retired` now) and replaces it in the background. */
  #retire(seat: Seat, retiring: Retiring | null): void {
    seat.state = "replacing";
    const child = seat.child;
    seat.child = null;
    this.#options.events.emit(_retireLevel(retiring?.reason), "worker_retired", {
      ..._seatFields(seat),
      pid: child?.pid ?? null,
      reason: retiring?.reason ?? "crashed",
    });
    const retiredAt = retiring?.since ?? performance.now();
    const oldExit = (retiring?.oldExit ?? Promise.resolve()).then(() => {
      this.#options.events.emit("INFO", "worker_exited", {
        ..._seatFields(seat),
        pid: child?.pid ?? null,
        teardown_ms: performance.now() - retiredAt,
      });
    });
    this.#runBackground(this.#replace(seat, oldExit, retiring?.reason ?? "crashed"));
  }

  /** {@linkcode release} once `after` settles (resolving with `retiring`); busy until then. */
  releaseAfter(seat: Seat, after: Promise<Retiring | null>): void {
    this.#runBackground(after.then(
      (retiring) => this.release(seat, retiring),
      () => this.release(seat, { oldExit: Promise.resolve(), reason: "crashed" }),
    ));
  }

  /** Rejects waiters and stops taking requests. */
  beginShutdown(): void {
    this.#closing = true;
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const waiter of waiters) waiter.reject(new PoolBusy());
  }

  /** Stops every slot (after in-flight requests have finished). */
  async close(graceMs = 5000): Promise<void> {
    this.beginShutdown();
    await Promise.allSettled([...this.#background]);
    await Promise.allSettled(this.seats.map((seat) => seat.slot?.stop(graceMs)));
    for (const seat of this.seats) {
      seat.slot = null;
      seat.child = null;
      seat.state = "broken";
    }
  }

  /** Resolves when no background replacement is running (tests). */
  async settled(): Promise<void> {
    while (this.#background.size > 0) await Promise.allSettled([...this.#background]);
  }

  #assign(seat: Seat): Seat {
    seat.state = "busy";
    this.#inProgress++;
    const key = _key(seat);
    this.#assigned.set(key, (this.#assigned.get(key) ?? 0) + 1);
    return seat;
  }

  #takeIdle(): Seat | null {
    let bestKey: string | null = null;
    let bestLoad = Infinity;
    for (const [key, stack] of this.#idle) {
      if (stack.length === 0) continue;
      const load = this.#assigned.get(key) ?? 0;
      if (load < bestLoad) {
        bestLoad = load;
        bestKey = key;
      }
    }
    return bestKey === null ? null : this.#idle.get(bestKey)!.pop()!;
  }

  #makeIdle(seat: Seat): void {
    if (this.#closing) {
      seat.state = "idle";
      return;
    }
    const waiter = this.#waiters.shift();
    if (waiter) {
      waiter.resolve(this.#assign(seat));
      return;
    }
    seat.state = "idle";
    const key = _key(seat);
    if (!this.#idle.has(key)) this.#idle.set(key, []);
    this.#idle.get(key)!.push(seat);
  }

  /** A new workspace (bound at `/work` by a running sandboxed slot) and empty results dir. */
  async #refresh(seat: Seat): Promise<void> {
    const name = await seat.workspaces.create();
    await emptyDirectory(seat.resultsDir);
    if (seat.workspaces.sandboxed && seat.slot && !seat.slot.dead) seat.slot.switchWorkspace(name);
  }

  /** {@linkcode Seat.ready} after a kept child's request; a seat that fails has its slot ended. */
  #readied(seat: Seat): Promise<boolean> {
    const ready = this.#refresh(seat).then(() => true, (error) => {
      this.#failed(seat, "sandbox_cleanup", error);
      seat.slot?.destroy();
      return false;
    });
    this.#runBackground(ready.then(() => {}));
    return ready;
  }

  /** Logs `worker_failed` for `seat` in `phase`. */
  #failed(seat: Seat, phase: string, error: unknown): void {
    this.#options.events.emit("ERROR", "worker_failed", {
      ..._seatFields(seat),
      phase,
      error: _errorText(error),
    });
  }

  #runBackground(task: Promise<void>): void {
    const tracked = task.finally(() => this.#background.delete(tracked));
    this.#background.add(tracked);
  }

  async #startSlot(seat: Seat): Promise<void> {
    seat.slot = await (this.#options.startSlot ?? Slot.start)(
      seat.label,
      this.#options.slotCommand(seat),
      this.#options.slotStartTimeoutMs,
    );
  }

  /** Forks (or takes `forked`) and initializes a new child on `seat`. */
  async #newChild(seat: Seat, startup = false, forked?: Promise<SeatChild>): Promise<ChildReady> {
    const { env, unset } = this.#options.childEnv(seat);
    const child = await (forked ?? seat.slot!.fork({
      env,
      unset,
      maxRequests: this.#options.maxRequestsPerWorker,
    }));
    seat.generation++;
    const leases = this.#options.leases;
    let initMs = 0;
    const init = async (options: ChildInit) => {
      const start = performance.now();
      const result = await child.init(options);
      initMs = performance.now() - start;
      return result;
    };
    const ready = leases && !startup
      ? await this.#initReplacement(seat, leases, init)
      : await init({});
    seat.child = child;
    if (this.#closing && !startup) return ready;
    this.#options.events.emit("INFO", "worker_ready", {
      ..._seatFields(seat),
      pid: child.pid,
      device: seat.gpus.length ? seat.gpus.join(",") : "cpu",
      arch: ready.target.arch ?? null,
      init_ms: initMs,
      context: ready.context ?? null,
    });
    return ready;
  }

  /**
   * Initializes a GPU replacement under the initialization gate and the lease, so its context
   * never overlaps a request; a fresh worker (one request each) defers it while requests wait.
   */
  async #initReplacement(
    seat: Seat,
    leases: GpuLeases,
    init: (options: ChildInit) => Promise<ChildReady>,
  ): Promise<ChildReady> {
    const deferrable = this.#options.maxRequestsPerWorker === 1;
    if (deferrable && this.#waiters.length > 0) return await init({ deferContext: true });
    let onWaiter = () => {};
    const waiter = new Promise<"waiter">((resolve) => (onWaiter = () => resolve("waiter")));
    if (deferrable) this.#waiterSignals.add(onWaiter);
    const stopWatching = () => this.#waiterSignals.delete(onWaiter);
    try {
      const gate = leases.initializationGate(seat.gpus);
      const open = await Promise.race([gate, waiter]);
      if (open === "waiter") {
        gate.then((opened) => opened()); // its turn at the gate passes at once
        stopWatching();
        return await init({ deferContext: true });
      }
      const key = _key(seat);
      const holder: LeaseHolder = {
        id: `init:${seat.label}`,
        initialization: true,
        // Beside a teardown only while no ready worker waits on these GPUs.
        joinsTeardown: () => (this.#idle.get(key)?.length ?? 0) === 0,
      };
      try {
        const acquired = leases.acquire(holder, seat.gpus);
        await Promise.race([acquired, waiter]);
        stopWatching();
        if (leases.heldBy(holder).length > 0) { // granted, even if a request came as well
          try {
            return await init({});
          } finally {
            leases.release(holder);
          }
        }
        acquired.catch(() => {}); // cancelled: the replacement is not waiting any more
        leases.cancel(holder);
      } finally {
        open();
      }
      return await init({ deferContext: true });
    } finally {
      stopWatching();
    }
  }

  async #replace(seat: Seat, oldExit: Promise<unknown>, reason: string): Promise<void> {
    for (let attempt = 0;; attempt++) {
      if (this.#closing) return;
      try {
        if (!seat.slot || seat.slot.dead) {
          seat.slot?.destroy();
          await oldExit;
          await this.#refresh(seat); // for the new slot to bind as it starts
          await this.#startSlot(seat);
        } else {
          // While the old child tears down.
          await this.#refresh(seat);
        }
        // Pre-fork now; the context is created after the old child is gone.
        const forked = seat.slot!.fork({
          ...this.#options.childEnv(seat),
          maxRequests: this.#options.maxRequestsPerWorker,
        });
        forked.catch(() => {});
        await oldExit;
        if (this.#closing) return;
        await this.#newChild(seat, false, forked);
        seat.ready = Promise.resolve(true); // refreshed above
        this.#makeIdle(seat);
        return;
      } catch (error) {
        this.#failed(seat, "respawn", error);
        this.#options.events.emit("ERROR", "worker_replace_failed", {
          worker_id: seat.label,
          gpu_id: seat.gpus[0] ?? null,
          reason,
          error: _errorText(error),
        });
        if (seat.slot && !seat.slot.dead) {
          seat.slot.destroy();
          await seat.slot.closed.catch(() => {});
        }
        seat.slot = null;
        if (this.#closing) return;
        await new Promise((r) => setTimeout(r, Math.min(30_000, 250 * 2 ** attempt)));
      }
    }
  }
}

/** A child leaving its seat: resolves once it is gone (and its lease released), and why. */
export interface Retiring {
  /** Resolves once the old child is gone. */
  oldExit: Promise<unknown>;
  /** `worker_retired`'s reason (`request_limit`, `timeout`, `crashed`, ...). */
  reason: string;
  /** When the retirement began (`performance.now()`; default: when the seat was given back). */
  since?: number;
}

/** `"Type: message"`, as upstream's events name an error. */
function _errorText(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

/** The fields that name a seat's worker in its events: `worker_id`, `gpu_id`, `generation`. */
function _seatFields(seat: Seat): { worker_id: string; gpu_id: number | null; generation: number } {
  return { worker_id: seat.label, gpu_id: seat.gpus[0] ?? null, generation: seat.generation };
}

function _key(seat: Seat): string {
  return seat.gpus.join(",") || "cpu";
}

function _retireLevel(reason: string | undefined): "INFO" | "WARNING" | "ERROR" {
  if (reason === "request_limit") return "INFO";
  if (reason === "crashed" || reason === undefined) return "ERROR";
  return "WARNING";
}

/**
 * GPU sets (`options.gpu_count`): a request for n GPUs takes any n free ones as one lease and runs
 * in a dedicated child that sees all of them, initialized while the whole set is held. The set
 * stays held until the program's first GPU step, so single-GPU work cannot starve it.
 *
 * @module
 */
import type { GpuLeases, LeaseHolder } from "./lease.ts";
import type { WorkerLaunch } from "./launch.ts";
import type { Seat } from "./pool.ts";
import { Slot } from "./slot.ts";
import type { SeatChild } from "./worker_handles.ts";

/** A request's GPU set, held, with its child ready. */
export interface GpuSet {
  /** The GPUs of the set. */
  readonly gpus: number[];
  /** The child that sees them all. */
  readonly child: SeatChild;
  /** How long the request waited for the set. */
  readonly waitedMs: number;
  /** When the set was granted (`performance.now()`): its lease is held since then. */
  readonly heldSince: number;
  /** Kills the child under the set's lease and stops its sandbox (once the run is over). */
  dispose(): Promise<void>;
}

/**
 * Takes `count` GPUs for `holder` and starts the set's child on `seat` (in a sandbox of its own
 * when workers are isolated). The lease is held on return, released on failure.
 */
export async function takeGpuSet(options: {
  leases: GpuLeases;
  launch: WorkerLaunch;
  seat: Seat;
  holder: LeaseHolder;
  count: number;
  graceSeconds: number;
}): Promise<GpuSet> {
  const { leases, launch, seat, holder } = options;
  const granted = await leases.acquireCount(holder, options.count);
  const heldSince = performance.now();
  const gpus = granted.gpus;
  let slot: Slot | null = null;
  let child: SeatChild;
  try {
    let parent = seat.slot!;
    if (launch.sandboxed) {
      slot = await Slot.start(`${seat.label}+set`, launch.slotCommand(seat, gpus));
      parent = slot;
    }
    const { env, unset } = launch.childEnv(gpus);
    child = await parent.fork({ env, unset, maxRequests: 1 });
    await child.init();
  } catch (error) {
    await slot?.stop(1000);
    leases.release(holder);
    throw error;
  }
  return {
    gpus,
    child,
    waitedMs: granted.waitMs,
    heldSince,
    async dispose() {
      if (!child.exit) {
        await leases.acquire(holder, gpus);
        try {
          await child.kill(options.graceSeconds);
        } finally {
          leases.release(holder);
        }
      }
      await slot?.stop(1000);
    },
  };
}

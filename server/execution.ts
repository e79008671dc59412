/**
 * Runs one program on one worker child (docs/architecture.md §2.2): sends `run`, serves the
 * child's lease requests, enforces the execution deadline (which pauses while the child waits
 * for the lease), and turns the end of the run into an outcome, a crash, or a timeout kill.
 *
 * @module
 */
import type { Frame } from "./ipc.ts";
import type { GpuLeases, LeaseHolder } from "./lease.ts";
import type { ChildExit, WorkerChild } from "./slot.ts";

/** A file the child wrote into its results directory. */
export interface OutcomeFile {
  path: string;
  size: number;
}

/** A binary result part (`return:<k>` is `parts[k]`). */
export interface OutcomePart extends OutcomeFile {
  sha256: string;
}

/** What the child reports for a finished program (docs/architecture.md §2.4). */
export interface WorkerOutcome {
  status: "COMPLETED" | "FAILED";
  /** The results JSON, or `null` when it is in {@linkcode results_file} (large results). */
  results: string | null;
  /** The results JSON as a file beside the parts (large results: no second escaping). */
  results_file?: OutcomeFile;
  error: Record<string, unknown> | null;
  parts: OutcomePart[];
  stdout: OutcomeFile | null;
  stderr: OutcomeFile | null;
  boundary?: string;
  gpu_access?: { cuda_call: string; location: string; detected_at_ns: number } | null;
  /** The answer's JSON was this many bytes, over the response limit: it was not sent. */
  too_large?: number;
}

/** How a run ended. */
export type RunEnd =
  | { kind: "outcome"; outcome: WorkerOutcome; retire: string | null; cleanup?: boolean }
  | { kind: "crashed"; exit: ChildExit; instructionIndex: number | null }
  | { kind: "timeout"; exit: ChildExit | null; cleanupConfirmed: boolean }
  | { kind: "invalid"; message: string };

/** The result of {@linkcode runProgram}, with the request's timings. */
export interface RunResult {
  end: RunEnd;
  elapsedMs: number;
  leaseWaitMs: number;
  leaseHeldMs: number;
  /** Resolves once the child's lease is released after a retiring child exited. */
  teardown: Promise<void>;
  /**
   * A kept child answered before its reuse hygiene (`cleanup` in the outcome frame): resolves
   * once that is done and the lease released, with `null` (the child stays) or the reason it
   * retires (it is gone by then). `null` when nothing is pending.
   */
  cleanup: Promise<string | null> | null;
}

/** Parameters of one run. */
export interface RunParams {
  child: WorkerChild;
  /** Lease arbiter (`null`: CPU server, no leases). */
  leases: GpuLeases | null;
  /** The GPUs this child's lease covers. */
  gpus: readonly number[];
  /** The request's identity in the lease. */
  holder: LeaseHolder;
  /** The `req` object of the `run` frame. */
  request: Record<string, unknown>;
  /** Execution budget (excludes lease waits). */
  timeoutMs: number;
  /** SIGTERM → SIGKILL grace for kills. */
  graceSeconds: number;
  /** The holder already holds the lease for `gpus` (a GPU set kept from initialization). */
  leaseHeld?: boolean;
  /**
   * The program's first instruction takes the lease: when it is free, take it before sending
   * `run` and grant it with the program (`lease_held` in the request), saving a round trip.
   */
  leaseFirst?: boolean;
  /** Called on every `instr` progress frame. */
  onInstruction?: (index: number) => void;
}

/** Runs the program and returns how it ended; never throws for worker failures. */
export async function runProgram(params: RunParams): Promise<RunResult> {
  const { child, leases, gpus, holder } = params;
  const started = performance.now();
  let leaseWaitMs = 0;
  let leaseHeldMs = 0;
  let heldSince: number | null = params.leaseHeld && leases ? performance.now() : null;
  let lastInstruction: number | null = null;
  let request = params.request;
  if (leases && heldSince === null && params.leaseFirst && leases.tryAcquire(holder, gpus)) {
    // What the child's first `acquire` would get at once, one round trip earlier. When the
    // lease is busy the child asks as usual (its setup overlaps the wait).
    heldSince = performance.now();
    request = { ...request, lease_held: true };
  }

  // Deadline that pauses while the child waits for the lease.
  let remaining = params.timeoutMs;
  let runningSince = performance.now();
  let timer: ReturnType<typeof setTimeout> | undefined;
  let fireTimeout!: () => void;
  const timedOut = new Promise<"timeout">((resolve) => (fireTimeout = () => resolve("timeout")));
  const arm = () => {
    runningSince = performance.now();
    timer = setTimeout(fireTimeout, Math.max(0, remaining));
  };
  const pause = () => {
    clearTimeout(timer);
    remaining -= performance.now() - runningSince;
  };
  arm();

  const grant = () => {
    heldSince = performance.now();
    child.send({ t: "lease", a: "granted" });
  };
  const releaseLease = () => {
    if (leases && heldSince !== null) {
      leases.release(holder);
      leaseHeldMs += performance.now() - heldSince;
      heldSince = null;
    }
  };

  let done!: (end: RunEnd) => void;
  const finished = new Promise<RunEnd>((resolve) => (done = resolve));
  const onFrame = (frame: Frame) => {
    switch (frame.t) {
      case "instr":
        lastInstruction = typeof frame.i === "number" ? frame.i : lastInstruction;
        params.onInstruction?.(lastInstruction ?? -1);
        return;
      case "lease":
        if (frame.a === "acquire") {
          if (!leases || heldSince !== null) {
            if (!leases) heldSince = heldSince ?? performance.now();
            child.send({ t: "lease", a: "granted" });
            return;
          }
          pause();
          const waitStart = performance.now();
          leases.acquire(holder, gpus).then(() => {
            leaseWaitMs += performance.now() - waitStart;
            arm();
            grant();
          }, () => {
            // cancelled: the run is ending anyway
          });
        } else if (frame.a === "release") {
          if (leases) releaseLease();
          else heldSince = null;
        }
        return;
      case "outcome":
        done({
          kind: "outcome",
          outcome: frame.outcome as WorkerOutcome,
          retire: typeof frame.retire === "string" ? frame.retire : null,
          cleanup: frame.cleanup === true && typeof frame.retire !== "string",
        });
        return;
      default:
        done({ kind: "invalid", message: `unexpected worker frame '${frame.t}'` });
    }
  };
  child.setHandler(onFrame);
  child.send({ t: "run", req: request });

  const exitWatch = child.watchExit();
  const first = await Promise.race([finished, timedOut, exitWatch.exited]);
  exitWatch.stop();
  clearTimeout(timer);
  child.setHandler(null);
  const elapsed = () => performance.now() - started;
  const heldNow = () => leaseHeldMs + (heldSince === null ? 0 : performance.now() - heldSince);
  const result = (end: RunEnd, held: number, teardown = Promise.resolve()): RunResult => ({
    end,
    elapsedMs: elapsed(),
    leaseWaitMs,
    leaseHeldMs: held,
    teardown,
    cleanup: null,
  });

  if (first === "timeout") {
    // Kill under the lease so a still-running kernel cannot overlap the next holder.
    if (leases && heldSince === null && !leases.isWaiting(holder)) {
      const waitStart = performance.now();
      await leases.acquire(holder, gpus);
      leaseWaitMs += performance.now() - waitStart;
      heldSince = performance.now();
    } else if (leases && leases.isWaiting(holder)) {
      leases.cancel(holder);
      await leases.acquire(holder, gpus);
      heldSince = performance.now();
    }
    const exit = await _killWithin(child, params.graceSeconds);
    const timedOutResult = result(
      { kind: "timeout", exit, cleanupConfirmed: exit !== null },
      heldNow(),
    );
    if (exit !== null) releaseLease();
    return timedOutResult;
  }

  if ("kind" in first) {
    if (first.kind === "outcome" && first.retire === null) {
      const held = heldNow();
      if (!first.cleanup) {
        // A reused child released its lease itself after cleanup; make sure nothing is held.
        releaseLease();
        return result(first, held);
      }
      // The outcome is final, the child's reuse hygiene is not done yet: it keeps the lease
      // (and the rest of the execution budget, at least 1 s) until its `clean` frame.
      const budgetMs = Math.max(1000, remaining - (performance.now() - runningSince));
      const cleanup = _awaitClean(child, budgetMs, params.graceSeconds).then((retire) => {
        releaseLease();
        return retire;
      });
      return { ...result(first, held), cleanup };
    }
    if (first.kind === "invalid") {
      const exit = await _killWithin(child, params.graceSeconds);
      const held = heldNow();
      if (exit !== null) releaseLease();
      return result(first, held);
    }
    // Retiring: the lease stays held through the child's teardown, released once it is gone.
    const held = heldNow();
    leases?.cancel(holder);
    return result(first, held, child.exited.then(() => releaseLease()));
  }

  // The child (and its whole tree) is gone mid-program.
  leases?.cancel(holder);
  const held = heldNow();
  releaseLease();
  return result({ kind: "crashed", exit: first, instructionIndex: lastInstruction }, held);
}

/**
 * Waits for the `clean` frame of a child doing its reuse hygiene after the answer. Resolves with
 * `null` (kept) or the reason it retires, once a retiring child is gone (killed if it overran
 * `budgetMs` or sent anything else).
 */
async function _awaitClean(
  child: WorkerChild,
  budgetMs: number,
  graceSeconds: number,
): Promise<string | null> {
  let settle!: (retire: string | null) => void;
  const clean = new Promise<string | null>((resolve) => (settle = resolve));
  child.setHandler((frame) => {
    if (frame.t !== "clean") settle("invalid_response");
    else settle(typeof frame.retire === "string" ? frame.retire : null);
  });
  const timer = setTimeout(() => settle("timeout"), budgetMs);
  const exitWatch = child.watchExit();
  const retire = await Promise.race([clean, exitWatch.exited.then(() => "crashed")]);
  exitWatch.stop();
  clearTimeout(timer);
  child.setHandler(null);
  if (retire === "timeout" || retire === "invalid_response") {
    await _killWithin(child, graceSeconds);
  } else if (retire !== null) {
    await child.exited; // teardown stays under the lease
  }
  return retire;
}

/** Kills the child's tree and waits for confirmation; `null` if the zygote never confirmed. */
async function _killWithin(child: WorkerChild, graceSeconds: number): Promise<ChildExit | null> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const exit = await Promise.race([
    child.kill(graceSeconds),
    new Promise<null>((
      resolve,
    ) => (timer = setTimeout(() => resolve(null), (graceSeconds + 5) * 1000))),
  ]);
  clearTimeout(timer);
  if (exit === null) {
    // The zygote did not confirm: kill the whole slot, which takes every process with it.
    child.slot.destroy();
    await child.slot.closed;
    return await child.exited;
  }
  return exit;
}

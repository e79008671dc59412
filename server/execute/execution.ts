/**
 * Runs one program on one worker child (docs/architecture.md §3.2): sends `run`, serves the
 * child's lease requests, enforces the execution deadline (which pauses while the child waits
 * for the lease), and turns the end of the run into an outcome, a crash, or a timeout kill.
 *
 * ```
 *   start ──run──▶ child            deadline running
 *     ◀── lease acquire ──  pause the deadline; wait in the lease FIFO; grant; deadline runs again
 *     ◀── lease release ──  release (the time held is counted)
 *     ◀── instr k ──        remember k (a crash is attributed to instruction k; a child marks
 *                           k in a page its zygote reads, and `exited` carries it instead)
 *     ◀── outcome ──        kept child: done (or its hygiene after the answer, until `clean`:
 *                           lease frames served as before, whatever is held released at `clean`)
 *                           retiring child: done; the lease is released once it has exited
 *   deadline passes ──▶     take the lease, kill the child's tree, release      (timeout)
 *   child exits ──▶         release                                             (crashed)
 * ```
 *
 * A run that ends without the worker's GPU-state receipt although the request held the lease (a
 * crash, a timeout or invalid-answer kill, a GPU set never asked for) gets the server's own NVML
 * reading (`readGpus`), taken before the lease is released where it is still held.
 *
 * The child is anything that exchanges frames ({@linkcode ChildChannel}); tests drive the
 * state machine with a fake one.
 *
 * @module
 */
import type { GpuLeases, LeaseHolder } from "../workers/lease.ts";
import type { GpuStateReading } from "../workers/gpu_reading.ts";
import type { Frame } from "../workers/ipc.ts";
import type { ChildChannel, ChildExit } from "../workers/worker_handles.ts";
import {
  FrameShapeError,
  parseChildReport,
  type RunRequest,
  type WorkerOutcome,
} from "../workers/worker_protocol.ts";

/** How a run ended. */
export type RunEnd =
  | { kind: "outcome"; outcome: WorkerOutcome; retire: string | null; cleanup?: boolean }
  | { kind: "crashed"; exit: ChildExit; instructionIndex: number | null }
  | { kind: "timeout"; exit: ChildExit | null; cleanupConfirmed: boolean }
  | { kind: "invalid"; message: string };

/** The result of {@linkcode runProgram}, with the request's timings. */
export interface RunResult {
  /** How the run ended. */
  end: RunEnd;
  /** From `run` sent to the end. */
  elapsedMs: number;
  /** Every wait for the lease, a GPU set's before the run included. */
  leaseWaitMs: number;
  /** Every hold of the lease, a GPU set's from before the run included. */
  leaseHeldMs: number;
  /** Resolves once the child's lease is released after a retiring child exited. */
  teardown: Promise<void>;
  /**
   * A kept child answered before its reuse hygiene (`cleanup` in the outcome frame): resolves
   * once that is done and the lease released, with `null` (the child stays) or the reason it
   * retires (it is gone by then). `null` when nothing is pending.
   */
  cleanup: Promise<string | null> | null;
  /**
   * The server's reading of the GPUs when the request held the lease and the worker sent no
   * receipt (`null` otherwise, or without `readGpus`).
   */
  serverReading: GpuStateReading | null;
}

/** Parameters of one run. */
export interface RunParams {
  /** The child to run on. */
  child: ChildChannel;
  /** Lease arbiter (`null`: CPU server, no leases). */
  leases: GpuLeases | null;
  /** The GPUs this child's lease covers. */
  gpus: readonly number[];
  /** The request's identity in the lease. */
  holder: LeaseHolder;
  /** The `req` object of the `run` frame. */
  request: RunRequest;
  /** Execution budget (excludes lease waits). */
  timeoutMs: number;
  /** SIGTERM → SIGKILL grace for kills. */
  graceSeconds: number;
  /**
   * The holder already holds the lease for `gpus` since this `performance.now()` (a GPU set
   * kept from its worker's initialization): counted in `leaseHeldMs`.
   */
  heldSince?: number;
  /** Time already spent waiting for the lease before the run (a GPU set's). */
  waitedMs?: number;
  /**
   * The program's first instruction takes the lease: when it is free, take it before sending
   * `run` and grant it with the program (`lease_held` in the request), saving a round trip.
   */
  leaseFirst?: boolean;
  /**
   * Reads the GPUs' state in the server (server/workers/gpu_reading.ts): called when the request
   * held the lease and the run ends without the worker's receipt.
   */
  readGpus?: () => Promise<GpuStateReading>;
}

/**
 * Runs the program and returns how it ended; never throws for worker failures.
 *
 * @example A fake child that answers at once
 * ```ts
 * import { runProgram } from "./execution.ts";
 *
 * let handler: ((frame: { t: string; [k: string]: unknown }) => void) | null = null;
 * const outcome = { status: "COMPLETED", results: "{}", error: null, parts: [], stdout: null, stderr: null };
 * const never = new Promise<never>(() => {});
 * const child = {
 *   send: () => handler?.({ t: "outcome", c: 1, outcome, retire: null }),
 *   setHandler: (h: typeof handler) => (handler = h),
 *   watchExit: () => ({ exited: never, stop: () => {} }),
 *   kill: () => never,
 *   exited: never,
 *   destroySlot: () => Promise.resolve(),
 * };
 * const run = await runProgram({
 *   child, leases: null, gpus: [], holder: { id: "r1" }, timeoutMs: 1000, graceSeconds: 1,
 *   request: { request_id: "r1", program: new TextEncoder().encode("{}"), blobs: {},
 *     workspace: "/w", results: "/r",
 *     output_limit_bytes: 0, max_return_bytes: 1024, sandbox: false },
 * });
 * if (run.end.kind !== "outcome") throw new Error(run.end.kind);
 * ```
 */
export function runProgram(params: RunParams): Promise<RunResult> {
  return new _ProgramRun(params).run();
}

/** One run's state: the deadline, the lease held, the last instruction seen. */
class _ProgramRun {
  readonly #p: RunParams;
  readonly #started = performance.now();
  #leaseWaitMs: number;
  #leaseHeldMs = 0;
  #heldSince: number | null;
  #lastInstruction: number | null = null;
  // The deadline, paused while the child waits for the lease.
  #remainingMs: number;
  #runningSince = performance.now();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #timedOut!: () => void;
  #done!: (end: RunEnd) => void;
  #serverReading: GpuStateReading | null = null;

  constructor(params: RunParams) {
    this.#p = params;
    this.#leaseWaitMs = params.waitedMs ?? 0;
    this.#heldSince = params.heldSince !== undefined && params.leases ? params.heldSince : null;
    this.#remainingMs = params.timeoutMs;
  }

  async run(): Promise<RunResult> {
    const { child, leases, gpus, holder } = this.#p;
    let request = this.#p.request;
    if (
      leases && this.#heldSince === null && this.#p.leaseFirst && leases.tryAcquire(holder, gpus)
    ) {
      // What the child's first `acquire` would get at once, one round trip earlier. When the
      // lease is busy the child asks as usual (its setup overlaps the wait).
      this.#heldSince = performance.now();
      request = { ...request, lease_held: true };
    }
    const timedOut = new Promise<"timeout">((
      resolve,
    ) => (this.#timedOut = () => resolve("timeout")));
    const finished = new Promise<RunEnd>((resolve) => (this.#done = resolve));
    this.#armDeadline();
    child.setHandler((frame) => this.#onFrame(frame));
    const { program, ...req } = request;
    child.send({ t: "run", req }, program);

    const exitWatch = child.watchExit();
    const first = await Promise.race([finished, timedOut, exitWatch.exited]);
    exitWatch.stop();
    clearTimeout(this.#timer);
    child.setHandler(null);
    if (first === "timeout") return await this.#endTimeout();
    if ("kind" in first) return await this.#endAnswered(first);
    return await this.#endCrashed(first);
  }

  // ---------------------------------------------------------------- frames

  #onFrame(frame: Frame): void {
    let report;
    try {
      report = parseChildReport(frame);
    } catch (error) {
      if (!(error instanceof FrameShapeError)) throw error;
      this.#done({ kind: "invalid", message: error.message });
      return;
    }
    switch (report.t) {
      case "instr":
        this.#lastInstruction = report.i;
        return;
      case "lease":
        if (report.a === "acquire") this.#onAcquire();
        else this.#releaseLease();
        return;
      case "outcome":
        this.#done({
          kind: "outcome",
          outcome: report.outcome,
          retire: report.retire,
          cleanup: report.cleanup === true && report.retire === null,
        });
        return;
      default:
        this.#done({ kind: "invalid", message: `unexpected worker frame '${report.t}'` });
    }
  }

  /** Grants the child's `acquire`; the deadline pauses while it waits (`deadline`: the run's). */
  #onAcquire(deadline = true): void {
    const { child, leases, gpus, holder } = this.#p;
    if (!leases || this.#heldSince !== null) {
      // No leases on a CPU server (its lease times stay 0), or held already.
      child.send({ t: "lease", a: "granted" });
      return;
    }
    if (deadline) this.#pauseDeadline();
    const waitStart = performance.now();
    leases.acquire(holder, gpus).then(() => {
      this.#leaseWaitMs += performance.now() - waitStart;
      if (deadline) this.#armDeadline();
      this.#heldSince = performance.now();
      child.send({ t: "lease", a: "granted" });
    }, () => {
      // cancelled: the run is ending anyway
    });
  }

  /** Takes the lease for a kill (a pending wait of the child's is cancelled first). */
  async #takeLease(): Promise<void> {
    const { leases, gpus, holder } = this.#p;
    if (!leases || this.#heldSince !== null) return;
    if (leases.isWaiting(holder)) leases.cancel(holder);
    const waitStart = performance.now();
    await leases.acquire(holder, gpus);
    this.#leaseWaitMs += performance.now() - waitStart;
    this.#heldSince = performance.now();
  }

  #releaseLease(): void {
    if (this.#heldSince === null) return;
    this.#p.leases?.release(this.#p.holder);
    this.#leaseHeldMs += performance.now() - this.#heldSince;
    this.#heldSince = null;
  }

  // ---------------------------------------------------------------- deadline

  #armDeadline(): void {
    this.#runningSince = performance.now();
    this.#timer = setTimeout(this.#timedOut, Math.max(0, this.#remainingMs));
  }

  #pauseDeadline(): void {
    clearTimeout(this.#timer);
    this.#remainingMs -= performance.now() - this.#runningSince;
  }

  // ---------------------------------------------------------------- ends

  #heldNow(): number {
    return this.#leaseHeldMs + (this.#heldSince === null ? 0 : performance.now() - this.#heldSince);
  }

  #result(
    end: RunEnd,
    held: number,
    teardown: Promise<void> = Promise.resolve(),
    cleanup: Promise<string | null> | null = null,
  ): RunResult {
    return {
      end,
      elapsedMs: performance.now() - this.#started,
      leaseWaitMs: this.#leaseWaitMs,
      leaseHeldMs: held,
      teardown,
      cleanup,
      serverReading: this.#serverReading,
    };
  }

  /**
   * The worker gave no receipt though the request held the lease: the server reads the GPUs
   * itself, now (still under the lease where it is held: callers release after this).
   */
  async #readUnreported(end: RunEnd): Promise<void> {
    const { readGpus, leases, gpus } = this.#p;
    if (!readGpus || !leases || gpus.length === 0 || this.#heldNow() <= 0) return;
    if (end.kind === "outcome" && end.outcome.gpu_receipt != null) return;
    this.#serverReading = await readGpus();
  }

  /** The deadline passed: kill under the lease so a running kernel cannot overlap the next. */
  async #endTimeout(): Promise<RunResult> {
    await this.#takeLease();
    const exit = await _killWithin(this.#p.child, this.#p.graceSeconds);
    const end: RunEnd = { kind: "timeout", exit, cleanupConfirmed: exit !== null };
    const held = this.#heldNow();
    await this.#readUnreported(end);
    const result = this.#result(end, held);
    if (exit !== null) this.#releaseLease();
    return result;
  }

  async #endAnswered(end: RunEnd): Promise<RunResult> {
    const { child, leases, holder } = this.#p;
    if (end.kind === "invalid") {
      const exit = await _killWithin(child, this.#p.graceSeconds);
      const held = this.#heldNow();
      await this.#readUnreported(end);
      if (exit !== null) this.#releaseLease();
      return this.#result(end, held);
    }
    if (end.kind === "outcome" && end.retire === null) {
      const held = this.#heldNow();
      await this.#readUnreported(end);
      if (!end.cleanup) {
        // A kept child released its lease itself after cleanup; make sure nothing is held.
        this.#releaseLease();
        return this.#result(end, held);
      }
      // The outcome is final, the child's reuse hygiene is not done yet: it keeps its seat
      // (and the rest of the execution budget, at least 1 s) until its `clean` frame.
      const budgetMs = Math.max(1000, this.#remainingMs - (performance.now() - this.#runningSince));
      return this.#result(end, held, Promise.resolve(), this.#awaitClean(budgetMs));
    }
    // Retiring: the lease stays held through the child's teardown, released once it is gone;
    // held no longer as the request's but as the teardown's, beside which a new context may
    // be created (server/workers/lease.ts).
    const held = this.#heldNow();
    this.#killIfOverdue(child);
    await this.#readUnreported(end);
    leases?.cancel(holder);
    if (leases && this.#heldSince !== null) {
      const teardown: LeaseHolder = { id: `teardown:${holder.id}`, teardown: true };
      this.#leaseHeldMs += leases.handOver(holder, teardown);
      this.#heldSince = null;
      return this.#result(end, held, child.exited.then(() => void leases.release(teardown)));
    }
    return this.#result(end, held, child.exited.then(() => this.#releaseLease()));
  }

  /**
   * A retiring child exits right after its answer (its teardown is the process's exit). One
   * still there after the termination grace (at least 1 s): a program that outlived its answer
   * (say, by stalling the flush of its streams at exit), or a teardown that hangs, is killed, so
   * neither the lease nor the seat waits on it for good.
   */
  #killIfOverdue(child: ChildChannel): void {
    const graceSeconds = this.#p.graceSeconds;
    const timer = setTimeout(
      () => void _killWithin(child, graceSeconds),
      Math.max(1, graceSeconds) * 1000,
    );
    child.exited.then(() => clearTimeout(timer));
  }

  /**
   * The reuse hygiene of a kept child after its answer, until its `clean` frame. The child asks
   * for and gives back the lease as during the run (its GPU part runs under the lease, the rest
   * without it; a retiring child takes it again, so its exit stays under it). Resolves with
   * `null` (kept) or the reason it retires, once a retiring child is gone: killed, under the
   * lease, if it overran `budgetMs` or sent anything else. Whatever it holds is released then.
   */
  async #awaitClean(budgetMs: number): Promise<string | null> {
    const { child, leases, holder, graceSeconds } = this.#p;
    let settle!: (retire: string | null) => void;
    const clean = new Promise<string | null>((resolve) => (settle = resolve));
    child.setHandler((frame) => {
      if (frame.t === "lease" && frame.a === "acquire") this.#onAcquire(false);
      else if (frame.t === "lease" && frame.a === "release") this.#releaseLease();
      else if (frame.t !== "clean") settle("invalid_response");
      else settle(typeof frame.retire === "string" ? frame.retire : null);
    });
    const timer = setTimeout(() => settle("timeout"), budgetMs);
    const exitWatch = child.watchExit();
    const retire = await Promise.race([clean, exitWatch.exited.then(() => "crashed")]);
    exitWatch.stop();
    clearTimeout(timer);
    child.setHandler(null);
    if (retire === "timeout" || retire === "invalid_response") {
      await this.#takeLease();
      await _killWithin(child, graceSeconds);
    } else if (retire !== null) {
      await child.exited; // teardown stays under the lease
    }
    leases?.cancel(holder);
    this.#releaseLease();
    return retire;
  }

  /** The child (and its whole tree) is gone mid-program. */
  async #endCrashed(exit: ChildExit): Promise<RunResult> {
    this.#p.leases?.cancel(this.#p.holder);
    const held = this.#heldNow();
    // The child marks each instruction in a page its zygote reads after the crash; `instr`
    // frames (a runtime that still sends them) are the fallback.
    const instructionIndex = exit.instruction ?? this.#lastInstruction;
    const end: RunEnd = { kind: "crashed", exit, instructionIndex };
    await this.#readUnreported(end);
    this.#releaseLease();
    return this.#result(end, held);
  }
}

/** The reason a child leaves its seat after a run that ended so (`null`: it stays). */
export function retireReason(end: RunEnd): string | null {
  switch (end.kind) {
    case "outcome":
      return end.retire;
    case "timeout":
      return "timeout";
    case "crashed":
      return "crashed";
    case "invalid":
      return "invalid_response";
  }
}

/** Kills the child's tree and waits for confirmation; `null` if the zygote never confirmed. */
async function _killWithin(child: ChildChannel, graceSeconds: number): Promise<ChildExit | null> {
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
    await child.destroySlot();
    return await child.exited;
  }
  return exit;
}

/**
 * Runs one program on one worker child: sends `run`, serves the child's lease requests, enforces
 * the execution deadline (paused while the child waits for the lease), and turns the end of the
 * run into an outcome, a crash, or a timeout kill. A run that held the lease but got no GPU-state
 * receipt from the worker gets the server's own reading (`readGpus`) before the lease goes.
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
  /** A kept child's pending reuse hygiene: resolves with `null` (kept) or why it retires. */
  cleanup: Promise<string | null> | null;
  /** The server's GPU reading when the request held the lease and got no worker receipt. */
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
  /** The lease is held already since this `performance.now()` (a GPU set's from its init). */
  heldSince?: number;
  /** Time already spent waiting for the lease before the run (a GPU set's). */
  waitedMs?: number;
  /** The first instruction takes the lease: take it now if free and send `lease_held`. */
  leaseFirst?: boolean;
  /** Reads the GPUs' state in the server when the run ends without the worker's receipt. */
  readGpus?: () => Promise<GpuStateReading>;
}

/** Runs the program and returns how it ended; never throws for worker failures. */
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
      // What the child's first `acquire` would get at once, one round trip earlier.
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
    }, () => {}); // cancelled: the run is ending anyway
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

  #armDeadline(): void {
    this.#runningSince = performance.now();
    this.#timer = setTimeout(this.#timedOut, Math.max(0, this.#remainingMs));
  }

  #pauseDeadline(): void {
    clearTimeout(this.#timer);
    this.#remainingMs -= performance.now() - this.#runningSince;
  }

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

  /** No worker receipt though the lease was held: read the GPUs now, still under the lease. */
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
        this.#releaseLease();
        return this.#result(end, held);
      }
      // Final answer, hygiene pending: the seat stays until `clean` (rest of the budget, >= 1 s).
      const budgetMs = Math.max(1000, this.#remainingMs - (performance.now() - this.#runningSince));
      return this.#result(end, held, Promise.resolve(), this.#awaitClean(budgetMs));
    }
    // Retiring: the lease passes to the teardown and is released once the child is gone.
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

  /** Kills a retiring child still there after the grace (>= 1 s), so nothing waits on it. */
  #killIfOverdue(child: ChildChannel): void {
    const graceSeconds = this.#p.graceSeconds;
    const timer = setTimeout(
      () => void _killWithin(child, graceSeconds),
      Math.max(1, graceSeconds) * 1000,
    );
    child.exited.then(() => clearTimeout(timer));
  }

  /**
   * A kept child's reuse hygiene until its `clean` frame, lease frames served as in the run.
   * Resolves with `null` (kept) or why it retires; an overrun or stray frame is killed.
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
    // The zygote's instruction page first; `instr` frames are the fallback.
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
    await child.destroySlot();
    return await child.exited;
  }
  return exit;
}

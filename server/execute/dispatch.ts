/**
 * Dispatch, the third stage of `/execute`: an admitted request takes a seat (503 when none frees
 * up in time) and its GPU set if it asks for one, runs on the seat's child, and becomes a result
 * body or a {@linkcode Rejection} (504 timeout, 500 dead or nonsensical worker or answer over the
 * limit, 200 FAILED for a death inside an instruction). Every answer of a request that held a GPU
 * lease carries its GPU-state receipt: the worker's, else the server's own reading.
 *
 * @module
 */
import { ERROR_MESSAGES } from "../../protocol/errors.ts";
import type { EventLog } from "../../http/events.ts";
import { Rejection, unhandledFields } from "../../http/rejection.ts";
import type { GpuReceipt, GpuReceiptServerReason } from "../../protocol/gpu_receipt.ts";
import type { Admitted } from "./admission.ts";
import { busyRejection } from "./intake.ts";
import type { ServerConfig } from "../config.ts";
import { retireReason, type RunEnd, runProgram, type RunResult } from "./execution.ts";
import type { ProgramOutcome } from "./finish.ts";
import { type GpuSet, takeGpuSet } from "../workers/gpu_sets.ts";
import type { WorkerLaunch } from "../workers/launch.ts";
import type { GpuLeases, LeaseHolder } from "../workers/lease.ts";
import type { LiveOutput } from "./live_output.ts";
import { outputTail } from "./output_tail.ts";
import { gpuReceiptFromServer, gpuReceiptFromWorker, receiptHeaders } from "./gpu_receipt.ts";
import { PoolBusy, type Retiring, type Seat, type WorkerPool } from "../workers/pool.ts";
import { buildResultBody, crashError, crashResultBody, type ResponseMeta } from "./result_body.ts";
import type { SeatChild } from "../workers/worker_handles.ts";
import type { BlobCaches } from "../cache/blobs.ts";
import type { KeepTarget } from "./kept_returns.ts";
import type { FileCopier } from "../../protocol/hash_threads.ts";
import { hostPaths, WorkerFileError } from "../workers/worker_files.ts";
import type { WorkerOutcome } from "../workers/worker_protocol.ts";

/** What dispatch needs of the server. */
export interface DispatchServices {
  /** The effective configuration. */
  config: ServerConfig;
  /** The event log (`request_routed`, `gpu_access_violation`). */
  events: EventLog;
  /** The seats. */
  pool: WorkerPool;
  /** The GPU lease arbiter (`null` on a CPU server). */
  leases: GpuLeases | null;
  /** How workers are launched (GPU sets' children, paths inside a sandbox). */
  launch: WorkerLaunch;
  /** A new, unused directory for one response's files (made when first used). */
  stagingDir: (requestId: string) => string;
  /** Work left running after the answer (awaited when the server stops). */
  track: (task: Promise<void>) => void;
  /** The caches (kept returns go to the memory cache). */
  caches: BlobCaches;
  /** Hashing threads (kept returns are copied and hashed there). */
  hashes: FileCopier;
}

/**
 * Runs `admitted` on a seat; resolves with its 200 outcome or throws a {@linkcode Rejection}.
 * With `live`, the capture files are streamed to it while the program runs.
 */
export async function dispatchRequest(
  services: DispatchServices,
  admitted: Admitted,
  live?: LiveOutput,
  clientGone?: AbortSignal,
): Promise<ProgramOutcome> {
  const queueStart = performance.now();
  let seat: Seat;
  try {
    seat = await services.pool.acquire(
      services.config.workerWaitTimeoutSeconds * 1000,
      clientGone,
    );
  } catch (error) {
    if (error instanceof PoolBusy) {
      throw busyRejection(performance.now() - queueStart);
    }
    if (clientGone?.aborted && error === clientGone.reason) {
      admitted.releaseBlobs();
      throw _clientDisconnected(performance.now() - queueStart);
    }
    throw error;
  }
  try {
    const queueMs = performance.now() - queueStart;
    return await new _SeatRun(services, admitted, seat, queueMs, live, clientGone).run();
  } finally {
    admitted.releaseBlobs();
  }
}

/** A client gone before its program started: never run (499, as nginx logs it). */
function _clientDisconnected(queueMs: number): Rejection {
  return new Rejection(
    499,
    "client_disconnected",
    "the client closed its connection before the program started",
    "client_disconnected",
    { queue_ms: queueMs, error_kind: "client_disconnected" },
  );
}

/** One admitted request on one seat, from taking the seat to giving it back. */
class _SeatRun {
  readonly #s: DispatchServices;
  readonly #a: Admitted;
  readonly #keep: KeepTarget | null;
  readonly #seat: Seat;
  readonly #queueMs: number;
  readonly #holder: LeaseHolder;
  readonly #workspace: string;
  #retiring: Retiring | null = null;
  #workerCleanup: Promise<string | null> | null = null;
  #released = false;
  readonly #live: LiveOutput | undefined;
  readonly #clientGone: AbortSignal | undefined;
  #receipt: GpuReceipt | null = null;

  constructor(
    services: DispatchServices,
    admitted: Admitted,
    seat: Seat,
    queueMs: number,
    live?: LiveOutput,
    clientGone?: AbortSignal,
  ) {
    this.#live = live;
    this.#clientGone = clientGone;
    this.#s = services;
    this.#a = admitted;
    this.#keep = admitted.keepMinBytes === undefined ? null : {
      store: services.caches.store,
      maxBytes: Math.floor(services.caches.store.capacityBytes / 4),
      hashes: services.hashes,
    };
    this.#seat = seat;
    this.#queueMs = queueMs;
    this.#holder = { id: admitted.requestId };
    this.#workspace = seat.workspaces.current;
  }

  get #worker(): { worker_id: string; gpu_id: number | null } {
    return { worker_id: this.#seat.label, gpu_id: this.#seat.gpus[0] ?? null };
  }

  async run(): Promise<ProgramOutcome> {
    try {
      return await this.#run();
    } catch (error) {
      const rejection = this.#rejection(error);
      if (rejection instanceof Rejection) {
        Object.assign(rejection.headers, receiptHeaders(this.#receipt));
      }
      throw rejection;
    } finally {
      this.#release();
    }
  }

  #rejection(error: unknown): unknown {
    if (error instanceof Rejection) return error;
    this.#retireOnError(error);
    if (error instanceof WorkerFileError) return this.#invalidAnswer();
    if (this.#receipt === null) return error;
    return new Rejection(500, "engine", ERROR_MESSAGES.internal, "server_error", {
      ...unhandledFields(error),
    });
  }

  #receiptOf(run: RunResult, gpus: readonly number[]): GpuReceipt | null {
    const devices = this.#s.launch.devices(gpus);
    const end = run.end;
    if (end.kind === "outcome" && end.outcome.gpu_receipt != null) {
      return gpuReceiptFromWorker(end.outcome.gpu_receipt, devices);
    }
    if (run.serverReading === null) return null;
    return gpuReceiptFromServer(run.serverReading, devices, _serverReason(end));
  }

  async #run(): Promise<ProgramOutcome> {
    const { config, events, leases, launch } = this.#s;
    const seat = this.#seat;
    const requestId = this.#a.requestId;
    const paths = launch.workerPaths(seat);
    const blobs: Record<string, string> = {};
    for (const sha of Object.keys(this.#a.blobPaths)) blobs[sha] = `${paths.blobDir}/${sha}`;

    let child: SeatChild = seat.child!;
    let gpus: readonly number[] = seat.gpus;
    let timeoutMs = this.#a.timeoutSeconds * 1000;
    // A client that left while its request waited: the seat goes back unused.
    if (this.#clientGone?.aborted) throw _clientDisconnected(this.#queueMs);
    events.emit("INFO", "request_routed", {
      request_id: requestId,
      ...this.#worker,
      gpu_ids: null,
      generation: seat.generation,
      pid: child.pid,
      queue_ms: this.#queueMs,
    });
    const started = performance.now();
    let set: GpuSet | null = null;
    if (this.#a.gpuCount !== undefined && leases) {
      set = await takeGpuSet({
        leases,
        launch,
        seat,
        holder: this.#holder,
        count: this.#a.gpuCount,
        graceSeconds: config.workerTerminationGraceSeconds,
      });
      // Starting the set's child counts against the execution budget (as upstream).
      timeoutMs -= performance.now() - set.heldSince;
      child = set.child;
      gpus = set.gpus;
      if (this.#clientGone?.aborted) {
        leases.release(this.#holder);
        await set.dispose();
        throw _clientDisconnected(this.#queueMs);
      }
      if (timeoutMs <= 0) {
        this.#receipt = gpuReceiptFromServer(
          await launch.readGpus(set.gpus),
          launch.devices(set.gpus),
          "timeout",
        );
        leases.release(this.#holder);
        await set.dispose();
        throw new Rejection(504, "timeout", ERROR_MESSAGES.initTimeout, "timeout", {
          ...this.#worker,
          queue_ms: this.#queueMs,
          elapsed_ms: performance.now() - started,
          timeout_seconds: this.#a.timeoutSeconds,
          output_tail: null,
        });
      }
    }

    const stderrMark = child.slot.stderrSeen;
    const liveTail = this.#live && this.#a.outputLimit > 0
      ? this.#live.tail(seat.resultsDir, this.#a.outputLimit, this.#s.stagingDir(requestId))
      : null;
    const running = runProgram({
      child,
      leases,
      gpus,
      holder: this.#holder,
      timeoutMs,
      heldSince: set?.heldSince,
      waitedMs: set?.waitedMs,
      leaseFirst: this.#a.leaseFirst,
      graceSeconds: config.workerTerminationGraceSeconds,
      readGpus: leases ? () => launch.readGpus(gpus) : undefined,
      request: {
        request_id: requestId,
        program: this.#a.programText,
        blobs,
        workspace: seat.workspaces.workerPath,
        results: paths.results,
        output_limit_bytes: this.#a.outputLimit,
        max_return_bytes: config.maxResponseBytes,
        sandbox: launch.sandboxed,
        // A kept worker answers before its reuse hygiene.
        reply_before_reset: true,
        ...(this.#keep &&
          { keep_min_bytes: this.#a.keepMinBytes, keep_max_bytes: this.#keep.maxBytes }),
      },
    });
    const run = await running.finally(() => liveTail?.stop());
    this.#workerCleanup = run.cleanup;
    this.#receipt = this.#receiptOf(run, gpus);
    const end = run.end;
    if (set) {
      this.#s.track(run.teardown.then(() => set.dispose()));
    } else {
      const reason = retireReason(end);
      if (reason !== null) {
        // worker_exited's teardown_ms counts from the end of the run.
        this.#retiring = {
          oldExit: Promise.all([child.exited, run.teardown]),
          since: performance.now(),
          reason,
        };
      }
    }
    const meta: ResponseMeta = {
      requestId,
      queueMs: this.#queueMs,
      elapsedMs: performance.now() - started,
      leaseWaitMs: run.leaseWaitMs,
      leaseHeldMs: run.leaseHeldMs,
      gpuIds: this.#a.gpuCount !== undefined ? [...gpus] : undefined,
    };

    switch (end.kind) {
      case "timeout": {
        const tail = await outputTail(seat.resultsDir, child.slot.stderrTail(stderrMark));
        throw new Rejection(504, "timeout", ERROR_MESSAGES.timeout, "timeout", {
          ...this.#worker,
          queue_ms: this.#queueMs,
          elapsed_ms: meta.elapsedMs,
          timeout_seconds: this.#a.timeoutSeconds,
          output_tail: tail || null,
        });
      }
      case "invalid":
        throw this.#invalidAnswer();
      case "crashed": {
        const tail = await outputTail(seat.resultsDir, child.slot.stderrTail(stderrMark));
        const exitcode = end.exit.code ?? (end.exit.signal !== null ? -end.exit.signal : null);
        const index = end.instructionIndex;
        if (index === null || index < 0 || index >= this.#a.instructions.length) {
          throw new Rejection(500, "engine", ERROR_MESSAGES.workerCrashed, "crashed", {
            ...this.#worker,
            exitcode,
            queue_ms: this.#queueMs,
            elapsed_ms: meta.elapsedMs,
            output_tail: tail || null,
          });
        }
        const error = crashError(index, this.#a.instructions[index]);
        const bytes = new TextEncoder().encode(crashResultBody(meta, error));
        return {
          kind: "program",
          status: "FAILED",
          body: bytes,
          contentType: "application/json",
          bytes: bytes.length,
          record: this.#record(meta, run, "crashed", error, exitcode, tail),
          gpuReceipt: this.#receipt,
        };
      }
      case "outcome":
        return await this.#answer(end.outcome, meta, run, child, gpus);
    }
  }

  /** A program the worker answered: its result body, built from the worker's files. */
  async #answer(
    answer: WorkerOutcome,
    meta: ResponseMeta,
    run: RunResult,
    child: SeatChild,
    gpus: readonly number[],
  ): Promise<ProgramOutcome> {
    const { config, events, leases } = this.#s;
    const seat = this.#seat;
    const outcome = hostPaths(answer, this.#s.launch.workerPaths(seat).results, seat.resultsDir);
    if (outcome.error?.kind === "gpu_access" && leases) {
      const detected = outcome.gpu_access?.detected_at_ns ?? outcome.error.detected_at_ns;
      let interfered: string | null = null;
      if (typeof detected === "number") {
        const at = detected / 1e6 + (child.slot.hello?.clockOffsetMs ?? 0);
        interfered = leases.holderAt(gpus, at, this.#holder);
      }
      meta.interferedRequestId = interfered;
      events.emit("WARNING", "gpu_access_violation", {
        request_id: this.#a.requestId,
        ...this.#worker,
        instruction_id: outcome.error.instruction_id ?? null,
        cuda_call: outcome.error.cuda_call ?? outcome.gpu_access?.cuda_call ?? null,
        location: outcome.error.location ?? outcome.gpu_access?.location ?? null,
        interfered_request_id: interfered,
      });
    }
    if (typeof outcome.too_large === "number") throw this.#tooLarge(meta, outcome.too_large);
    const body = await buildResultBody(
      outcome,
      meta,
      this.#a.outputLimit,
      config.maxResponseBytes,
      this.#s.stagingDir(this.#a.requestId),
      this.#keep,
    );
    if (body.kind === "too_large") throw this.#tooLarge(meta, body.bytes);
    const reason = outcome.status === "COMPLETED" ? "completed" : "program_failed";
    return {
      kind: "program",
      status: body.status,
      body: body.body,
      contentType: body.contentType,
      bytes: body.bytes,
      record: this.#record(meta, run, reason, outcome.error, null, null),
      gpuReceipt: this.#receipt,
    };
  }

  #record(
    meta: ResponseMeta,
    run: RunResult,
    finishReason: "completed" | "program_failed" | "crashed",
    error: Record<string, unknown> | null,
    exitcode: number | null,
    outputTail: string | null,
  ): ProgramOutcome["record"] {
    return {
      finishReason,
      exitcode,
      outputTail,
      workerId: this.#seat.label,
      gpuId: this.#seat.gpus[0] ?? null,
      error,
      queueMs: this.#queueMs,
      elapsedMs: meta.elapsedMs,
      leaseWaitMs: run.leaseWaitMs,
      leaseHeldMs: run.leaseHeldMs,
    };
  }

  #tooLarge(meta: ResponseMeta, bytes: number): Rejection {
    return new Rejection(
      500,
      "response_too_large",
      ERROR_MESSAGES.responseTooLarge,
      "server_error",
      {
        error_kind: "response_too_large",
        response_bytes: bytes,
        ...this.#worker,
        queue_ms: this.#queueMs,
        elapsed_ms: meta.elapsedMs,
        lease_held_ms: meta.leaseHeldMs,
      },
    );
  }

  /** The worker answered something that cannot be trusted: 500 engine. */
  #invalidAnswer(): Rejection {
    return new Rejection(500, "engine", ERROR_MESSAGES.invalidWorkerResponse, "server_error", {
      error_kind: "invalid_worker_response",
      ...this.#worker,
    });
  }

  /** An error the run did not expect: the seat's child is not trusted again. */
  #retireOnError(error: unknown): void {
    const child = this.#seat.child;
    if (this.#released || !child || this.#retiring) return;
    const reason = error instanceof WorkerFileError ? "invalid_response" : "crashed";
    this.#retiring = {
      oldExit: child.kill(this.#s.config.workerTerminationGraceSeconds),
      reason,
    };
  }

  /** Gives the seat back; the request's workspace is retired before its answer goes out. */
  #release(): void {
    if (this.#released) return;
    this.#released = true;
    const seat = this.#seat;
    this.#s.track(seat.workspaces.retire(this.#workspace));
    const pending = this.#workerCleanup;
    if (pending === null) {
      this.#s.pool.release(seat, this.#retiring);
      return;
    }
    this.#s.pool.releaseAfter(
      seat,
      pending.then((reason) => {
        if (reason !== null && !this.#retiring) {
          this.#retiring = { oldExit: Promise.resolve(), reason };
        }
        return this.#retiring;
      }),
    );
  }
}

/** Why the server, not the worker, took the receipt of a run that ended with `end`. */
function _serverReason(end: RunEnd): GpuReceiptServerReason {
  return end.kind === "outcome" ? "not_reported" : retireReason(end) as GpuReceiptServerReason;
}

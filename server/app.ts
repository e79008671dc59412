/**
 * The HTTP application of a KCoral server: `GET /health` and `POST /execute` as Web-standard
 * `Request` → `Response` handlers, around the worker pool. The front-end never touches a GPU.
 *
 * @module
 */
import { ERROR_MESSAGES, errorBody } from "../protocol/errors.ts";
import { parseExecuteRequest, RequestParseError } from "../protocol/request.ts";
import { HashThreads } from "../protocol/_hash_thread.ts";
import { PartDigests } from "../protocol/_part_digests.ts";
import { BodyBuffers } from "./body_buffers.ts";
import { BodyReadError, LARGE_BODY_BYTES, readRequestBody } from "./request_body.ts";
import { cacheMissJson, resultJson } from "../protocol/response.ts";
import { BlobRejected, resolveBlobs } from "./blobs.ts";
import { DiskFileCache } from "./cache_disk.ts";
import { BlobStore } from "./cache_memory.ts";
import { distinctGpuCount, resolveServerConfig, type ServerConfig } from "./config.ts";
import { detectDevices, type GpuDevice, simulatedDevices } from "./devices.ts";
import { EventLog } from "./events.ts";
import { runProgram, type RunResult, type WorkerOutcome } from "./execution.ts";
import { MAX_FRAME_BYTES } from "./ipc.ts";
import { outputTail } from "./output_tail.ts";
import type { InstructionSummary } from "../protocol/program.ts";
import { GpuLeases, type LeaseHolder } from "./lease.ts";
import { PoolBusy, type Retiring, type Seat, WorkerPool } from "./pool.ts";
import { buildResponse, WorkerFileError } from "./response.ts";
import { runtimePythonPath } from "./runtime_files.ts";
import {
  probeSandbox,
  type PythonInfo,
  pythonInfo,
  slotCommand,
  type SlotLaunch,
  workerPaths,
} from "./sandbox.ts";
import { Slot, type WorkerChild } from "./slot.ts";

/** Options of {@linkcode createApp} that are not part of the server configuration. */
export interface AppOptions {
  /** Replaces the console sink of the event log (tests). */
  consoleWrite?: (line: string) => void;
  /**
   * The environment workers start with, and whose `PATH` finds `bwrap` (default: this
   * process's environment).
   */
  env?: Record<string, string>;
}

/** The `/health` body (spec protocol §1.1). */
export interface HealthBody {
  /** Always `"ok"` while the application is up. */
  status: "ok";
  /** Random UUID of this server process. */
  instance_id: string;
  /** UTC start time, e.g. `2026-05-01T09:00:00.123000Z`. */
  started_at: string;
  /** Distinct configured GPUs (0 on a CPU server). */
  gpu_count: number;
  /** Workers able to take requests, requests holding a worker, requests waiting for one. */
  load: { request_capacity: number; requests_in_progress: number; requests_waiting: number };
  /** Compilation target (`{"arch": "sm_90a"}`), `{}` on CPU servers. */
  target: Record<string, string>;
  /** Versions the workers run (torch, cuda, ...). */
  versions: Record<string, string>;
}

/** A KCoral server application. */
export interface App {
  /** The effective configuration. */
  readonly config: ServerConfig;
  /** Handles one HTTP request. */
  fetch(request: Request, info?: Deno.ServeHandlerInfo): Promise<Response>;
  /** Starts caches and workers; resolves when the server can take work. */
  start(): Promise<void>;
  /** Graceful shutdown: refuse new work, finish requests in flight, stop every worker. */
  shutdown(): Promise<void>;
  /** The current health report. */
  health(): HealthBody;
  /** The isolation in effect (`"none"` after a failed bubblewrap probe). */
  readonly sandbox: "bubblewrap" | "none";
  /** Observes every event the server logs; returns a function that stops observing. */
  subscribe(listener: (event: Record<string, unknown>) => void): () => void;
}

/** Internal parts of an application (tests and benchmarks; not public API). */
export function appInternals(
  app: App,
): { pool: WorkerPool | null; events: EventLog; blobDir: string | null } {
  if (!(app instanceof _Server)) throw new TypeError("not a KCoral server application");
  return { pool: app.pool, events: app.events, blobDir: app.blobDir };
}

const _TORCHRUN_VARS = [
  "RANK",
  "WORLD_SIZE",
  "LOCAL_RANK",
  "LOCAL_WORLD_SIZE",
  "GROUP_RANK",
  "ROLE_RANK",
  "ROLE_WORLD_SIZE",
  "MASTER_ADDR",
  "MASTER_PORT",
];
const _NO_MULTICAST = {
  NCCL_NVLS_ENABLE: "0",
  TORCH_SYMM_MEM_DISABLE_MULTICAST: "1",
  NVSHMEM_DISABLE_NVLS: "1",
};
/** Large-body receive buffers and mirrors up to this size are pooled (two of each). */
const _POOLED_BODY_BYTES = 256 * 1024 * 1024;
/** Room in a worker frame beyond the answer itself (part and output descriptions). */
const _FRAME_OVERHEAD_BYTES = 16 * 1024 * 1024;
/** Why a body still arriving at shutdown stopped being read. */
const _SHUTTING_DOWN = new Error("the server is shutting down");
/** Large bodies read at once into buffers sized before their bytes arrive (as upstream's 4). */
const _MAX_LARGE_RECEIVES = 4;
/** Pooled ones are freed after this long without a large body (up to 1 GiB idle otherwise). */
const _IDLE_BODY_BUFFERS_MS = 60_000;
const _UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** `request_finished` levels by `finish_reason` (spec server §8); others are INFO. */
const _FINISH_LEVEL: Record<string, "INFO" | "WARNING" | "ERROR"> = {
  completed: "INFO",
  program_failed: "INFO",
  timeout: "WARNING",
  crashed: "ERROR",
  no_worker: "WARNING",
  rejected: "WARNING",
  cache_miss: "INFO",
  server_error: "ERROR",
};

/**
 * Builds a server application. Nothing starts until {@linkcode App.start} (or
 * {@linkcode serve}, which starts it and listens).
 *
 * @example A CPU server on a free port, one program through it
 * ```ts
 * import { Client, createApp, Program, serve } from "../mod.ts";
 *
 * const app = createApp({ device: "cpu", sandbox: "none", logConsole: false, diskCacheDir: null });
 * const server = await serve(app, { port: 0, handleSignals: false, log: () => {} });
 * const program = new Program();
 * const mod = program.upload({ kind: "module", source: "def f(x):\n    return x + 1\n" });
 * const y = program.run({ fn: program.getFunction({ module: mod, name: "f" }), args: [41] });
 * program.return_({ key: "y", value: y });
 * await using client = new Client(server.url);
 * const result = await client.execute(program);
 * if (result.get("y") !== 42) throw new Error("unexpected result");
 * await server.shutdown();
 * ```
 */
export function createApp(input: Partial<ServerConfig> = {}, options: AppOptions = {}): App {
  const config = resolveServerConfig(input);
  return new _Server(config, options);
}

class _Server implements App {
  readonly config: ServerConfig;
  readonly events: EventLog;
  readonly instanceId = crypto.randomUUID();
  readonly startedAt = _pythonIsoNow();
  sandbox: "bubblewrap" | "none";
  pool: WorkerPool | null = null;

  /** The memory cache's directory once started. */
  get blobDir(): string | null {
    return this.#store?.dir ?? null;
  }
  #options: AppOptions;
  #runtimeDir = "";
  #store: BlobStore | null = null;
  /** Threads hashing and spooling large bodies: two per blob payload, for up to four at once. */
  readonly #hashes = new HashThreads(
    Math.max(1, Math.min(8, (navigator.hardwareConcurrency ?? 2) - 1)),
  );
  readonly #bodies = new BodyBuffers(
    2,
    _POOLED_BODY_BYTES,
    (size) => new ArrayBuffer(size),
    { releaseAfterMs: _IDLE_BODY_BUFFERS_MS },
  );
  /** Shared copies of large bodies that the hashing threads read (reading never waits). */
  readonly #mirrors = new BodyBuffers(
    2,
    _POOLED_BODY_BYTES,
    (size) => new SharedArrayBuffer(size),
    { releaseAfterMs: _IDLE_BODY_BUFFERS_MS },
  );
  #disk: DiskFileCache;
  #leases: GpuLeases | null = null;
  #devices = new Map<number, GpuDevice>();
  #python: PythonInfo | null = null;
  #launchBase:
    | Omit<SlotLaunch, "workspacesDir" | "workspace" | "resultsDir" | "devices">
    | null = null;
  #closing = false;
  /** Large bodies being read into buffers sized by their Content-Length. */
  #largeReceives = 0;
  /** Requests whose bodies are still arriving. */
  readonly #receiving = new Set<AbortController>();
  #started = false;
  #inFlight = 0;
  #idle: (() => void) | null = null;
  #background = new Set<Promise<void>>();
  #responseSeq = 0;

  constructor(config: ServerConfig, options: AppOptions) {
    this.config = config;
    this.#options = options;
    this.sandbox = config.sandbox;
    this.events = new EventLog({
      logDir: config.logDir,
      console: config.logConsole,
      programs: config.logPrograms,
      consoleWrite: options.consoleWrite,
    });
    this.#disk = new DiskFileCache(
      config.diskCacheDir,
      config.diskCacheCapacityMbytes * 1024 * 1024,
    );
    this.fetch = this.fetch.bind(this);
  }

  async start(): Promise<void> {
    if (this.#started) throw new Error("the server is already started");
    this.#started = true;
    const config = this.config;
    this.events.emit("INFO", "server_started", {
      run_dir: this.events.runDir,
      config: _describeConfig(config),
    });
    try {
      this.#runtimeDir = await Deno.makeTempDir({ prefix: "kcoral-" });
      this.#store = new BlobStore(await _blobDir(this.#runtimeDir), config.cacheCapacityBytes);
      await this.#disk.prepare();
      this.#python = await pythonInfo(config.python, this.#options.env);
      const runtimePath = await runtimePythonPath(this.#runtimeDir);
      const gpuMode = config.device === "gpu";
      const devices = !gpuMode
        ? []
        : config.simulateGpus
        ? simulatedDevices(config.gpus)
        : await detectDevices(config.gpus, this.#python.executable, runtimePath);
      for (const device of devices) this.#devices.set(device.index, device);
      const env = { ...(this.#options.env ?? Deno.env.toObject()) };
      if (gpuMode) delete env.CUDA_VISIBLE_DEVICES;
      this.#launchBase = {
        sandbox: config.sandbox,
        python: this.#python,
        runtimePath,
        zygoteArgs: gpuMode && config.simulateGpus
          ? ["--mode", "sim", "--sim-devices", String(Math.max(...config.gpus) + 1)]
          : ["--mode", gpuMode ? "gpu" : "cpu"],
        blobDir: this.#store.dir,
        readonlyPaths: config.sandboxReadonlyPaths,
        gpu: gpuMode,
        env,
        // An answer as large as the response limit travels in one frame (the worker keeps its
        // answers within it, or says it did not).
        maxFrameBytes: Math.max(MAX_FRAME_BYTES, config.maxResponseBytes + _FRAME_OVERHEAD_BYTES),
      };
      if (config.sandbox === "bubblewrap") await this.#probe(devices);
      this.#leases = gpuMode ? new GpuLeases(devices.map((d) => d.index)) : null;
      const seats = gpuMode
        ? devices.flatMap((device) =>
          Array.from({ length: config.workersPerGpu }, (_, i) => ({
            label: `gpu${device.index}/w${i}`,
            gpus: [device.index],
          }))
        )
        : Array.from({ length: config.numWorkers }, (_, i) => ({ label: `cpu/w${i}`, gpus: [] }));
      this.pool = new WorkerPool({
        seats,
        runtimeDir: this.#runtimeDir,
        sandboxed: this.#sandboxed,
        leases: this.#leases,
        slotCommand: (seat) => slotCommand(this.#launchFor(seat, seat.gpus)),
        childEnv: (seat) => this.#childEnv(seat.gpus),
        maxRequestsPerWorker: config.maxRequestsPerWorker,
        events: this.events,
      });
      await this.pool.start();
      this.events.emit("INFO", "pool_ready", {
        sandbox: this.sandbox,
        mode: gpuMode ? (config.simulateGpus ? "simulated-gpu" : "gpu") : "cpu",
        target: this.pool.target,
        versions: this.pool.versions,
        workers: this.pool.seats.length,
      });
    } catch (error) {
      this.events.emit("ERROR", "server_start_failed", {
        error: error instanceof Error ? `${error.name}: ${error.message}` : String(error),
        traceback: error instanceof Error ? (error.stack ?? "").slice(-8192) : "",
      });
      await this.#teardown();
      throw error;
    }
  }

  subscribe(listener: (event: Record<string, unknown>) => void): () => void {
    return this.events.subscribe(listener);
  }

  health(): HealthBody {
    const load = this.pool?.load() ??
      { request_capacity: 0, requests_in_progress: 0, requests_waiting: 0 };
    if (this.#closing) load.request_capacity = 0;
    return {
      status: "ok",
      instance_id: this.instanceId,
      started_at: this.startedAt,
      gpu_count: distinctGpuCount(this.config),
      load,
      target: this.pool?.target ?? {},
      versions: this.pool?.versions ?? {},
    };
  }

  async fetch(request: Request, info?: Deno.ServeHandlerInfo): Promise<Response> {
    const url = new URL(request.url);
    if (url.pathname === "/health") {
      if (request.method !== "GET" && request.method !== "HEAD") return _methodNotAllowed("GET");
      return _json(200, JSON.stringify(this.health()));
    }
    if (url.pathname === "/execute") {
      if (request.method !== "POST") return _methodNotAllowed("POST");
      this.#inFlight++;
      try {
        return await this.#execute(request, info);
      } catch (error) {
        // Anything unexpected is a 500 `engine` with the spec's body; the server keeps serving.
        this.events.emit("ERROR", "request_finished", {
          request_id: null,
          http_status: 500,
          finish_reason: "server_error",
          ..._unhandledFields(error),
        });
        return new Response(errorBody("", "engine", ERROR_MESSAGES.internal), {
          status: 500,
          headers: { "content-type": "application/json", "x-request-id": "" },
        });
      } finally {
        this.#inFlight--;
        if (this.#closing) {
          this.events.emit("INFO", "shutdown_waiting", { remaining: this.#inFlight });
        }
        if (this.#inFlight === 0) this.#idle?.();
      }
    }
    if (url.pathname === "/internal/worker-status") {
      if (!_isLoopback(info)) return _json(404, '{"detail":"Not Found"}');
      if (request.method !== "GET" && request.method !== "HEAD") return _methodNotAllowed("GET");
      return _json(
        200,
        JSON.stringify({
          status: "ok",
          instance_id: this.instanceId,
          target: this.pool?.target ?? {},
          versions: this.pool?.versions ?? {},
          worker_count: this.pool?.seats.length ?? 0,
          busy_workers: this.pool?.busyWorkers ?? 0,
        }),
      );
    }
    return _json(404, '{"detail":"Not Found"}');
  }

  async shutdown(): Promise<void> {
    if (this.#closing) return;
    this.#closing = true;
    for (const receiving of this.#receiving) receiving.abort(_SHUTTING_DOWN);
    this.pool?.beginShutdown();
    this.events.emit("INFO", "shutdown_started", { remaining: this.#inFlight });
    if (this.#inFlight > 0) await new Promise<void>((resolve) => (this.#idle = resolve));
    await this.#teardown();
    this.events.emit("INFO", "shutdown_complete");
    this.events.emit("INFO", "server_stopped");
    this.events.close();
  }

  get #sandboxed(): boolean {
    return this.sandbox === "bubblewrap";
  }

  async #teardown(): Promise<void> {
    await this.pool?.close(this.config.workerTerminationGraceSeconds * 1000);
    await Promise.allSettled([...this.#background]);
    this.#store?.close();
    this.#hashes.close();
    this.#bodies.clear();
    this.#mirrors.clear();
    if (this.#runtimeDir) await Deno.remove(this.#runtimeDir, { recursive: true }).catch(() => {});
  }

  async #probe(devices: GpuDevice[]): Promise<void> {
    const configs = devices.length ? devices.map((d) => [d]) : [[]];
    const probeDir = `${this.#runtimeDir}/probe`;
    for (const deviceSet of configs) {
      await Deno.mkdir(`${probeDir}/ws/w0`, { recursive: true });
      await Deno.mkdir(`${probeDir}/results`, { recursive: true });
      const reason = await probeSandbox({
        ...this.#launchBase!,
        sandbox: "bubblewrap",
        workspacesDir: `${probeDir}/ws`,
        workspace: "w0",
        resultsDir: `${probeDir}/results`,
        devices: deviceSet,
      });
      await Deno.remove(probeDir, { recursive: true }).catch(() => {});
      if (reason !== null) {
        this.sandbox = "none";
        this.#launchBase = { ...this.#launchBase!, sandbox: "none", readonlyPaths: [] };
        const message = `bubblewrap could not start; filesystem isolation is disabled for this ` +
          `server run (workers run WITHOUT isolation; restart to check again): ${reason}`;
        this.events.emit("WARNING", "sandbox_disabled", {
          sandbox: "none",
          error: reason,
          message,
        });
        if (!this.config.logConsole) console.error(`kcoral: warning: ${message}`);
        return;
      }
    }
  }

  #launchFor(seat: Pick<Seat, "workspaces" | "resultsDir">, gpus: readonly number[]): SlotLaunch {
    return {
      ...this.#launchBase!,
      workspacesDir: seat.workspaces.root,
      workspace: seat.workspaces.current,
      resultsDir: seat.resultsDir,
      devices: gpus.map((g) => this.#devices.get(g)!).filter(Boolean),
    };
  }

  #childEnv(gpus: readonly number[]): { env: Record<string, string>; unset: string[] } {
    if (this.config.device !== "gpu") return { env: {}, unset: [] };
    const visible = gpus.map((g) => this.#devices.get(g)!.uuid).join(",");
    const unset = [..._TORCHRUN_VARS];
    for (const name of Object.keys(this.#launchBase?.env ?? {})) {
      if (name.startsWith("TORCHELASTIC_")) unset.push(name);
    }
    return { env: { CUDA_VISIBLE_DEVICES: visible, ..._NO_MULTICAST }, unset };
  }

  async #execute(request: Request, info?: Deno.ServeHandlerInfo): Promise<Response> {
    const config = this.config;
    const requestId = _requestId(request.headers);
    /** An ERROR response, with its `request_finished` event (`fields` as upstream logs them). */
    const respondError: RespondError = (status, kind, message, reason, fields) => {
      this.events.emit(_FINISH_LEVEL[reason] ?? "INFO", "request_finished", {
        request_id: requestId,
        http_status: status,
        finish_reason: reason,
        ...fields,
      });
      const headers: Record<string, string> = {
        "content-type": "application/json",
        "x-request-id": requestId,
      };
      if (status === 503) headers["retry-after"] = "1";
      return new Response(errorBody(requestId, kind, message), { status, headers });
    };
    const contentLength = request.headers.get("content-length");
    this.events.emit("INFO", "request_received", {
      request_id: requestId,
      client: info ? _peerHost(info) : null,
      content_length: contentLength,
    });
    if (this.#closing || !this.pool) {
      await request.body?.cancel().catch(() => {});
      return respondError(503, "busy", ERROR_MESSAGES.busy, "no_worker", { queue_ms: 0 });
    }
    const tooLarge = { error_kind: "request_too_large" };
    if (
      contentLength !== null && /^\d+$/.test(contentLength) &&
      Number(contentLength) > config.maxRequestBytes
    ) {
      await request.body?.cancel().catch(() => {});
      return respondError(
        413,
        "request_too_large",
        ERROR_MESSAGES.requestTooLarge,
        "rejected",
        tooLarge,
      );
    }
    // At most a few large bodies at once get buffers sized by their Content-Length before their
    // bytes arrive (a declared length costs a client nothing); any others are held as they come.
    const inPlace = contentLength !== null && Number(contentLength) >= LARGE_BODY_BYTES &&
      this.#largeReceives < _MAX_LARGE_RECEIVES;
    if (inPlace) {
      this.#hashes.warm();
      this.#largeReceives++;
    }
    const receiveStart = performance.now();
    let observed: PartDigests | undefined;
    let mirror: SharedArrayBuffer | undefined;
    let received;
    // A shutdown stops bodies still arriving (an upload that stalls would hold it forever).
    const receiving = new AbortController();
    this.#receiving.add(receiving);
    try {
      received = await readRequestBody(
        request,
        config.maxRequestBytes,
        !inPlace ? undefined : {
          take: (size) => this.#bodies.take(size),
          observer: () =>
            observed = PartDigests.forMultipart(request.headers, this.#hashes, {
              mirror: () => mirror = this.#mirrors.take(Number(contentLength)),
              // Blob payloads are also written to the memory cache's directory as they arrive.
              spool: (partHeader) =>
                this.#store && _BLOB_PART.test(partHeader)
                  ? `${this.#store.dir}/.spool-${crypto.randomUUID()}`
                  : undefined,
            }),
        },
        receiving.signal,
      );
    } catch (error) {
      this.#endBody(observed, mirror);
      if (error === _SHUTTING_DOWN) {
        return respondError(503, "busy", ERROR_MESSAGES.busy, "no_worker", { queue_ms: 0 });
      }
      // A body cut short (the client hung up) or framed wrongly is the request's fault: 400,
      // logged with its id, not an unhandled server error.
      if (!(error instanceof BodyReadError)) throw error;
      const message = `the request body could not be read: ${error.message}`;
      return respondError(400, "parse", message, "rejected", _invalid(message));
    } finally {
      this.#receiving.delete(receiving);
      if (inPlace) this.#largeReceives--;
    }
    if (received === null) {
      this.#endBody(observed, mirror);
      return respondError(
        413,
        "request_too_large",
        ERROR_MESSAGES.requestTooLarge,
        "rejected",
        tooLarge,
      );
    }
    const { body, digests } = received;
    const disk: { write: Promise<void> | null } = { write: null };
    let bodyEnded = false;
    const endBody = () => {
      if (!bodyEnded) this.#endBody(digests, mirror);
      bodyEnded = true;
    };
    try {
      return await this.#executeBody(body, digests, request, {
        requestId,
        respondError,
        receiveStart,
        onDiskWrite: (write) => disk.write = write,
        onBlobsResolved: endBody,
      });
    } finally {
      // A reused body buffer goes back once nothing of this request can read it.
      if (received.pooled) {
        const buffer = body.buffer as ArrayBuffer;
        if (disk.write === null) this.#bodies.give(buffer);
        else disk.write.finally(() => this.#bodies.give(buffer));
      }
      endBody();
    }
  }

  /**
   * Once a large body's blobs are resolved (or it was given up): spool files no blob took over
   * are deleted, and the shared mirror goes back to its pool if no thread can still read it (a
   * payload dropped half-way may still have updates queued: its mirror is not reused).
   */
  #endBody(digests: PartDigests | undefined, mirror: SharedArrayBuffer | undefined): void {
    if (!digests) return;
    this.#trackBackground(
      digests.discardSpooled().then((idle) => {
        if (mirror && idle) this.#mirrors.give(mirror);
      }),
    );
  }

  async #executeBody(
    body: Uint8Array,
    digests: PartDigests | undefined,
    request: Request,
    context: {
      requestId: string;
      respondError: RespondError;
      receiveStart: number;
      onDiskWrite: (write: Promise<void>) => void;
      /** The body's blobs are in the store (or refused): its spools and mirror can go. */
      onBlobsResolved: () => void;
    },
  ): Promise<Response> {
    const config = this.config;
    const { requestId, respondError, receiveStart } = context;
    const parseStart = performance.now();
    let parsed;
    try {
      const contentType = request.headers.get("content-type");
      // A large body was scanned and hashed on other threads while it arrived: the parser
      // reuses those delimiter positions and digests (anything not covered is hashed here).
      await digests?.settle();
      parsed = parseExecuteRequest(
        body,
        contentType,
        digests ? { marks: digests.marksFor(body), knownDigest: (b) => digests.lookup(b) } : {},
      );
    } catch (error) {
      if (error instanceof RequestParseError) {
        return respondError(400, "parse", error.message, "rejected", _invalid(error.message));
      }
      throw error;
    }
    const program = parsed.program;
    const storeStart = performance.now();

    let blobs;
    try {
      blobs = await resolveBlobs(program, parsed.blobs, {
        store: this.#store!,
        disk: this.#disk,
        spooled: (bytes) => digests?.spooled(bytes),
        track: (write) => {
          context.onDiskWrite(write);
          this.#background.add(write);
          write.finally(() => this.#background.delete(write));
        },
      });
    } catch (error) {
      if (error instanceof BlobRejected) {
        return respondError(400, "parse", error.message, "rejected", _invalid(error.message));
      }
      throw error;
    } finally {
      context.onBlobsResolved();
    }
    if (blobs.kind === "missing") {
      this.events.emit("INFO", "request_finished", {
        request_id: requestId,
        http_status: 200,
        finish_reason: "cache_miss",
        status: "CACHE_MISS",
        missing: blobs.missing,
      });
      return _json(200, cacheMissJson(requestId, blobs.missing), requestId);
    }

    try {
      const gpuCount = program.options.gpuCount;
      if (gpuCount !== undefined && gpuCount > distinctGpuCount(config)) {
        return respondError(
          400,
          "parse",
          "gpu_count exceeds this GPU server's configured capacity",
          "invalid_request",
          { error_kind: "parse" },
        );
      }
      const timeoutSeconds = Math.min(
        program.options.timeoutSeconds ?? config.defaultTimeoutSeconds,
        config.maxTimeoutSeconds,
      );
      const outputLimit = Math.min(
        program.options.outputLimitBytes ?? config.outputLimitBytes,
        config.maxOutputLimitBytes,
      );
      const programFile = this.events.saveProgram(requestId, parsed.programText);
      this.events.emit("INFO", "request_accepted", {
        request_id: requestId,
        request_bytes: body.length,
        timeout_seconds: timeoutSeconds,
        program: programFile,
        instructions: program.instructionCount,
        ops: program.ops,
        // As upstream: only the kinds present, and null (not {} or 0) when there are none.
        uploads: Object.keys(program.uploads).length > 0 ? program.uploads : null,
        blob_bytes: blobs.bytes || null,
        spooled_blobs: blobs.spooled,
        receive_ms: parseStart - receiveStart,
        parse_ms: storeStart - parseStart,
        store_ms: performance.now() - storeStart,
      });

      const queueStart = performance.now();
      let seat: Seat;
      try {
        seat = await this.pool!.acquire(config.workerWaitTimeoutSeconds * 1000);
      } catch (error) {
        if (error instanceof PoolBusy) {
          return respondError(503, "busy", ERROR_MESSAGES.busy, "no_worker", {
            queue_ms: performance.now() - queueStart,
          });
        }
        throw error;
      }
      const queueMs = performance.now() - queueStart;
      return await this.#runOnSeat(seat, {
        requestId,
        programText: parsed.programText,
        instructions: program.instructions,
        blobPaths: blobs.paths,
        timeoutSeconds,
        outputLimit,
        gpuCount,
        leaseFirst: program.leaseFirst,
        queueMs,
        respondError,
      });
    } finally {
      blobs.release();
    }
  }

  async #runOnSeat(
    seat: Seat,
    request: {
      requestId: string;
      programText: Uint8Array;
      instructions: InstructionSummary[];
      blobPaths: Record<string, string>;
      timeoutSeconds: number;
      outputLimit: number;
      gpuCount: number | undefined;
      leaseFirst: boolean;
      queueMs: number;
      respondError: RespondError;
    },
  ): Promise<Response> {
    const config = this.config;
    const { requestId } = request;
    const holder: LeaseHolder = { id: requestId };
    let retiring: Retiring | null = null;
    let released = false;
    // The worker's reuse hygiene when it answered first (see runProgram).
    let workerCleanup: Promise<string | null> | null = null;
    // The workspace this request runs in (its own: nothing else ever runs there).
    let workspace: string | null = null;
    const releaseSeat = () => {
      if (released) return;
      released = true;
      // The request's workspace stops existing before its answer goes out (one rename; what it
      // held is removed in the background). The pool readies the seat for its next request.
      if (workspace !== null) this.#trackBackground(seat.workspaces.retire(workspace));
      const pending = workerCleanup;
      if (pending === null) {
        this.pool!.release(seat, retiring);
        return;
      }
      // The worker answered before its reuse hygiene: the seat stays busy until it is done.
      this.pool!.releaseAfter(
        seat,
        pending.then((reason) => {
          if (reason !== null && !retiring) retiring = { oldExit: Promise.resolve(), reason };
          return retiring;
        }),
      );
    };
    // The worker answered something that cannot be trusted: 500 engine.
    const answerInvalid = () => {
      releaseSeat();
      return request.respondError(
        500,
        "engine",
        ERROR_MESSAGES.invalidWorkerResponse,
        "server_error",
        {
          error_kind: "invalid_worker_response",
          worker_id: seat.label,
          gpu_id: seat.gpus[0] ?? null,
        },
      );
    };
    try {
      const paths = workerPaths({ ...this.#launchBase!, resultsDir: seat.resultsDir });
      const blobDir = paths.blobDir;
      const blobMap: Record<string, string> = {};
      for (const sha of Object.keys(request.blobPaths)) blobMap[sha] = `${blobDir}/${sha}`;
      workspace = seat.workspaces.current;

      let child: WorkerChild = seat.child!;
      let gpus: readonly number[] = seat.gpus;
      let extraHeldMs = 0;
      let timeoutMs = request.timeoutSeconds * 1000;
      let transient: { child: WorkerChild; slot: Slot | null } | null = null;
      this.events.emit("INFO", "request_routed", {
        request_id: requestId,
        worker_id: seat.label,
        gpu_id: seat.gpus[0] ?? null,
        gpu_ids: null,
        generation: seat.generation,
        pid: child.pid,
        queue_ms: request.queueMs,
      });
      const started = performance.now();
      let setWaitMs = 0;
      if (request.gpuCount !== undefined && this.#leases) {
        // A dedicated child that sees the whole GPU set, initialized while the set is held.
        const granted = await this.#leases.acquireCount(holder, request.gpuCount);
        setWaitMs = granted.waitMs;
        gpus = granted.gpus;
        const initStart = performance.now();
        try {
          transient = await this.#transientChild(seat, gpus);
        } catch (error) {
          this.#leases.release(holder);
          throw error;
        }
        // Keep holding the set: releasing it before the program's first GPU step would let
        // single-GPU requests queued behind the set slip in (starving the set).
        extraHeldMs = performance.now() - initStart;
        timeoutMs -= extraHeldMs;
        child = transient.child;
        if (timeoutMs <= 0) {
          this.#leases.release(holder);
          await this.#disposeTransient(transient, gpus, holder);
          return request.respondError(504, "timeout", ERROR_MESSAGES.initTimeout, "timeout", {
            worker_id: seat.label,
            gpu_id: gpus[0] ?? null,
            queue_ms: request.queueMs,
            elapsed_ms: performance.now() - started,
            timeout_seconds: request.timeoutSeconds,
            output_tail: null,
          });
        }
      }

      // This request's own lines on the slot's stderr (where output goes when capture is off).
      const stderrMark = child.slot.stderrSeen;
      const run: RunResult = await runProgram({
        child,
        leases: this.#leases,
        gpus,
        holder,
        timeoutMs,
        leaseHeld: transient !== null,
        leaseFirst: request.leaseFirst,
        graceSeconds: config.workerTerminationGraceSeconds,
        request: {
          request_id: requestId,
          program: new TextDecoder().decode(request.programText),
          blobs: blobMap,
          workspace: seat.workspaces.workerPath,
          results: paths.results,
          output_limit_bytes: request.outputLimit,
          max_return_bytes: config.maxResponseBytes,
          sandbox: this.#sandboxed,
          // Unsandboxed, a kept worker answers before its reuse hygiene (sandboxed, that
          // hygiene includes the checks that decide whether the workspace is clean).
          ...(this.#sandboxed ? {} : { reply_before_reset: true }),
        },
      });
      workerCleanup = run.cleanup;
      const elapsedMs = performance.now() - started;
      const leaseWaitMs = run.leaseWaitMs + setWaitMs;
      const leaseHeldMs = run.leaseHeldMs + extraHeldMs;
      const end = run.end;
      const gpuIds = request.gpuCount !== undefined ? [...gpus] : undefined;

      if (transient) {
        const disposal = run.teardown.then(() => this.#disposeTransient(transient!, gpus, holder));
        this.#trackBackground(disposal);
      } else if (end.kind !== "outcome" || end.retire !== null) {
        retiring = {
          oldExit: Promise.all([child.exited, run.teardown]),
          // The teardown (under the lease) began when the run ended, not after the seat's
          // directories are emptied: worker_exited's teardown_ms counts from here.
          since: performance.now(),
          reason: end.kind === "outcome"
            ? end.retire!
            : end.kind === "timeout"
            ? "timeout"
            : end.kind === "crashed"
            ? "crashed"
            : "invalid_response",
        };
      }

      const worker = { worker_id: seat.label, gpu_id: gpus[0] ?? null };

      if (end.kind === "timeout") {
        // Its last output, read before the results directory is emptied (for the log only).
        const timeoutTail = await outputTail(seat.resultsDir, child.slot.stderrTail(stderrMark));
        releaseSeat();
        return request.respondError(504, "timeout", ERROR_MESSAGES.timeout, "timeout", {
          ...worker,
          queue_ms: request.queueMs,
          elapsed_ms: elapsedMs,
          timeout_seconds: request.timeoutSeconds,
          output_tail: timeoutTail || null,
        });
      }
      if (end.kind === "invalid") {
        return answerInvalid();
      }
      if (end.kind === "crashed") {
        const crashTail = await outputTail(seat.resultsDir, child.slot.stderrTail(stderrMark));
        releaseSeat();
        const exitcode = end.exit.code ?? (end.exit.signal !== null ? -end.exit.signal : null);
        const index = end.instructionIndex;
        if (index === null || index < 0 || index >= request.instructions.length) {
          return request.respondError(500, "engine", ERROR_MESSAGES.workerCrashed, "crashed", {
            ...worker,
            exitcode,
            queue_ms: request.queueMs,
            elapsed_ms: elapsedMs,
            output_tail: crashTail || null,
          });
        }
        const { op, id } = request.instructions[index];
        const error = {
          kind: "runtime",
          message: "worker exited while executing the instruction",
          instruction_index: end.instructionIndex,
          instruction_op: op,
          instruction_id: id,
          traceback: "",
        };
        const json = resultJson({
          status: "FAILED",
          requestId,
          queueMs: request.queueMs,
          elapsedMs,
          leaseWaitMs,
          leaseHeldMs,
          stdout: "",
          stderr: "",
          stdoutTruncated: false,
          stderrTruncated: false,
          gpuIds,
          resultsJson: "{}",
          errorJson: JSON.stringify(error),
        });
        this.events.emit("ERROR", "request_finished", {
          request_id: requestId,
          http_status: 200,
          finish_reason: "crashed",
          exitcode,
          output_tail: crashTail || null,
          status: "FAILED",
          ...worker,
          error_kind: "runtime",
          error_message: error.message,
          instruction_index: index,
          instruction_op: op,
          instruction_id: id,
          queue_ms: request.queueMs,
          elapsed_ms: elapsedMs,
          lease_wait_ms: leaseWaitMs,
          lease_held_ms: leaseHeldMs,
          response_bytes: _encoder.encode(json).length,
        });
        return _json(200, json, requestId);
      }

      const outcome = _hostPaths(end.outcome, paths.results, seat.resultsDir);
      let interferedRequestId: string | null = null;
      if (outcome.error?.kind === "gpu_access" && this.#leases) {
        const detected = outcome.gpu_access?.detected_at_ns ?? outcome.error.detected_at_ns;
        if (typeof detected === "number") {
          const at = detected / 1e6 + (child.slot.hello?.clockOffsetMs ?? 0);
          interferedRequestId = this.#leases.holderAt(gpus, at, holder);
        }
        this.events.emit("WARNING", "gpu_access_violation", {
          request_id: requestId,
          worker_id: seat.label,
          gpu_id: gpus[0] ?? null,
          instruction_id: outcome.error.instruction_id ?? null,
          cuda_call: outcome.error.cuda_call ?? outcome.gpu_access?.cuda_call ?? null,
          location: outcome.error.location ?? outcome.gpu_access?.location ?? null,
          interfered_request_id: interferedRequestId,
        });
      }
      const tooLarge = (bytes: number) =>
        request.respondError(
          500,
          "response_too_large",
          ERROR_MESSAGES.responseTooLarge,
          "server_error",
          {
            error_kind: "response_too_large",
            response_bytes: bytes,
            ...worker,
            queue_ms: request.queueMs,
            elapsed_ms: elapsedMs,
            lease_held_ms: leaseHeldMs,
          },
        );
      if (typeof outcome.too_large === "number") {
        // The worker kept an answer over the limit to itself (it would only cost a frame).
        releaseSeat();
        return tooLarge(outcome.too_large);
      }
      const built = await buildResponse(
        outcome,
        {
          requestId,
          queueMs: request.queueMs,
          elapsedMs,
          leaseWaitMs,
          leaseHeldMs,
          gpuIds,
          interferedRequestId,
        },
        request.outputLimit,
        config.maxResponseBytes,
        `${this.#runtimeDir}/responses/${requestId}-${this.#responseSeq++}`,
      );
      releaseSeat();
      if (built.kind === "too_large") return tooLarge(built.bytes);
      const error = outcome.error ?? {};
      this.events.emit("INFO", "request_finished", {
        request_id: requestId,
        http_status: 200,
        finish_reason: outcome.status === "COMPLETED" ? "completed" : "program_failed",
        exitcode: null,
        output_tail: null,
        status: outcome.status,
        ...worker,
        error_kind: error.kind ?? null,
        error_message: typeof error.message === "string" && error.message !== ""
          ? error.message.slice(0, 2048)
          : null,
        instruction_index: error.instruction_index ?? null,
        instruction_op: error.instruction_op ?? null,
        instruction_id: error.instruction_id ?? null,
        queue_ms: request.queueMs,
        elapsed_ms: elapsedMs,
        lease_wait_ms: leaseWaitMs,
        lease_held_ms: leaseHeldMs,
        response_bytes: built.bytes,
      });
      return new Response(built.body, {
        status: 200,
        headers: {
          "content-type": built.contentType,
          "content-length": String(built.bytes),
          "x-request-id": requestId,
        },
      });
    } catch (error) {
      if (error instanceof WorkerFileError) {
        // The program tampered with its result files: never trust this worker again.
        if (!released && seat.child && !retiring) {
          retiring = {
            oldExit: seat.child.kill(config.workerTerminationGraceSeconds),
            reason: "invalid_response",
          };
        }
        return answerInvalid();
      }
      if (!released && seat.child && !retiring) {
        retiring = {
          oldExit: seat.child.kill(config.workerTerminationGraceSeconds),
          reason: "crashed",
        };
      }
      releaseSeat();
      return request.respondError(
        500,
        "engine",
        ERROR_MESSAGES.internal,
        "server_error",
        _unhandledFields(error),
      );
    } finally {
      releaseSeat();
    }
  }

  async #transientChild(
    seat: Seat,
    gpus: readonly number[],
  ): Promise<{ child: WorkerChild; slot: Slot | null }> {
    let slot: Slot | null = null;
    let parent = seat.slot!;
    if (this.#sandboxed) {
      // The seat's sandbox exposes only its own GPU; a set needs a sandbox with all its nodes.
      slot = await Slot.start(`${seat.label}+set`, slotCommand(this.#launchFor(seat, gpus)));
      parent = slot;
    }
    try {
      const { env, unset } = this.#childEnv(gpus);
      const child = await parent.fork({ env, unset, maxRequests: 1 });
      await child.init();
      return { child, slot };
    } catch (error) {
      await slot?.stop(1000);
      throw error;
    }
  }

  async #disposeTransient(
    transient: { child: WorkerChild; slot: Slot | null },
    gpus: readonly number[],
    holder: LeaseHolder,
  ): Promise<void> {
    if (!transient.child.exit && this.#leases) {
      await this.#leases.acquire(holder, gpus);
      try {
        await transient.child.kill(this.config.workerTerminationGraceSeconds);
      } finally {
        this.#leases.release(holder);
      }
    }
    await transient.slot?.stop(1000);
  }

  #trackBackground(task: Promise<void>): void {
    const tracked = task.catch(() => {});
    this.#background.add(tracked);
    tracked.finally(() => this.#background.delete(tracked));
  }
}

/** Rewrites the worker's result paths (as seen inside its sandbox) to host paths. */
function _hostPaths(outcome: WorkerOutcome, workerDir: string, hostDir: string): WorkerOutcome {
  const map = <T extends { path: string }>(file: T): T => {
    const name = file.path.slice(workerDir.length + 1);
    if (!file.path.startsWith(workerDir + "/") || name === "" || name.includes("/")) {
      throw new WorkerFileError(`worker result path outside its results directory: ${file.path}`);
    }
    return { ...file, path: hostDir + file.path.slice(workerDir.length) };
  };
  return {
    ...outcome,
    parts: (outcome.parts ?? []).map(map),
    stdout: outcome.stdout ? map(outcome.stdout) : null,
    stderr: outcome.stderr ? map(outcome.stderr) : null,
    ...(outcome.results_file ? { results_file: map(outcome.results_file) } : {}),
  };
}

/** How an ERROR response is made: the body's kind and message, the event's reason and fields. */
type RespondError = (
  status: number,
  kind: string,
  message: string,
  reason: string,
  fields: Record<string, unknown>,
) => Response;

/** The event fields of a request rejected as invalid (400): upstream's `invalid_request`. */
function _invalid(message: string): Record<string, unknown> {
  return { error_kind: "invalid_request", error_message: message.slice(0, 2048) };
}

/** The event fields of an unexpected front-end error (500 `engine` on the wire). */
function _unhandledFields(error: unknown): Record<string, unknown> {
  const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return {
    error_kind: "unhandled",
    error_message: message.slice(0, 2048),
    traceback: error instanceof Error ? (error.stack ?? "").slice(-8192) : "",
  };
}

const _encoder = new TextEncoder();

function _requestId(headers: Headers): string {
  // Headers joins repeated values with ", ", so a single canonical UUID means one header.
  const value = headers.get("x-request-id");
  if (value !== null && _UUID.test(value)) return value;
  return crypto.randomUUID();
}

async function _blobDir(runtimeDir: string): Promise<string> {
  try {
    const info = await Deno.stat("/dev/shm");
    if (info.isDirectory) {
      const dir = await Deno.makeTempDir({ dir: "/dev/shm", prefix: "kcoral-blobs-" });
      await Deno.chmod(dir, 0o755);
      return dir;
    }
  } catch {
    // no usable tmpfs
  }
  return `${runtimeDir}/blobs`;
}

const _BLOB_PART = /name="blob:[0-9a-f]{64}"/;

function _json(status: number, body: string, requestId?: string): Response {
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (requestId) headers["x-request-id"] = requestId;
  return new Response(body, { status, headers });
}

function _methodNotAllowed(allow: string): Response {
  return new Response('{"detail":"Method Not Allowed"}', {
    status: 405,
    headers: { "content-type": "application/json", allow },
  });
}

/** The client's host (upstream logs `request.client.host`, without the port). */
function _peerHost(info: Deno.ServeHandlerInfo): string | null {
  const addr = info.remoteAddr as Deno.NetAddr;
  return addr && "hostname" in addr ? addr.hostname : null;
}

function _isLoopback(info?: Deno.ServeHandlerInfo): boolean {
  const addr = info?.remoteAddr as Deno.NetAddr | undefined;
  if (!addr || !("hostname" in addr)) return false;
  return addr.hostname === "::1" || addr.hostname.startsWith("127.") ||
    addr.hostname === "::ffff:127.0.0.1";
}

function _pythonIsoNow(): string {
  return new Date().toISOString().replace(/\.(\d{3})Z$/, ".$1000Z");
}

function _describeConfig(config: ServerConfig): Record<string, unknown> {
  return { ...config };
}

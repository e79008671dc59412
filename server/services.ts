/**
 * Startup: the one place where a server's parts are made and wired together (caches, intake's
 * buffers and hashing threads, the worker launch, GPU leases, the worker pool) and taken down
 * again. The stages of `/execute` run over the {@linkcode Services} made here.
 *
 * @module
 */
import { HashThreads } from "../protocol/hash_threads.ts";
import { Background } from "../http/background.ts";
import { BodyBuffers } from "../http/body_buffers.ts";
import type { EventLog } from "../http/events.ts";
import { IdleRelease } from "../http/idle_release.ts";
import type { InFlight } from "../http/in_flight.ts";
import type { AdmissionServices } from "./execute/admission.ts";
import { DiskFileCache } from "./cache/cache_disk.ts";
import { collectGarbage } from "./collect_garbage.ts";
import { BlobStore } from "./cache/cache_memory.ts";
import type { ServerConfig } from "./config.ts";
import { detectDevices, simulatedDevices } from "./workers/devices.ts";
import { buildGateLibrary } from "./workers/gate_library.ts";
import type { DispatchServices } from "./execute/dispatch.ts";
import { Intake } from "./execute/intake.ts";
import { WorkerLaunch } from "./workers/launch.ts";
import { GpuLeases } from "./workers/lease.ts";
import { WorkerPool } from "./workers/pool.ts";
import { runtimePythonPath } from "./runtime/runtime_files.ts";
import { pythonInfo } from "./workers/python_info.ts";

/** Large-body receive buffers and mirrors up to this size are pooled (two of each). */
const _POOLED_BODY_BYTES = 256 * 1024 * 1024;
/** This long after the last large body, with nothing in flight, large-body memory is given back. */
const _IDLE_RELEASE_MS = 10_000;

/** A running server's parts. */
export interface Services extends AdmissionServices, DispatchServices {
  /** Requests in flight (a stop drains them). */
  readonly inFlight: InFlight;
  /** The server's private directory (`$TMPDIR/kcoral-<random>`), removed when it stops. */
  readonly runtimeDir: string;
  /** The memory cache (tensors, bytes, libraries). */
  readonly store: BlobStore;
  /** The body reader. */
  readonly intake: Intake;
  /** Threads hashing and spooling large bodies as they arrive. */
  readonly hashes: HashThreads;
  /** Reused buffers for large bodies. */
  readonly bodies: BodyBuffers<ArrayBuffer>;
  /** Reused shared copies of large bodies, read by the hashing threads. */
  readonly mirrors: BodyBuffers<SharedArrayBuffer>;
  /** Work left running after answers. */
  readonly background: Background;
  /** Gives the memory of large bodies back once the server is idle. */
  readonly idleRelease: IdleRelease;
}

/** What startup takes besides the configuration. */
export interface StartupOptions {
  /** The environment workers start with, whose `PATH` finds `bwrap` (default: this process's). */
  env?: Record<string, string>;
}

/**
 * Makes and starts every part of a server for `config`; its workers are ready on return. On
 * failure whatever was made is taken down again and the error thrown.
 */
export async function startServices(
  config: ServerConfig,
  events: EventLog,
  inFlight: InFlight,
  options: StartupOptions = {},
): Promise<Services> {
  const background = new Background();
  // Threads hashing and spooling large bodies: two per blob payload, for up to four at once.
  const hashes = new HashThreads(
    Math.max(1, Math.min(8, (navigator.hardwareConcurrency ?? 2) - 1)),
  );
  const idleRelease = new IdleRelease({
    afterMs: _IDLE_RELEASE_MS,
    busy: () => inFlight.count > 0,
    release: () => {
      bodies.clear();
      mirrors.clear();
      hashes.rest();
      collectGarbage();
    },
  });
  const onUse = () => idleRelease.touch();
  const bodies = new BodyBuffers(2, _POOLED_BODY_BYTES, (size) => new ArrayBuffer(size), { onUse });
  const mirrors = new BodyBuffers(2, _POOLED_BODY_BYTES, (size) => new SharedArrayBuffer(size), {
    onUse,
  });
  const disk = new DiskFileCache(config.diskCacheDir, config.diskCacheCapacityMbytes * 1024 * 1024);
  let runtimeDir = "";
  let store: BlobStore | null = null;
  let pool: WorkerPool | null = null;
  try {
    runtimeDir = await Deno.makeTempDir({ prefix: "kcoral-" });
    store = new BlobStore(await _blobDir(runtimeDir), config.cacheCapacityBytes);
    await disk.prepare();
    const python = await pythonInfo(config.python, options.env);
    const runtimePath = await runtimePythonPath();
    const gpuMode = config.device === "gpu";
    const devices = !gpuMode
      ? []
      : config.simulateGpus
      ? simulatedDevices(config.gpus)
      : await detectDevices(config.gpus, python.executable, runtimePath);
    const env = { ...(options.env ?? Deno.env.toObject()) };
    if (gpuMode) delete env.CUDA_VISIBLE_DEVICES;
    const gate = gpuMode && config.gpuGate
      ? await buildGateLibrary(python.executable, runtimePath, `${runtimeDir}/gate`, env)
      : null;
    if (gate?.error) {
      const message = `the GPU gate could not be built; every run holds the GPU lease for its ` +
        `whole life: ${gate.error}`;
      events.emit("WARNING", "gpu_gate_unavailable", { error: gate.error, message });
      if (!config.logConsole) console.error(`kcoral: warning: ${message}`);
    }
    const launch = new WorkerLaunch(config, {
      python,
      runtimePath,
      blobDir: store.dir,
      env,
      devices,
      gateLibrary: gate?.path ?? null,
    });
    if (config.sandbox === "bubblewrap") await launch.probe(`${runtimeDir}/probe`, events);
    const leases = gpuMode ? new GpuLeases(devices.map((d) => d.index)) : null;
    const seats = gpuMode
      ? devices.flatMap((device) =>
        Array.from({ length: config.workersPerGpu }, (_, i) => ({
          label: `gpu${device.index}/w${i}`,
          gpus: [device.index],
        }))
      )
      : Array.from({ length: config.numWorkers }, (_, i) => ({ label: `cpu/w${i}`, gpus: [] }));
    pool = new WorkerPool({
      seats,
      runtimeDir,
      sandboxed: launch.sandboxed,
      leases,
      slotCommand: (seat) => launch.slotCommand(seat, seat.gpus),
      childEnv: (seat) => launch.childEnv(seat.gpus),
      maxRequestsPerWorker: config.maxRequestsPerWorker,
      events,
    });
    await pool.start();
    events.emit("INFO", "pool_ready", {
      sandbox: launch.sandbox,
      mode: gpuMode ? (config.simulateGpus ? "simulated-gpu" : "gpu") : "cpu",
      target: pool.target,
      versions: pool.versions,
      workers: pool.seats.length,
    });
    const track = (task: Promise<unknown>) => background.track(task);
    let responses = 0;
    return {
      config,
      events,
      inFlight,
      runtimeDir,
      store,
      caches: { store, disk, track },
      intake: new Intake({
        maxRequestBytes: config.maxRequestBytes,
        hashes,
        bodies,
        mirrors,
        store,
        track,
      }),
      hashes,
      bodies,
      mirrors,
      pool,
      leases,
      launch,
      stagingDir: (requestId) => `${runtimeDir}/responses/${requestId}-${responses++}`,
      track,
      background,
      idleRelease,
    };
  } catch (error) {
    await stopServices({
      config,
      pool,
      background,
      store,
      hashes,
      bodies,
      mirrors,
      idleRelease,
      runtimeDir,
    });
    throw error;
  }
}

/** Stops what exists of a server (after its requests): workers, background, caches, threads. */
export async function stopServices(parts: {
  config: ServerConfig;
  pool: WorkerPool | null;
  background: Background;
  store: BlobStore | null;
  hashes: HashThreads;
  bodies: BodyBuffers<ArrayBuffer>;
  mirrors: BodyBuffers<SharedArrayBuffer>;
  idleRelease: IdleRelease;
  runtimeDir: string;
}): Promise<void> {
  await parts.pool?.close(parts.config.workerTerminationGraceSeconds * 1000);
  await parts.background.settled();
  parts.store?.close();
  parts.idleRelease.close();
  parts.hashes.close();
  parts.bodies.clear();
  parts.mirrors.clear();
  if (parts.runtimeDir) await Deno.remove(parts.runtimeDir, { recursive: true }).catch(() => {});
}

/** The memory cache's directory: on `/dev/shm` (RAM) when it is a usable tmpfs. */
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

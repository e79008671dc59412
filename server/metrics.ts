/**
 * The server's Prometheus metrics (`GET /metrics`, text exposition format, through the
 * `prom-client` library). Nothing here runs on the measured path: counters and histograms move
 * when the event log records what happened (one listener on {@linkcode EventLog}), and the
 * gauges (workers, queue, caches) are read from the running parts when scraped.
 *
 * ```
 *  request_received ┐
 *  request_finished ┴▶ kcoral_request_duration_seconds{gpu} (received → answer ready)
 *  request_finished ─▶ kcoral_requests_total{code,finish_reason,error_kind}
 *                      kcoral_request_queue_seconds / lease_wait / lease_held {gpu}
 *                      kcoral_response_bytes_total
 *  request_accepted ─▶ kcoral_request_bytes_total
 *  worker_retired   ─▶ kcoral_worker_replacements_total{reason}
 *  worker_ready     ─▶ kcoral_worker_replacement_seconds (retired → ready again)
 *                      kcoral_workers_ready_total{context} (created, deferred, none on CPU)
 *  connection_cut   ─▶ kcoral_connections_cut_total{reason} (timeouts, malformed, over the bound)
 *  scrape           ─▶ kcoral_requests_in_flight, kcoral_requests_queued, kcoral_workers{device,state},
 *                      kcoral_cache_{hits,misses,evictions}_total{cache}, kcoral_cache_bytes{cache},
 *                      kcoral_request_capacity, kcoral_cache_capacity_bytes{cache},
 *                      kcoral_build_info{version,deno,torch,cuda}, process_* (prom-client)
 * ```
 *
 * Label values are bounded: status codes, finish reasons and error kinds of the protocol, GPU
 * ids of the configuration, worker states; never request ids or paths.
 *
 * @module
 */
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { EventLog } from "../http/events.ts";
import { DURATION_BUCKETS, registerProcessMetrics } from "../http/metrics_response.ts";
import type { BlobStore } from "./cache/cache_memory.ts";
import type { DiskFileCache } from "./cache/cache_disk.ts";
import type { WorkerPool } from "./workers/pool.ts";

/** The running parts the gauges read (absent before the server has started). */
export interface MetricSources {
  /** The worker pool. */
  pool: WorkerPool;
  /** The memory cache. */
  store: BlobStore;
  /** The disk cache. */
  disk: DiskFileCache;
}

/** Requests received and not yet finished that the duration histogram keeps a start time for. */
const _OPEN_REQUESTS_KEPT = 65_536;

function _text(value: unknown, fallback: string): string {
  return typeof value === "string" && value !== "" ? value : fallback;
}

function _gpu(value: unknown): string {
  return typeof value === "number" ? String(value) : "cpu";
}

/**
 * A server's metrics: its own registry (several servers may share a process), fed by its event
 * log and read from `sources()` when scraped.
 *
 * @example
 * ```ts
 * import { EventLog } from "../http/events.ts";
 * import { ServerMetrics } from "./metrics.ts";
 *
 * const events = new EventLog({ logDir: null, console: false, programs: false });
 * const metrics = new ServerMetrics(events, () => null);
 * events.emit("INFO", "request_finished", {
 *   http_status: 200, finish_reason: "completed", error_kind: null, gpu_id: 0,
 *   queue_ms: 1.5, lease_wait_ms: 0.2, lease_held_ms: 12, response_bytes: 300,
 * });
 * const text = await metrics.render();
 * if (!text.includes('kcoral_requests_total{code="200",finish_reason="completed",error_kind="none"} 1')) {
 *   throw new Error(text);
 * }
 * if (!text.includes('kcoral_lease_held_seconds_count{gpu="0"} 1')) throw new Error(text);
 * metrics.close();
 * ```
 */
export class ServerMetrics {
  /** The registry `render` exposes. */
  readonly registry: Registry = new Registry();
  readonly #unsubscribe: () => void;
  readonly #retiredAt = new Map<string, number>();
  readonly #receivedAt = new Map<string, number>();
  readonly #duration: Histogram<"gpu">;
  readonly #requests: Counter<"code" | "finish_reason" | "error_kind">;
  readonly #queue: Histogram<"gpu">;
  readonly #leaseWait: Histogram<"gpu">;
  readonly #leaseHeld: Histogram<"gpu">;
  readonly #requestBytes: Counter;
  readonly #responseBytes: Counter;
  readonly #replacements: Counter<"reason">;
  readonly #replacementSeconds: Histogram;
  readonly #workersReady: Counter<"context">;
  readonly #connectionsCut: Counter<"reason">;

  /** Observes `events`; `sources` gives the running parts (or `null`) at scrape time. */
  constructor(events: EventLog, sources: () => MetricSources | null) {
    const registers = [this.registry];
    this.#requests = new Counter({
      name: "kcoral_requests_total",
      help: "Finished /execute requests by HTTP status, finish reason and error kind.",
      labelNames: ["code", "finish_reason", "error_kind"],
      registers,
    });
    const histogram = (name: string, help: string) =>
      new Histogram({
        name,
        help,
        labelNames: ["gpu"],
        buckets: [...DURATION_BUCKETS],
        registers,
      });
    this.#duration = histogram(
      "kcoral_request_duration_seconds",
      "Time from receiving an /execute request to its answer being ready, per GPU " +
        '(gpu="cpu" on CPU servers and for requests that never reached a worker).',
    );
    this.#queue = histogram(
      "kcoral_request_queue_seconds",
      'Time a request waited for a worker, per GPU (gpu="cpu" on CPU servers).',
    );
    this.#leaseWait = histogram(
      "kcoral_lease_wait_seconds",
      "Time a request's worker waited for the GPU lease, per GPU.",
    );
    this.#leaseHeld = histogram(
      "kcoral_lease_held_seconds",
      "Time a request held the GPU lease (its measured run), per GPU.",
    );
    this.#requestBytes = new Counter({
      name: "kcoral_request_bytes_total",
      help: "Bytes of accepted /execute request bodies.",
      registers,
    });
    this.#responseBytes = new Counter({
      name: "kcoral_response_bytes_total",
      help: "Bytes of /execute response bodies.",
      registers,
    });
    this.#replacements = new Counter({
      name: "kcoral_worker_replacements_total",
      help: "Workers retired and replaced, by reason.",
      labelNames: ["reason"],
      registers,
    });
    this.#connectionsCut = new Counter({
      name: "kcoral_connections_cut_total",
      help: "Connections cut or refused: header_timeout, body_timeout, malformed_request, " +
        "too_many_connections.",
      labelNames: ["reason"],
      registers,
    });
    this.#replacementSeconds = new Histogram({
      name: "kcoral_worker_replacement_seconds",
      help: "Time from a worker's retirement to its replacement being ready.",
      buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
    this.#workersReady = new Counter({
      name: "kcoral_workers_ready_total",
      help: "Workers that became ready, by context: created (at initialization, under the " +
        "lease), deferred (to the first instruction that takes the lease), none (CPU).",
      labelNames: ["context"],
      registers,
    });
    new Gauge({
      name: "kcoral_requests_in_flight",
      help: "Requests holding a worker.",
      registers,
      collect() {
        this.set(sources()?.pool.load().requests_in_progress ?? 0);
      },
    });
    new Gauge({
      name: "kcoral_requests_queued",
      help: "Requests waiting for a worker.",
      registers,
      collect() {
        this.set(sources()?.pool.load().requests_waiting ?? 0);
      },
    });
    new Gauge({
      name: "kcoral_workers",
      help: "Worker seats by device and state (starting, idle, busy, replacing, broken).",
      labelNames: ["device", "state"],
      registers,
      collect() {
        this.reset();
        for (const seat of sources()?.pool.seats ?? []) {
          this.inc({ device: seat.gpus.length > 0 ? "gpu" : "cpu", state: seat.state });
        }
      },
    });
    const caches = (pick: (c: { hits: number; misses: number; evictions: number }) => number) =>
      function (this: Counter<"cache">) {
        const s = sources();
        this.reset();
        if (!s) return;
        this.inc({ cache: "memory" }, pick(s.store.counters));
        this.inc({ cache: "disk" }, pick(s.disk.counters));
      };
    new Counter({
      name: "kcoral_cache_hits_total",
      help: "Blob lookups found in the memory cache or the disk file cache.",
      labelNames: ["cache"],
      registers,
      collect: caches((c) => c.hits),
    });
    new Counter({
      name: "kcoral_cache_misses_total",
      help: "Blob lookups not found (the client is asked to send them).",
      labelNames: ["cache"],
      registers,
      collect: caches((c) => c.misses),
    });
    new Counter({
      name: "kcoral_cache_evictions_total",
      help: "Objects evicted to keep a cache within its capacity.",
      labelNames: ["cache"],
      registers,
      collect: caches((c) => c.evictions),
    });
    new Gauge({
      name: "kcoral_cache_bytes",
      help: "Bytes a cache holds (memory: retained blobs; disk: as of its last write batch).",
      labelNames: ["cache"],
      registers,
      collect() {
        const s = sources();
        this.set({ cache: "memory" }, s?.store.retainedBytes ?? 0);
        this.set({ cache: "disk" }, s?.disk.bytes ?? 0);
      },
    });
    new Gauge({
      name: "kcoral_request_capacity",
      help: "Requests the server can run at once (worker seats not being replaced).",
      registers,
      collect() {
        this.set(sources()?.pool.load().request_capacity ?? 0);
      },
    });
    new Gauge({
      name: "kcoral_cache_capacity_bytes",
      help: "The capacity of a cache in bytes (0: disabled), beside kcoral_cache_bytes.",
      labelNames: ["cache"],
      registers,
      collect() {
        const s = sources();
        this.set({ cache: "memory" }, s?.store.capacityBytes ?? 0);
        this.set({ cache: "disk" }, s?.disk.enabled ? s.disk.capacityBytes : 0);
      },
    });
    // torch and CUDA as the first worker reported them (empty on a CPU server).
    registerProcessMetrics(this.registry, () => sources()?.pool.versions ?? {}, ["torch", "cuda"]);
    this.#unsubscribe = events.subscribe((record) => this.#observe(record));
  }

  #observe(record: Record<string, unknown>): void {
    switch (record.event) {
      case "request_received":
        if (this.#receivedAt.size >= _OPEN_REQUESTS_KEPT) {
          this.#receivedAt.delete(this.#receivedAt.keys().next().value!);
        }
        this.#receivedAt.set(String(record.request_id), performance.now());
        return;
      case "request_finished": {
        const id = String(record.request_id);
        const received = this.#receivedAt.get(id);
        if (received !== undefined) {
          this.#receivedAt.delete(id);
          this.#duration.observe(
            { gpu: _gpu(record.gpu_id) },
            (performance.now() - received) / 1000,
          );
        }
        this.#requests.inc({
          code: String(record.http_status ?? 0),
          finish_reason: _text(record.finish_reason, "unknown"),
          error_kind: _text(record.error_kind, "none"),
        });
        if (typeof record.response_bytes === "number") {
          this.#responseBytes.inc(record.response_bytes);
        }
        const gpu = { gpu: _gpu(record.gpu_id) };
        const seconds = (value: unknown) => typeof value === "number" ? value / 1000 : null;
        const queue = seconds(record.queue_ms);
        const wait = seconds(record.lease_wait_ms);
        const held = seconds(record.lease_held_ms);
        if (queue !== null) this.#queue.observe(gpu, queue);
        if (wait !== null) this.#leaseWait.observe(gpu, wait);
        if (held !== null) this.#leaseHeld.observe(gpu, held);
        return;
      }
      case "request_accepted":
        if (typeof record.request_bytes === "number") this.#requestBytes.inc(record.request_bytes);
        return;
      case "worker_retired":
        this.#replacements.inc({ reason: _text(record.reason, "unknown") });
        this.#retiredAt.set(String(record.worker_id), performance.now());
        return;
      case "connection_cut":
        this.#connectionsCut.inc({ reason: _text(record.reason, "unknown") });
        return;
      case "worker_ready": {
        this.#workersReady.inc({ context: _text(record.context, "none") });
        const id = String(record.worker_id);
        const since = this.#retiredAt.get(id);
        if (since !== undefined) {
          this.#retiredAt.delete(id);
          this.#replacementSeconds.observe((performance.now() - since) / 1000);
        }
        return;
      }
    }
  }

  /**
   * The exposition text.
   *
   * @example
   * ```ts
   * import { EventLog } from "../http/events.ts";
   * import { ServerMetrics } from "./metrics.ts";
   *
   * const metrics = new ServerMetrics(
   *   new EventLog({ logDir: null, console: false, programs: false }),
   *   () => null,
   * );
   * if (!(await metrics.render()).includes("# TYPE kcoral_workers gauge")) throw new Error();
   * metrics.close();
   * ```
   */
  render(): Promise<string> {
    return this.registry.metrics();
  }

  /** Stops observing the event log. */
  close(): void {
    this.#unsubscribe();
  }
}

/**
 * The server's Prometheus metrics (`GET /metrics`, through `prom-client`). Nothing here runs on
 * the measured path: counters and histograms move when the event log records what happened, and
 * gauges (workers, queue, caches) are read from the running parts when scraped. Label values are
 * bounded (status codes, finish reasons, error kinds, GPU ids, worker states; never request ids).
 *
 * @module
 */
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { EventLog } from "../http/events.ts";
import { DURATION_BUCKETS, registerProcessMetrics } from "../http/metrics_response.ts";
import type { CacheCounters } from "./cache/cache_counters.ts";
import type { StatusSources } from "./status.ts";

/** Requests received and not yet finished that the duration histogram keeps a start time for. */
const _OPEN_REQUESTS_KEPT = 65_536;

function _text(value: unknown, fallback: string): string {
  return typeof value === "string" && value !== "" ? value : fallback;
}

function _gpu(value: unknown): string {
  return typeof value === "number" ? String(value) : "cpu";
}

/** A server's metrics: its own registry, fed by its event log and read from `sources()`. */
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
  constructor(events: EventLog, sources: () => StatusSources | null) {
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
    const loadGauge = (
      name: string,
      help: string,
      key: "requests_in_progress" | "requests_waiting" | "request_capacity",
    ) =>
      new Gauge({
        name,
        help,
        registers,
        collect() {
          this.set(sources()?.pool.load()[key] ?? 0);
        },
      });
    loadGauge("kcoral_requests_in_flight", "Requests holding a worker.", "requests_in_progress");
    loadGauge("kcoral_requests_queued", "Requests waiting for a worker.", "requests_waiting");
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
    const caches = (pick: (c: CacheCounters) => number) =>
      function (this: Counter<"cache">) {
        const s = sources();
        this.reset();
        if (!s) return;
        this.inc({ cache: "memory" }, pick(s.store.counters));
        this.inc({ cache: "disk" }, pick(s.disk.counters));
      };
    const cacheCounter = (name: string, help: string, pick: (c: CacheCounters) => number) =>
      new Counter({ name, help, labelNames: ["cache"], registers, collect: caches(pick) });
    cacheCounter(
      "kcoral_cache_hits_total",
      "Blob lookups found in the memory cache or the disk file cache.",
      (c) => c.hits,
    );
    cacheCounter(
      "kcoral_cache_misses_total",
      "Blob lookups not found (the client is asked to send them).",
      (c) => c.misses,
    );
    cacheCounter(
      "kcoral_cache_evictions_total",
      "Objects evicted to keep a cache within its capacity.",
      (c) => c.evictions,
    );
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
    loadGauge(
      "kcoral_request_capacity",
      "Requests the server can run at once (worker seats not being replaced).",
      "request_capacity",
    );
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

  /** The exposition text. */
  render(): Promise<string> {
    return this.registry.metrics();
  }

  /** Stops observing the event log. */
  close(): void {
    this.#unsubscribe();
  }
}

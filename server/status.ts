/**
 * What the server's status page shows (`GET /status`, data at `/status/data`): per GPU the lease
 * holder and recent holds, the queue, the workers, the recent requests with their timings, and
 * the caches. Nothing of a program (source, outputs, error text) is included.
 *
 * @module
 */
import type { EventLog } from "../http/events.ts";
import { numberOrNull, Recent, stringOrNull } from "../http/recent.ts";
import type { HealthBody } from "../protocol/health.ts";
import type { BlobStore } from "./cache/cache_memory.ts";
import type { DiskFileCache } from "./cache/cache_disk.ts";
import type { GpuLeases, LeaseHolding } from "./workers/lease.ts";
import type { WorkerPool } from "./workers/pool.ts";
import { KCORAL_VERSION } from "../options/version.ts";

/** How far back lease holds are shown, in ms. */
const _TIMELINE_MS = 5 * 60_000;

/** One recent request on the status page. */
export interface RecentRequest {
  /** The request id. */
  request_id: string;
  /** When it finished (ISO). */
  time: string;
  /** HTTP status. */
  http_status: number | null;
  /** `completed`, `cache_miss`, `rejected`, ... */
  finish_reason: string | null;
  /** The program's status, when one ran. */
  status: string | null;
  /** The error kind, when there was one. */
  error_kind: string | null;
  /** The GPU it ran on (`null` on CPU). */
  gpu_id: number | null;
  /** Waiting for a worker, ms. */
  queue_ms: number | null;
  /** Running, ms. */
  elapsed_ms: number | null;
  /** Waiting for the GPU lease, ms. */
  lease_wait_ms: number | null;
  /** Holding the GPU lease, ms. */
  lease_held_ms: number | null;
}

/** The running parts the status page and the metrics read. */
export interface StatusSources {
  /** The worker pool. */
  pool: WorkerPool;
  /** The GPU leases (`null` on CPU servers). */
  leases: GpuLeases | null;
  /** The memory cache. */
  store: BlobStore;
  /** The disk cache. */
  disk: DiskFileCache;
}

/** The server's status: the recent requests (observed on `events`) and the live parts. */
export class ServerStatus {
  readonly #recent = new Recent<RecentRequest>(50, (r) => ({
    request_id: String(r.request_id),
    time: String(r.timestamp),
    http_status: numberOrNull(r.http_status),
    finish_reason: stringOrNull(r.finish_reason),
    status: stringOrNull(r.status),
    error_kind: stringOrNull(r.error_kind),
    gpu_id: numberOrNull(r.gpu_id),
    queue_ms: numberOrNull(r.queue_ms),
    elapsed_ms: numberOrNull(r.elapsed_ms),
    lease_wait_ms: numberOrNull(r.lease_wait_ms),
    lease_held_ms: numberOrNull(r.lease_held_ms),
  }));
  readonly #sources: () => StatusSources | null;
  readonly #unsubscribe: () => void;

  /** Observes `events`; reads `sources()` when asked. */
  constructor(events: EventLog, sources: () => StatusSources | null) {
    this.#sources = sources;
    this.#unsubscribe = events.subscribe((record) => {
      if (record.event === "request_finished") this.#recent.add(record);
    });
  }

  /** The page's data now (`health` is the server's `/health` body). */
  data(health: HealthBody): ServerStatusData {
    const s = this.#sources();
    const wall = (t: number) => performance.timeOrigin + t;
    const now = performance.now();
    const holding = (h: LeaseHolding) => ({
      id: h.holderId,
      initialization: h.initialization,
      teardown: h.teardown,
      since: wall(h.since),
    });
    const gpus = (s?.leases?.gpus ?? []).map((id) => {
      const timeline = s!.leases!.timeline(id)!;
      return {
        id,
        holder: timeline.holder && holding(timeline.holder),
        holders: timeline.holders.map(holding),
        holds: timeline.holds.filter((h) => now - h.to <= _TIMELINE_MS).map((h) => ({
          id: h.holderId,
          initialization: h.initialization,
          teardown: h.teardown,
          from: wall(h.from),
          to: wall(h.to),
        })),
      };
    });
    return {
      kind: "server",
      version: KCORAL_VERSION,
      now: wall(now),
      instance_id: health.instance_id,
      started_at: health.started_at,
      load: health.load,
      target: health.target,
      versions: health.versions,
      lease_waiting: s?.leases?.waiting ?? 0,
      gpus,
      workers: (s?.pool.seats ?? []).map((seat) => ({
        id: seat.label,
        gpus: [...seat.gpus],
        state: seat.state,
        generation: seat.generation,
      })),
      requests: this.#recent.list(),
      caches: s
        ? {
          memory: {
            bytes: s.store.retainedBytes,
            capacity: s.store.capacityBytes,
            ...s.store.counters,
          },
          disk: {
            bytes: s.disk.bytes,
            capacity: s.disk.enabled ? s.disk.capacityBytes : 0,
            ...s.disk.counters,
          },
        }
        : null,
    };
  }

  /** Stops observing the event log. */
  close(): void {
    this.#unsubscribe();
  }
}

/** One cache on the status page. */
export interface CacheUse {
  /** Bytes held. */
  bytes: number;
  /** Capacity in bytes (0: disabled). */
  capacity: number;
  /** Lookups found. */
  hits: number;
  /** Lookups not found. */
  misses: number;
  /** Objects evicted. */
  evictions: number;
}

/** The server status page's data (times in ms since the epoch). */
export interface ServerStatusData {
  /** `"server"`. */
  kind: "server";
  /** The KCoral version the server runs (`kcoral --version`). */
  version: string;
  /** The server's clock now. */
  now: number;
  /** The server's instance. */
  instance_id: string;
  /** When it started. */
  started_at: string;
  /** Capacity, in progress, waiting. */
  load: HealthBody["load"];
  /** The compilation target. */
  target: Record<string, string>;
  /** Runtime versions. */
  versions: Record<string, string>;
  /** Requests waiting for a GPU lease. */
  lease_waiting: number;
  /** Per GPU: the holder now (a request if one holds it), every holder, and recent holds. */
  gpus: {
    id: number;
    holder: { id: string; initialization: boolean; teardown: boolean; since: number } | null;
    holders: { id: string; initialization: boolean; teardown: boolean; since: number }[];
    holds: { id: string; initialization: boolean; teardown: boolean; from: number; to: number }[];
  }[];
  /** The worker seats. */
  workers: { id: string; gpus: number[]; state: string; generation: number }[];
  /** The last requests, newest first. */
  requests: RecentRequest[];
  /** The caches (`null` before start). */
  caches: { memory: CacheUse; disk: CacheUse } | null;
}

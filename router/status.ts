/**
 * What the Router's status page shows (`GET /status`, data at `GET /status/data`): its nodes
 * with state, capacity, load, connected slots and last error, the queue, and the recent
 * forwarded requests (from its `request_finished` events).
 *
 * @module
 */
import type { EventLog } from "../http/events.ts";
import { numberOrNull, Recent, stringOrNull } from "../http/recent.ts";
import type { NodeSnapshot } from "./health_views.ts";
import type { NodeRegistry } from "./registry.ts";
import { KCORAL_VERSION } from "../options/version.ts";

/** One recent forwarded request. */
export interface RoutedRequest {
  /** The Router's request id. */
  request_id: string;
  /** When it finished (ISO). */
  time: string;
  /** The node that served it (`""` when none was chosen). */
  node: string;
  /** HTTP status (0 when the client went away first). */
  http_status: number | null;
  /** Why the attempt ended. */
  finish_reason: string | null;
  /** The kind of an answer the Router made itself. */
  error_kind: string | null;
  /** Waiting for a slot, ms. */
  queue_wait_ms: number | null;
  /** The whole attempt, ms. */
  duration_ms: number | null;
}

/** The Router status page's data. */
export interface RouterStatusData {
  /** `"router"`. */
  kind: "router";
  /** The KCoral version the Router runs (`kcoral --version`). */
  version: string;
  /** The Router's clock now, ms since the epoch. */
  now: number;
  /** The Router's instance. */
  instance_id: string;
  /** When it started. */
  started_at: string;
  /** Requests running on nodes. */
  active_requests: number;
  /** Requests waiting for a slot. */
  queue_length: number;
  /** The node records. */
  nodes: NodeSnapshot[];
  /** The last requests, newest first. */
  requests: RoutedRequest[];
}

/** The Router's status: its recent requests (observed on `events`) and its registry. */
export class RouterStatus {
  readonly #recent = new Recent<RoutedRequest>(50, (r) => ({
    request_id: String(r.request_id),
    time: String(r.timestamp),
    node: String(r.node ?? ""),
    http_status: numberOrNull(r.http_status),
    finish_reason: stringOrNull(r.finish_reason),
    error_kind: stringOrNull(r.error_kind),
    queue_wait_ms: numberOrNull(r.queue_wait_ms),
    duration_ms: numberOrNull(r.duration_ms),
  }));
  readonly #registry: NodeRegistry;
  readonly #instanceId: string;
  readonly #startedAt: string;
  readonly #unsubscribe: () => void;

  /** Observes `events`; reads `registry` when asked. */
  constructor(events: EventLog, registry: NodeRegistry, instanceId: string, startedAt: string) {
    this.#registry = registry;
    this.#instanceId = instanceId;
    this.#startedAt = startedAt;
    this.#unsubscribe = events.subscribe((record) => {
      if (record.event === "request_finished") this.#recent.add(record);
    });
  }

  /** The page's data now. */
  data(): RouterStatusData {
    const snapshot = this.#registry.snapshot();
    return {
      kind: "router",
      version: KCORAL_VERSION,
      now: Date.now(),
      instance_id: this.#instanceId,
      started_at: this.#startedAt,
      active_requests: snapshot.active_requests,
      queue_length: snapshot.queue_length,
      nodes: snapshot.workers,
      requests: this.#recent.list(),
    };
  }

  /** Stops observing the event log. */
  close(): void {
    this.#unsubscribe();
  }
}

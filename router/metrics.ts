/**
 * The Router's Prometheus metrics (`GET /metrics`, text exposition format, through
 * `prom-client`). Forwarded requests are counted from the Router's `request_finished` events;
 * nodes, capacity, load and the queue are read from the registry when scraped.
 *
 * ```
 *  request_finished ─▶ kcoral_router_requests_total{code,outcome,error_kind}
 *                      kcoral_router_queue_wait_seconds, kcoral_router_request_duration_seconds
 *                      kcoral_router_request_bytes_total / response_bytes_total
 *  connection_cut   ─▶ kcoral_router_connections_cut_total{reason} (timeouts, malformed, bound)
 *  scrape           ─▶ kcoral_router_nodes{state}, kcoral_router_node_capacity{node},
 *                      kcoral_router_node_busy{node}, kcoral_router_node_available{node},
 *                      kcoral_router_queue_length, kcoral_router_requests_in_flight,
 *                      kcoral_router_capacity, kcoral_build_info{version,deno}, process_*
 * ```
 *
 * The `node` label takes the ids of the deployment's own nodes (a bounded set an operator
 * chose); no request ids or paths are labels.
 *
 * @module
 */
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { EventLog } from "../http/events.ts";
import type { NodeState } from "./node_health.ts";
import type { NodeRegistry } from "./registry.ts";
import { DURATION_BUCKETS, registerProcessMetrics } from "../http/metrics_response.ts";

const _STATES: readonly NodeState[] = [
  "starting",
  "ready",
  "recovering",
  "incompatible",
  "unhealthy",
];

/** A Router's metrics, fed by its event log and read from its registry when scraped. */
export class RouterMetrics {
  /** The registry `render` exposes. */
  readonly registry: Registry = new Registry();
  readonly #unsubscribe: () => void;
  /** Requests finished by their label values joined by NUL; given to the counter when scraped. */
  readonly #requestCounts = new Map<string, number>();
  readonly #queueWait: Histogram;
  readonly #duration: Histogram;
  readonly #requestBytes: Counter;
  readonly #responseBytes: Counter;
  readonly #connectionsCut: Counter;

  /** Observes `events`; reads `registry` when scraped. */
  constructor(events: EventLog, registry: NodeRegistry) {
    const registers = [this.registry];
    const requestCounts = this.#requestCounts;
    new Counter({
      name: "kcoral_router_requests_total",
      help: "Requests the Router finished, by HTTP status, outcome (finish reason) and the kind " +
        "of an answer the Router made itself (router_busy, no_node, server_transport, ...).",
      labelNames: ["code", "outcome", "error_kind"],
      registers,
      collect() {
        this.reset();
        for (const [key, count] of requestCounts) {
          const [code, outcome, error_kind] = key.split("\0");
          this.inc({ code, outcome, error_kind }, count);
        }
      },
    });
    this.#queueWait = new Histogram({
      name: "kcoral_router_queue_wait_seconds",
      help: "Time a request waited at the Router for a node's slot.",
      buckets: [...DURATION_BUCKETS],
      registers,
    });
    this.#duration = new Histogram({
      name: "kcoral_router_request_duration_seconds",
      help: "Time from receiving a request to finishing it (answered, refused or cut short), " +
        "queue wait included.",
      buckets: [...DURATION_BUCKETS],
      registers,
    });
    new Gauge({
      name: "kcoral_router_capacity",
      help: "Workers of the ready nodes together (the requests the Router can run at once).",
      registers,
      collect() {
        let capacity = 0;
        for (const node of registry.snapshot().workers) {
          if (node.status === "ready") capacity += node.capacity;
        }
        this.set(capacity);
      },
    });
    registerProcessMetrics(this.registry);
    this.#requestBytes = new Counter({
      name: "kcoral_router_request_bytes_total",
      help: "Request body bytes forwarded to nodes.",
      registers,
    });
    this.#responseBytes = new Counter({
      name: "kcoral_router_response_bytes_total",
      help: "Response body bytes streamed back to clients.",
      registers,
    });
    this.#connectionsCut = new Counter({
      name: "kcoral_router_connections_cut_total",
      help: "Client connections cut or refused: header_timeout, body_timeout (408), " +
        "malformed_request (400), too_many_connections (503).",
      labelNames: ["reason"],
      registers,
    });
    new Gauge({
      name: "kcoral_router_nodes",
      help: "Node records by state.",
      labelNames: ["state"],
      registers,
      collect() {
        const counts = new Map<string, number>(_STATES.map((s) => [s, 0]));
        for (const node of registry.snapshot().workers) {
          counts.set(node.status, (counts.get(node.status) ?? 0) + 1);
        }
        for (const [state, count] of counts) this.set({ state }, count);
      },
    });
    const perNode = (name: string, help: string, pick: (n: NodeSnapshotLike) => number) =>
      new Gauge({
        name,
        help,
        labelNames: ["node"],
        registers,
        collect() {
          this.reset();
          for (const node of registry.snapshot().workers) this.set({ node: node.name }, pick(node));
        },
      });
    perNode(
      "kcoral_router_node_capacity",
      "Workers of a node (its last healthy report).",
      (n) => n.capacity,
    );
    perNode(
      "kcoral_router_node_busy",
      "Requests running on a node through this Router.",
      (n) => n.in_flight,
    );
    perNode(
      "kcoral_router_node_available",
      "Idle slots a node can take requests on now.",
      (n) => n.available_capacity,
    );
    new Gauge({
      name: "kcoral_router_queue_length",
      help: "Requests waiting for a slot.",
      registers,
      collect() {
        this.set(registry.snapshot().queue_length);
      },
    });
    new Gauge({
      name: "kcoral_router_requests_in_flight",
      help: "Requests running on nodes, all nodes together.",
      registers,
      collect() {
        this.set(registry.snapshot().active_requests);
      },
    });
    this.#unsubscribe = events.subscribe((record) => this.#observe(record));
  }

  #observe(record: Record<string, unknown>): void {
    if (record.event === "connection_cut") {
      this.#connectionsCut.inc({
        reason: typeof record.reason === "string" ? record.reason : "unknown",
      });
      return;
    }
    if (record.event !== "request_finished") return;
    const key = `${record.http_status ?? 0}\0${
      typeof record.finish_reason === "string" ? record.finish_reason : "unknown"
    }\0${typeof record.error_kind === "string" ? record.error_kind : "none"}`;
    this.#requestCounts.set(key, (this.#requestCounts.get(key) ?? 0) + 1);
    if (typeof record.queue_wait_ms === "number") {
      this.#queueWait.observe(record.queue_wait_ms / 1000);
    }
    if (typeof record.duration_ms === "number") {
      this.#duration.observe(record.duration_ms / 1000);
    }
    if (typeof record.request_bytes === "number") this.#requestBytes.inc(record.request_bytes);
    if (typeof record.response_bytes === "number") this.#responseBytes.inc(record.response_bytes);
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

/** The fields of a registry node snapshot the per-node gauges read. */
interface NodeSnapshotLike {
  capacity: number;
  in_flight: number;
  available_capacity: number;
}

/**
 * The Router's node registry (spec router §1.4–§1.5, §2.3–§2.5, §3, §4): one record per node
 * with its health state, its supervisor's control connection, its data slots (an idle FIFO), the
 * instances they belong to, the requests running on it; the pool's cohort baseline
 * (target/versions); the admission queue; node selection; the public `/health` numbers. Pure
 * state: connections are {@linkcode ControlHandle}s and {@linkcode SlotHandle}s that the
 * socket layer implements, and time comes from an injectable monotonic clock.
 *
 * A node's state:
 *
 * ```
 *  (created by the node's first status report, or by a slot that came before it)
 *
 *  starting ── healthy, compatible ─────────────────────────────────▶ ready
 *     │                                                              ▲   │ unhealthy-threshold
 *     │ one unhealthy report            recovery-threshold healthy   │   │ unhealthy reports in
 *     ▼                                 reports in a row             │   │ a row (fewer: stays)
 *  unhealthy ── healthy, compatible ──▶ recovering ──────────────────┘   │
 *     ▲  ▲                                  │                            │
 *     │  └──────── one unhealthy report ────┘                            │
 *     │  └───────────────────────────────────────────────────────────────┘
 *     └── any state: its control connection closes, is refused or expires (failures = threshold)
 *
 *  any state ── healthy, target/versions other than the pool's ──▶ incompatible
 *  incompatible ── healthy, compatible ──▶ ready      (unhealthy reports: as for ready)
 *  no control connection, nothing running, disconnected for node-retention ──▶ record removed
 * ```
 *
 * (With recovery-threshold 1, the first healthy report takes an unhealthy node straight to
 * `ready`.)
 *
 * A node takes requests when it is `ready`, has a current control connection, is not marked
 * saturated (a node 503, for one status-check interval) and has an idle slot. A healthy report
 * with a new server or supervisor instance closes every slot of the node (in-flight requests keep
 * their count); slots of another server instance are refused until the supervisor reports it.
 * Control loss never closes slots: running requests finish, only new dispatch stops. Every
 * cleanup compares connection ids, so a late close of an old connection never removes its
 * replacement.
 *
 * This module is longer than most because the node record, its state machine and the
 * bookkeeping of connections are one piece of state whose invariants (which slots are idle,
 * which connection is current, what `in_flight` counts) every operation must keep together.
 *
 * @module
 */
import type { HealthLoad } from "../protocol/health.ts";
import {
  isValidNodeId,
  type LinkCloseName,
  type NodeStatus,
  type SlotHello,
} from "../protocol/node_link.ts";
import { AdmissionQueue } from "./admission.ts";
import { type LoadView, selectNode } from "./selection.ts";

export { NoNode, RouterBusy, RouterStopping } from "./admission.ts";
// The protocol types of this module's signatures, for readers of its documentation alone.
export type { HealthLoad } from "../protocol/health.ts";
export {
  LINK_CLOSE,
  type LinkCloseName,
  type NodeStatus,
  type SlotHello,
} from "../protocol/node_link.ts";

/** The registry's view of one connected data slot; `router/slot_link.ts` implements it. */
export interface SlotHandle {
  /** Unique per WebSocket connection. */
  readonly connectionId: string;
  /** The slot id of the hello (new on every connection of the node). */
  readonly slotId: string;
  /** The node of the hello. */
  readonly nodeId: string;
  /** The server instance of the hello. */
  readonly serverInstanceId: string;
  /** Closes the connection with a node-link close code and reason; idempotent, never blocks. */
  close(code: LinkCloseName, reason: string): void;
}

/** One control connection (a supervisor's WebSocket). */
export interface ControlHandle {
  /** Unique per WebSocket connection. */
  readonly connectionId: string;
  /** Closes the connection with a node-link close code and reason; idempotent, never blocks. */
  close(code: LinkCloseName, reason: string): void;
}

/**
 * A connection is refused or ended: close it with `code` and `message`.
 *
 * @example
 * ```ts
 * import { LinkRefusal } from "./registry.ts";
 *
 * const refusal = new LinkRefusal("already_exists", "data slot identifier is already connected");
 * if (refusal.code !== "already_exists") throw new Error();
 * ```
 */
export class LinkRefusal extends Error {
  /** The close code to use. */
  readonly code: LinkCloseName;
  /**
   * Creates the refusal.
   *
   * @example
   * ```ts
   * import { LinkRefusal } from "./registry.ts";
   *
   * if (new LinkRefusal("invalid_argument", "bad").name !== "LinkRefusal") throw new Error();
   * ```
   */
  constructor(code: LinkCloseName, message: string) {
    super(message);
    this.name = "LinkRefusal";
    this.code = code;
  }
}

/** The registry's settings (`kcoral router` options, in ms where they are durations). */
export interface RegistryConfig {
  /** Largest age of a healthy report's probe, and of a control connection's last report. */
  maxStatusAgeMs: number;
  /** Failing reports that take a `ready` node out. */
  unhealthyThreshold: number;
  /** Healthy reports in a row that bring an `unhealthy` node back. */
  recoveryThreshold: number;
  /** How long a disconnected, idle node record is kept. */
  nodeRetentionMs: number;
  /** Period of the sweep, and the length of a saturation mark. */
  statusCheckIntervalMs: number;
  /** Requests that may wait for a slot at once. */
  maxQueuedRequests: number;
  /** How long a request may wait for a slot. */
  queueWaitTimeoutMs: number;
}

/** A slot taken for one request. */
export interface SlotLease {
  /** The node that serves the request. */
  readonly nodeId: string;
  /** The slot carrying it. */
  readonly slot: SlotHandle;
  /**
   * Gives the slot back: `reusable` true puts it at the back of the node's idle FIFO (only if it
   * is still the registered connection for its slot id and the node's current server instance
   * is the slot's); false discards it (unregisters it; the caller closes it). Decrements
   * `in_flight` and wakes one waiter. Idempotent.
   */
  release(reusable: boolean): void;
  /**
   * The node answered 503: exclude it from scheduling and capacity for one status-check
   * interval (cleared early by its next healthy report).
   */
  markSaturated(): void;
}

/** A node's health state (see the module documentation). */
export type NodeState = "starting" | "ready" | "recovering" | "incompatible" | "unhealthy";

/** One node in {@linkcode NodeRegistry.snapshot} (upstream's `workers` entries). */
export interface NodeSnapshot {
  /** The node id. */
  name: string;
  /** Its state. */
  status: NodeState;
  /** The supervisor instance last reported, `null` if none. */
  supervisor_instance_id: string | null;
  /** The server instance last reported or adopted from a slot, `null` if none. */
  server_instance_id: string | null;
  /** Instance changes seen. */
  restarts: number;
  /** Requests running on it through this Router. */
  in_flight: number;
  /** `worker_count` of the last healthy report. */
  capacity: number;
  /** Registered slots (idle and busy). */
  connected_data_slots: number;
  /** Idle slots it can take requests on now (0 unless ready, connected and not saturated). */
  available_capacity: number;
  /** Failing observations in a row. */
  consecutive_failures: number;
  /** Healthy observations in a row while recovering. */
  recovery_successes: number;
  /** The last healthy report is at most max-status-age old. */
  last_probe_ok: boolean;
  /** Seconds since the last healthy report, `null` if none. */
  last_success_age_seconds: number | null;
  /** Why it is not ready, `null` if nothing to say. */
  last_error: string | null;
}

/** The registry's internal snapshot: for tests, logs and a status page (not `/health`). */
export interface RegistrySnapshot {
  /** Requests running, all nodes together. */
  active_requests: number;
  /** Requests waiting for a slot. */
  queue_length: number;
  /** One entry per node record, oldest record first. */
  workers: NodeSnapshot[];
}

/** What the public `/health` body needs of the registry. */
export interface RegistryHealth {
  /** Some `ready` node has a registered slot (`status: "ok"`, HTTP 200). */
  ok: boolean;
  /** Capacity of eligible nodes, requests running, requests waiting. */
  load: HealthLoad;
  /** The cohort baseline's target (`{}` when none). */
  target: Record<string, string>;
  /** The cohort baseline's versions (`{}` when none). */
  versions: Record<string, string>;
}

/** Receives the registry's state changes worth a console line. */
export type RegistryEventListener = (event: string, fields: Record<string, unknown>) => void;

/** Injectable dependencies of a {@linkcode NodeRegistry}. */
export interface RegistryOptions {
  /** A monotonic clock in ms (default `performance.now`). */
  now?: () => number;
  /** Uniform values in `[0, 1)` for node selection (default `Math.random`). */
  random?: () => number;
  /**
   * State changes: `node_ready`, `node_recovering`, `node_unhealthy`, `node_incompatible`,
   * `node_restarted`, `node_removed`, `control_replaced`, `slot_registered`, `slot_refused`;
   * fields name the `node` and the `reason`. A listener that throws is reported on the console.
   */
  onEvent?: RegistryEventListener;
}

/**
 * Why a healthy status report cannot be used (spec router §1.4 item 3), or `null` when it can:
 * it needs a server instance id, `worker_count > 0`, `busy_workers <= worker_count` and a probe
 * at most `maxStatusAgeMs` old.
 *
 * @example
 * ```ts
 * import { healthyReportProblem } from "./registry.ts";
 *
 * const report = {
 *   t: "status", node_id: "gpu-a", server_healthy: true, supervisor_instance_id: "s1",
 *   server_instance_id: "i1", worker_count: 1, busy_workers: 0, target: {}, versions: {},
 *   last_error: "", health_age_millis: 6_000,
 * } as const;
 * if (healthyReportProblem(report, 5_000) !== "node reports a stale local health snapshot") {
 *   throw new Error();
 * }
 * ```
 */
export function healthyReportProblem(status: NodeStatus, maxStatusAgeMs: number): string | null {
  if (status.server_instance_id === "") {
    return "status is missing the server instance identifier";
  }
  if (status.worker_count <= 0 || status.busy_workers > status.worker_count) {
    return "status has invalid worker capacity";
  }
  if (status.health_age_millis === null || status.health_age_millis > maxStatusAgeMs) {
    return "node reports a stale local health snapshot";
  }
  return null;
}

/** The target and versions every node of the pool must match. */
interface Cohort {
  target: Record<string, string>;
  versions: Record<string, string>;
}

/** One node's record. */
class NodeRecord implements LoadView {
  status: NodeState = "starting";
  control: ControlHandle | null = null;
  supervisorInstanceId = "";
  serverInstanceId = "";
  restarts = 0;
  consecutiveFailures = 0;
  recoverySuccesses = 0;
  /** When the current control connection last reported. */
  lastControlAt: number | null = null;
  /** Since when it has had no control connection (`null` while it has one). */
  disconnectedSince: number | null;
  lastSuccessAt: number | null = null;
  lastError = "";
  workerCount = 0;
  busyWorkers = 0;
  inFlight = 0;
  lastSelected = 0;
  saturatedUntil: number | null = null;
  /** Registered slots by slot id. */
  readonly slots = new Map<string, SlotHandle>();
  /** Idle slot ids, oldest first. */
  idle: string[] = [];

  constructor(readonly name: string, now: number) {
    this.disconnectedSince = now;
  }
}

/**
 * The node registry: see the module documentation.
 *
 * @example
 * ```ts
 * import { NodeRegistry } from "./registry.ts";
 *
 * const registry = new NodeRegistry({
 *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2, nodeRetentionMs: 600_000,
 *   statusCheckIntervalMs: 1000, maxQueuedRequests: 16, queueWaitTimeoutMs: 1000,
 * });
 * const control = { connectionId: "c1", close() {} };
 * registry.controlStatus(control, {
 *   t: "status", node_id: "gpu-a", server_healthy: true, supervisor_instance_id: "s1",
 *   server_instance_id: "i1", worker_count: 1, busy_workers: 0, target: { arch: "sm_90a" },
 *   versions: {}, last_error: "", health_age_millis: 10,
 * }, true);
 * registry.registerSlot(
 *   { t: "hello", node_id: "gpu-a", server_instance_id: "i1", slot_id: "x", protocol_version: 1 },
 *   { connectionId: "d1", slotId: "x", nodeId: "gpu-a", serverInstanceId: "i1", close() {} },
 * );
 * const lease = await registry.acquire(null);
 * if (lease.nodeId !== "gpu-a" || registry.health().load.requests_in_progress !== 1) {
 *   throw new Error();
 * }
 * lease.release(true);
 * registry.close();
 * ```
 */
export class NodeRegistry {
  readonly #config: RegistryConfig;
  readonly #now: () => number;
  readonly #random: () => number;
  readonly #onEvent: RegistryEventListener | undefined;
  readonly #queue: AdmissionQueue;
  /** Node records in creation order. */
  readonly #nodes = new Map<string, NodeRecord>();
  /** Current control connections: connection id → node id. */
  readonly #controlNodes = new Map<string, string>();
  #cohort: Cohort | null = null;
  #selectionSequence = 0;
  #timer: ReturnType<typeof setTimeout> | null = null;
  #running = false;
  #closed = false;

  /**
   * Creates an empty registry (no sweep timer until {@linkcode NodeRegistry.start}).
   *
   * @example
   * ```ts
   * import { NodeRegistry } from "./registry.ts";
   *
   * let clock = 0;
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 0,
   *   queueWaitTimeoutMs: 0,
   * }, { now: () => clock, random: () => 0.5 });
   * clock += 1000;
   * registry.sweep();
   * if (registry.health().ok) throw new Error("no node yet");
   * ```
   */
  constructor(config: RegistryConfig, options: RegistryOptions = {}) {
    this.#config = { ...config };
    this.#now = options.now ?? (() => performance.now());
    this.#random = options.random ?? Math.random;
    this.#onEvent = options.onEvent;
    this.#queue = new AdmissionQueue({
      maxWaiting: config.maxQueuedRequests,
      waitTimeoutMs: config.queueWaitTimeoutMs,
    });
  }

  /**
   * Records a control connection's status report. `first`: its first message (it registers the
   * connection as the node's current one, replacing — and closing with `failed_precondition` —
   * an older one: "latest wins"). A later message must keep the node id (else
   * `invalid_argument`) and come from the node's current connection (else
   * `failed_precondition`). Throws {@linkcode LinkRefusal}; the caller closes the connection
   * with it. A refused later message of the current connection also ends its control (the node
   * becomes `unhealthy` with the refusal as `last_error`), as the connection is going away.
   *
   * @example
   * ```ts
   * import { LinkRefusal, NodeRegistry } from "./registry.ts";
   *
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 1,
   *   queueWaitTimeoutMs: 10,
   * });
   * const starting = {
   *   t: "status", node_id: "gpu-a", server_healthy: false, supervisor_instance_id: "s1",
   *   server_instance_id: "", worker_count: 0, busy_workers: 0, target: {}, versions: {},
   *   last_error: "KCoral Server is starting", health_age_millis: null,
   * } as const;
   * const control = { connectionId: "c1", close() {} };
   * registry.controlStatus(control, starting, true);
   * if (registry.snapshot().workers[0].status !== "unhealthy") throw new Error();
   * try {
   *   registry.controlStatus(control, { ...starting, node_id: "gpu-b" }, false);
   *   throw new Error("accepted");
   * } catch (error) {
   *   if (!(error instanceof LinkRefusal) || error.code !== "invalid_argument") throw error;
   * }
   * ```
   */
  controlStatus(control: ControlHandle, status: NodeStatus, first: boolean): void {
    const expected = first ? null : this.#controlNodes.get(control.connectionId) ?? null;
    const superseded = "supervisor connection was superseded or expired";
    if (!first && expected === null) throw new LinkRefusal("failed_precondition", superseded);
    const refuse = (message: string): LinkRefusal => {
      const node = expected === null ? undefined : this.#nodes.get(expected);
      if (node !== undefined && node.control?.connectionId === control.connectionId) {
        this.#loseControl(node, message);
        this.#queue.wakeAll();
      }
      return new LinkRefusal("invalid_argument", message);
    };
    if (!isValidNodeId(status.node_id)) {
      throw refuse(`invalid node identifier ${JSON.stringify(status.node_id)}`);
    }
    if (expected !== null && status.node_id !== expected) {
      throw refuse("control stream changed its node identifier");
    }
    if (status.supervisor_instance_id === "") {
      throw refuse("status is missing the supervisor instance identifier");
    }
    if (
      expected !== null &&
      this.#nodes.get(expected)?.control?.connectionId !== control.connectionId
    ) {
      throw new LinkRefusal("failed_precondition", superseded);
    }
    if (status.server_healthy) {
      const problem = healthyReportProblem(status, this.#config.maxStatusAgeMs);
      if (problem !== null) throw refuse(problem);
    }

    const now = this.#now();
    const node = this.#ensureNode(status.node_id, now);
    const previous = node.control;
    const replaced = previous !== null && previous.connectionId !== control.connectionId
      ? previous
      : null;
    if (replaced !== null) this.#controlNodes.delete(replaced.connectionId);
    this.#controlNodes.set(control.connectionId, node.name);
    node.control = control;
    node.lastControlAt = now;
    node.disconnectedSince = null;

    let closing: SlotHandle[] = [];
    let closeReason = "";
    if (status.server_healthy) {
      [closing, closeReason] = this.#applySuccess(node, status, now);
    } else {
      if (
        node.supervisorInstanceId !== "" &&
        node.supervisorInstanceId !== status.supervisor_instance_id
      ) {
        closeReason = "supervisor instance changed";
        closing = this.#instanceChanged(node, closeReason);
      }
      node.supervisorInstanceId = status.supervisor_instance_id;
      this.#applyFailure(
        node,
        status.last_error === ""
          ? "node reports that the local KCoral Server is unhealthy"
          : status.last_error,
      );
    }
    if (replaced !== null) {
      this.#emit("control_replaced", { node: node.name, reason: "latest connection wins" });
      replaced.close("failed_precondition", "replaced by a newer control connection");
    }
    for (const slot of closing) slot.close("unavailable", closeReason);
    this.#queue.wakeAll();
  }

  /**
   * The control connection ended: if it is still its node's current one, the node becomes
   * `unhealthy` at once (failures set to the threshold) and stops taking new requests; its slots
   * stay (running requests finish). A late close of a replaced connection changes nothing.
   *
   * @example
   * ```ts
   * import { NodeRegistry } from "./registry.ts";
   *
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 1,
   *   queueWaitTimeoutMs: 10,
   * });
   * registry.controlClosed({ connectionId: "never-seen", close() {} }); // no-op
   * ```
   */
  controlClosed(control: ControlHandle, reason = "supervisor control connection closed"): void {
    const nodeId = this.#controlNodes.get(control.connectionId);
    if (nodeId === undefined) return;
    const node = this.#nodes.get(nodeId);
    if (node === undefined || node.control?.connectionId !== control.connectionId) {
      this.#controlNodes.delete(control.connectionId);
      return;
    }
    this.#loseControl(node, reason);
    this.#queue.wakeAll();
  }

  /**
   * Registers a slot after its hello (the caller checked `protocol_version`): it goes to the
   * back of its node's idle FIFO, creating the node record if there is none (a record created by
   * a slot adopts its server instance). `slot` carries the hello's ids. Throws
   * {@linkcode LinkRefusal}: `invalid_argument` (bad node id, missing instance or slot id),
   * `failed_precondition` (another server instance than the node's), `already_exists` (slot id
   * already connected for the node).
   *
   * @example
   * ```ts
   * import { LinkRefusal, NodeRegistry } from "./registry.ts";
   *
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 1,
   *   queueWaitTimeoutMs: 10,
   * });
   * const hello = {
   *   t: "hello", node_id: "gpu-a", server_instance_id: "i1", slot_id: "x", protocol_version: 1,
   * } as const;
   * const slot = (connectionId: string) =>
   *   ({ connectionId, slotId: "x", nodeId: "gpu-a", serverInstanceId: "i1", close() {} });
   * registry.registerSlot(hello, slot("d1"));
   * try {
   *   registry.registerSlot(hello, slot("d2"));
   *   throw new Error("accepted");
   * } catch (error) {
   *   if (!(error instanceof LinkRefusal) || error.code !== "already_exists") throw error;
   * }
   * ```
   */
  registerSlot(hello: SlotHello, slot: SlotHandle): void {
    const refuse = (code: LinkCloseName, message: string): LinkRefusal => {
      this.#emit("slot_refused", { node: hello.node_id, slot: hello.slot_id, reason: message });
      return new LinkRefusal(code, message);
    };
    if (!isValidNodeId(hello.node_id)) {
      throw refuse("invalid_argument", `invalid node identifier ${JSON.stringify(hello.node_id)}`);
    }
    if (hello.server_instance_id === "" || hello.slot_id === "") {
      throw refuse("invalid_argument", "data hello is missing an instance or slot identifier");
    }
    const node = this.#ensureNode(hello.node_id, this.#now());
    if (node.serverInstanceId !== "" && node.serverInstanceId !== hello.server_instance_id) {
      throw refuse(
        "failed_precondition",
        "data slot does not match the current server instance",
      );
    }
    if (node.slots.has(hello.slot_id)) {
      throw refuse("already_exists", "data slot identifier is already connected");
    }
    if (node.serverInstanceId === "") node.serverInstanceId = hello.server_instance_id;
    node.slots.set(hello.slot_id, slot);
    node.idle.push(hello.slot_id);
    this.#emit("slot_registered", { node: node.name, slot: hello.slot_id });
    this.#queue.wakeAll();
  }

  /**
   * The slot's connection ended: it is unregistered, if it is still the registered connection
   * for its slot id (a late close never removes a replacement). A request running on it keeps
   * its count until its lease is released. `reason`, when given, becomes the node's
   * `last_error` (as upstream).
   *
   * @example
   * ```ts
   * import { NodeRegistry } from "./registry.ts";
   *
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 1,
   *   queueWaitTimeoutMs: 10,
   * });
   * const slot = { connectionId: "d1", slotId: "x", nodeId: "gpu-a", serverInstanceId: "i1",
   *   close() {} };
   * registry.registerSlot(
   *   { t: "hello", node_id: "gpu-a", server_instance_id: "i1", slot_id: "x", protocol_version: 1 },
   *   slot,
   * );
   * registry.slotClosed(slot);
   * if (registry.snapshot().workers[0].connected_data_slots !== 0) throw new Error();
   * ```
   */
  slotClosed(slot: SlotHandle, reason?: string): void {
    const node = this.#nodes.get(slot.nodeId);
    if (node === undefined || node.slots.get(slot.slotId)?.connectionId !== slot.connectionId) {
      return;
    }
    node.slots.delete(slot.slotId);
    node.idle = node.idle.filter((id) => id !== slot.slotId);
    if (reason !== undefined) node.lastError = reason;
    this.#queue.wakeAll();
  }

  /**
   * Takes a slot for one request: from the `preferred` node (the `x-kcoral-node` header) when it
   * can take it, otherwise by power of two choices. Without a free slot the request waits in the
   * queue; rejects with `RouterBusy` (queue full), `NoNode` (the wait expired),
   * `RouterStopping` (after {@linkcode NodeRegistry.close}) or `signal`'s reason when it is
   * aborted while waiting (the queue place is given back).
   *
   * @example
   * ```ts
   * import { NodeRegistry, RouterBusy } from "./registry.ts";
   *
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 0,
   *   queueWaitTimeoutMs: 10,
   * });
   * await registry.acquire(null).then(() => {
   *   throw new Error("no node, yet a slot");
   * }, (error) => {
   *   if (!(error instanceof RouterBusy)) throw error;
   * });
   * ```
   */
  acquire(
    preferred: string | null,
    signal?: AbortSignal | (() => AbortSignal),
  ): Promise<SlotLease> {
    return this.#queue.admit(() => this.#tryAcquire(preferred), signal);
  }

  /**
   * A slot at once, chosen as {@linkcode NodeRegistry.acquire} chooses, or `null` (none free, or
   * the registry is closed) with nothing changed: the caller then waits with `acquire`. The
   * same order as `acquire`'s first try, without its promise (the usual case of a free slot).
   *
   * @example
   * ```ts
   * import { NodeRegistry } from "./registry.ts";
   *
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 1,
   *   queueWaitTimeoutMs: 10,
   * });
   * if (registry.tryAcquire(null) !== null) throw new Error("no node, yet a slot");
   * registry.close();
   * ```
   */
  tryAcquire(preferred: string | null): SlotLease | null {
    return this.#closed ? null : this.#tryAcquire(preferred);
  }

  /**
   * The freshness sweep and retention (spec router §4): a control connection whose last report
   * is older than max-status-age is dropped and closed (`unavailable`, "supervisor status
   * expired") and its node becomes `unhealthy`; then node records without a control connection,
   * with nothing running, disconnected for at least node-retention are removed (their slots
   * closed, "node retention expired"); an empty table clears the cohort baseline. Wakes every
   * waiter (saturation marks expire with time).
   *
   * @example
   * ```ts
   * import { NodeRegistry } from "./registry.ts";
   *
   * let clock = 0;
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2, nodeRetentionMs: 60_000,
   *   statusCheckIntervalMs: 1000, maxQueuedRequests: 1, queueWaitTimeoutMs: 10,
   * }, { now: () => clock });
   * registry.registerSlot(
   *   { t: "hello", node_id: "gpu-a", server_instance_id: "i1", slot_id: "x", protocol_version: 1 },
   *   { connectionId: "d1", slotId: "x", nodeId: "gpu-a", serverInstanceId: "i1", close() {} },
   * );
   * clock = 60_000;
   * registry.sweep();
   * if (registry.snapshot().workers.length !== 0) throw new Error("a data-only record expires");
   * ```
   */
  sweep(): void {
    const now = this.#now();
    const expired: ControlHandle[] = [];
    for (const node of this.#nodes.values()) {
      if (
        node.control !== null && node.lastControlAt !== null &&
        now - node.lastControlAt > this.#config.maxStatusAgeMs
      ) {
        expired.push(node.control);
        this.#loseControl(node, "supervisor status expired");
      }
    }
    const retired: SlotHandle[] = [];
    for (const node of [...this.#nodes.values()]) {
      if (
        node.control === null && node.inFlight === 0 && node.disconnectedSince !== null &&
        now - node.disconnectedSince >= this.#config.nodeRetentionMs
      ) {
        this.#nodes.delete(node.name);
        retired.push(...node.slots.values());
        node.slots.clear();
        node.idle = [];
        this.#emit("node_removed", { node: node.name, reason: "node retention expired" });
      }
    }
    if (this.#nodes.size === 0) this.#cohort = null;
    for (const control of expired) control.close("unavailable", "supervisor status expired");
    for (const slot of retired) slot.close("unavailable", "node retention expired");
    this.#queue.wakeAll();
  }

  /**
   * Runs {@linkcode NodeRegistry.sweep} every status-check interval, each run scheduled after
   * the previous one finished (missed ticks are delayed, never burst). Idempotent.
   *
   * @example
   * ```ts
   * import { NodeRegistry } from "./registry.ts";
   *
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 1,
   *   queueWaitTimeoutMs: 10,
   * });
   * registry.start();
   * registry.stop();
   * ```
   */
  start(): void {
    if (this.#running || this.#closed) return;
    this.#running = true;
    this.#scheduleSweep();
  }

  /**
   * Stops the sweep timer started by {@linkcode NodeRegistry.start}. Idempotent.
   *
   * @example
   * ```ts
   * import { NodeRegistry } from "./registry.ts";
   *
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 1,
   *   queueWaitTimeoutMs: 10,
   * });
   * registry.stop(); // not started: no-op
   * ```
   */
  stop(): void {
    this.#running = false;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
  }

  /**
   * The public `/health` numbers (spec router §2.5): `ok` iff some `ready` node has a registered
   * slot; `request_capacity` = registered slots of nodes that are `ready`, connected and not
   * saturated; `requests_in_progress` = requests running; `requests_waiting` = queue places in
   * use; `target`/`versions` = the cohort baseline (`{}` when none).
   *
   * @example
   * ```ts
   * import { NodeRegistry } from "./registry.ts";
   *
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 1,
   *   queueWaitTimeoutMs: 10,
   * });
   * const health = registry.health();
   * if (health.ok || health.load.request_capacity !== 0) throw new Error();
   * ```
   */
  health(): RegistryHealth {
    const now = this.#now();
    let ok = false;
    let capacity = 0;
    let inProgress = 0;
    for (const node of this.#nodes.values()) {
      if (node.status === "ready" && node.slots.size > 0) ok = true;
      if (this.#eligible(node, now)) capacity += node.slots.size;
      inProgress += node.inFlight;
    }
    // A closed registry (the Router is stopping) takes no more work: unavailable, no capacity.
    if (this.#closed) (ok = false, capacity = 0);
    return {
      ok,
      load: {
        request_capacity: capacity,
        requests_in_progress: inProgress,
        requests_waiting: this.#queue.waiting,
      },
      target: { ...this.#cohort?.target },
      versions: { ...this.#cohort?.versions },
    };
  }

  /**
   * The internal snapshot (spec router §2.5 "No node list"): every node record with its state,
   * instances, counts and errors, plus the requests running and waiting.
   *
   * @example
   * ```ts
   * import { NodeRegistry } from "./registry.ts";
   *
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 1,
   *   queueWaitTimeoutMs: 10,
   * });
   * const snapshot = registry.snapshot();
   * if (snapshot.active_requests !== 0 || snapshot.workers.length !== 0) throw new Error();
   * ```
   */
  snapshot(): RegistrySnapshot {
    const now = this.#now();
    const workers = [...this.#nodes.values()].map((node): NodeSnapshot => ({
      name: node.name,
      status: node.status,
      supervisor_instance_id: node.supervisorInstanceId || null,
      server_instance_id: node.serverInstanceId || null,
      restarts: node.restarts,
      in_flight: node.inFlight,
      capacity: node.workerCount,
      connected_data_slots: node.slots.size,
      available_capacity: this.#availableCapacity(node, now),
      consecutive_failures: node.consecutiveFailures,
      recovery_successes: node.recoverySuccesses,
      last_probe_ok: node.lastSuccessAt !== null &&
        now - node.lastSuccessAt <= this.#config.maxStatusAgeMs,
      last_success_age_seconds: node.lastSuccessAt === null
        ? null
        : (now - node.lastSuccessAt) / 1000,
      last_error: node.lastError || null,
    }));
    return {
      active_requests: workers.reduce((sum, node) => sum + node.in_flight, 0),
      queue_length: this.#queue.waiting,
      workers,
    };
  }

  /**
   * Stops: the sweep timer ends, every waiter rejects with `RouterStopping` (a `NoNode`), and
   * so does every later {@linkcode NodeRegistry.acquire}. Connections are left to the caller.
   *
   * @example
   * ```ts
   * import { NodeRegistry, NoNode } from "./registry.ts";
   *
   * const registry = new NodeRegistry({
   *   maxStatusAgeMs: 5000, unhealthyThreshold: 3, recoveryThreshold: 2,
   *   nodeRetentionMs: 600_000, statusCheckIntervalMs: 1000, maxQueuedRequests: 1,
   *   queueWaitTimeoutMs: 60_000,
   * });
   * const waiting = registry.acquire(null);
   * registry.close();
   * await waiting.then(() => {
   *   throw new Error("a slot");
   * }, (error) => {
   *   if (!(error instanceof NoNode)) throw error;
   * });
   * ```
   */
  close(): void {
    this.#closed = true;
    this.stop();
    this.#queue.close();
  }

  #scheduleSweep(): void {
    const interval = Math.min(Math.max(this.#config.statusCheckIntervalMs, 1), 2 ** 31 - 1);
    this.#timer = setTimeout(() => {
      this.#timer = null;
      try {
        this.sweep();
      } finally {
        if (this.#running) this.#scheduleSweep();
      }
    }, interval);
  }

  #ensureNode(name: string, now: number): NodeRecord {
    let node = this.#nodes.get(name);
    if (node === undefined) {
      node = new NodeRecord(name, now);
      this.#nodes.set(name, node);
    }
    return node;
  }

  /** Ready, connected, not saturated: its registered slots count as capacity. */
  #eligible(node: NodeRecord, now: number): boolean {
    return node.status === "ready" && node.control !== null &&
      (node.saturatedUntil === null || node.saturatedUntil <= now);
  }

  #availableCapacity(node: NodeRecord, now: number): number {
    return this.#eligible(node, now) ? node.idle.length : 0;
  }

  #tryAcquire(preferred: string | null): SlotLease | null {
    const now = this.#now();
    const candidates = [...this.#nodes.values()].filter((node) =>
      this.#availableCapacity(node, now) > 0
    );
    const node = selectNode(candidates, preferred, this.#random);
    if (node === null) return null;
    const slot = node.slots.get(node.idle.shift()!)!;
    node.inFlight++;
    node.lastSelected = ++this.#selectionSequence;
    return this.#lease(node.name, slot);
  }

  #lease(nodeId: string, slot: SlotHandle): SlotLease {
    let released = false;
    return {
      nodeId,
      slot,
      release: (reusable: boolean) => {
        if (released) return;
        released = true;
        const node = this.#nodes.get(nodeId);
        if (node !== undefined) {
          node.inFlight = Math.max(0, node.inFlight - 1);
          const registered = node.slots.get(slot.slotId)?.connectionId === slot.connectionId;
          if (registered && reusable && node.serverInstanceId === slot.serverInstanceId) {
            node.idle.push(slot.slotId);
          } else if (registered) {
            // Discarded, or of a replaced instance: never idle again.
            node.slots.delete(slot.slotId);
            if (reusable) slot.close("unavailable", "KCoral Server instance changed");
          }
        }
        this.#queue.wakeOne();
      },
      markSaturated: () => {
        const node = this.#nodes.get(nodeId);
        if (node === undefined) return;
        node.saturatedUntil = this.#now() + this.#config.statusCheckIntervalMs;
        this.#queue.wakeAll();
      },
    };
  }

  /** The node loses its current control connection: unhealthy at once, slots kept. */
  #loseControl(node: NodeRecord, error: string): void {
    if (node.control !== null) this.#controlNodes.delete(node.control.connectionId);
    node.control = null;
    node.disconnectedSince = this.#now();
    node.consecutiveFailures = this.#config.unhealthyThreshold;
    node.recoverySuccesses = 0;
    node.lastError = error;
    this.#setStatus(node, "unhealthy", error);
  }

  /** A new server or supervisor instance: every slot is unregistered (returned to close). */
  #instanceChanged(node: NodeRecord, reason: string): SlotHandle[] {
    node.restarts++;
    const slots = [...node.slots.values()];
    node.slots.clear();
    node.idle = [];
    this.#emit("node_restarted", { node: node.name, reason, restarts: node.restarts });
    return slots;
  }

  /** A valid healthy report; returns the slots to close and why. */
  #applySuccess(node: NodeRecord, status: NodeStatus, now: number): [SlotHandle[], string] {
    const cohort = { target: { ...status.target }, versions: { ...status.versions } };
    this.#cohort ??= cohort;
    const compatible = sameStrings(this.#cohort.target, cohort.target) &&
      sameStrings(this.#cohort.versions, cohort.versions);
    const reason = "KCoral Server instance changed";
    const changed = (node.serverInstanceId !== "" &&
      node.serverInstanceId !== status.server_instance_id) ||
      (node.supervisorInstanceId !== "" &&
        node.supervisorInstanceId !== status.supervisor_instance_id);
    const closing = changed ? this.#instanceChanged(node, reason) : [];
    node.supervisorInstanceId = status.supervisor_instance_id;
    node.serverInstanceId = status.server_instance_id;
    node.workerCount = status.worker_count;
    node.busyWorkers = status.busy_workers;
    node.lastSuccessAt = now;
    node.lastError = "";
    node.consecutiveFailures = 0;
    node.saturatedUntil = null;
    if (!compatible) {
      node.recoverySuccesses = 0;
      node.lastError = "target or versions differ from the pool's";
      this.#setStatus(node, "incompatible", node.lastError);
    } else if (node.status === "unhealthy" || node.status === "recovering") {
      node.recoverySuccesses++;
      if (node.recoverySuccesses >= this.#config.recoveryThreshold) {
        node.recoverySuccesses = 0;
        this.#setStatus(node, "ready", "recovered");
      } else {
        this.#setStatus(node, "recovering", "healthy report");
      }
    } else {
      node.recoverySuccesses = 0;
      this.#setStatus(node, "ready", "healthy report");
    }
    return [closing, reason];
  }

  /** An unhealthy report. */
  #applyFailure(node: NodeRecord, error: string): void {
    node.lastError = error;
    node.recoverySuccesses = 0;
    node.consecutiveFailures++;
    if (
      node.consecutiveFailures >= this.#config.unhealthyThreshold ||
      node.status === "starting" || node.status === "recovering"
    ) {
      this.#setStatus(node, "unhealthy", error);
    }
  }

  #setStatus(node: NodeRecord, status: NodeState, reason: string): void {
    if (node.status === status) return;
    const from = node.status;
    node.status = status;
    this.#emit(`node_${status}`, { node: node.name, from, reason });
  }

  #emit(event: string, fields: Record<string, unknown>): void {
    if (this.#onEvent === undefined) return;
    try {
      this.#onEvent(event, fields);
    } catch (error) {
      console.error(`router: the ${event} listener failed:`, error);
    }
  }
}

function sameStrings(a: Record<string, string>, b: Record<string, string>): boolean {
  const keys = Object.keys(a);
  return keys.length === Object.keys(b).length &&
    keys.every((key) => Object.hasOwn(b, key) && a[key] === b[key]);
}

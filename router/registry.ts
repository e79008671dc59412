/**
 * The Router's node registry (spec router §1.4–§1.5, §2.3–§2.5, §3, §4): the node records by
 * name, which control connection is each node's current one, the pool's cohort baseline
 * (target/versions), the admission queue, node selection and the freshness sweep. Pure state:
 * connections are handles the socket layer implements, and time comes from an injectable
 * monotonic clock. Its parts:
 *
 * ```
 *  router/node_health.ts       a node's record and health state machine (starting, ready, ...)
 *  router/connections.ts       control and slot handles, a node's idle FIFO, a request's lease
 *  router/health_views.ts      the /health numbers and the internal snapshot
 *  router/admission_queue.ts   the bounded wait for a slot; router/selection.ts which node
 * ```
 *
 * A node takes requests when it is `ready`, has a current control connection, is not marked
 * saturated (a node 503, for one status-check interval) and has an idle slot. Slots of another
 * server instance than the node's are refused until its supervisor reports it. A node record
 * without a control connection and with nothing running is removed after node-retention.
 *
 * @module
 */
import {
  isValidNodeId,
  type LinkCloseName,
  type NodeStatus,
  type SlotHello,
} from "../link/messages.ts";
import { AdmissionQueue } from "./admission_queue.ts";
import { type ControlHandle, LinkRefusal, type SlotHandle, type SlotLease } from "./connections.ts";
import {
  healthView,
  type RegistryHealth,
  type RegistrySnapshot,
  type RegistryState,
  snapshotView,
} from "./health_views.ts";
import { type Cohort, healthyReportProblem, NodeRecord, sameCohort } from "./node_health.ts";
import { selectNode } from "./selection.ts";

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
 * The node registry: see the module documentation.
 *
 * @example
 * ```ts
 * import { NodeRegistry } from "./registry.ts";
 * import { defaultRegistryConfig } from "./options.ts";
 *
 * const registry = new NodeRegistry(defaultRegistryConfig());
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

  /** Creates an empty registry (no sweep timer until {@linkcode NodeRegistry.start}). */
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
    let closing;
    if (status.server_healthy) {
      const cohort = { target: { ...status.target }, versions: { ...status.versions } };
      this.#cohort ??= cohort;
      closing = node.reportHealthy(status, sameCohort(this.#cohort, cohort), now);
    } else {
      closing = node.reportUnhealthy(status);
    }
    if (replaced !== null) {
      this.#emit("control_replaced", { node: node.name, reason: "latest connection wins" });
      replaced.close("failed_precondition", "replaced by a newer control connection");
    }
    const [slots, reason] = closing;
    for (const slot of slots) slot.close("unavailable", reason);
    this.#queue.wakeAll();
  }

  /**
   * The control connection ended: if it is still its node's current one, the node becomes
   * `unhealthy` at once (failures set to the threshold) and stops taking new requests; its slots
   * stay (running requests finish). A late close of a replaced connection changes nothing.
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
      throw refuse("failed_precondition", "data slot does not match the current server instance");
    }
    if (node.slots.has(hello.slot_id)) {
      throw refuse("already_exists", "data slot identifier is already connected");
    }
    if (node.serverInstanceId === "") node.serverInstanceId = hello.server_instance_id;
    node.slots.add(slot);
    this.#emit("slot_registered", { node: node.name, slot: hello.slot_id });
    this.#queue.wakeAll();
  }

  /**
   * The slot's connection ended: it is unregistered, if it is still the registered connection
   * for its slot id (a late close never removes a replacement). A request running on it keeps
   * its count until its lease is released. `reason`, when given, becomes the node's
   * `last_error` (as upstream).
   */
  slotClosed(slot: SlotHandle, reason?: string): void {
    const node = this.#nodes.get(slot.nodeId);
    if (node === undefined || !node.slots.remove(slot)) return;
    if (reason !== undefined) node.lastError = reason;
    this.#queue.wakeAll();
  }

  /**
   * Takes a slot for one request: from the `preferred` node (the `x-kcoral-node` header) when it
   * can take it, otherwise by power of two choices. Without a free slot the request waits in the
   * queue; rejects with `RouterBusy` (queue full), `NoNode` (the wait expired),
   * `RouterStopping` (after {@linkcode NodeRegistry.close}) or `signal`'s reason when it is
   * aborted while waiting (the queue place is given back).
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
        retired.push(...node.slots.clear());
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
   * the previous one finished (missed ticks are delayed, never burst) until
   * {@linkcode NodeRegistry.stop}. Idempotent.
   */
  start(): void {
    if (this.#running || this.#closed) return;
    this.#running = true;
    this.#scheduleSweep();
  }

  /** Stops the sweep timer started by {@linkcode NodeRegistry.start}. Idempotent. */
  stop(): void {
    this.#running = false;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
  }

  /**
   * The public `/health` numbers (spec router §2.5, router/health_views.ts): `ok` iff some
   * `ready` node has a registered slot; the capacity of eligible nodes, requests running and
   * waiting; the cohort baseline. A closed registry: not ok, no capacity.
   */
  health(): RegistryHealth {
    return healthView(this.#state());
  }

  /**
   * The internal snapshot (spec router §2.5 "No node list", router/health_views.ts): every node
   * record with its state, instances, counts and errors, plus the requests running and waiting.
   */
  snapshot(): RegistrySnapshot {
    return snapshotView(this.#state(), this.#config.maxStatusAgeMs);
  }

  /**
   * Stops: the sweep timer ends, every waiter rejects with `RouterStopping` (a `NoNode`), and
   * so does every later {@linkcode NodeRegistry.acquire}. Connections are left to the caller.
   */
  close(): void {
    this.#closed = true;
    this.stop();
    this.#queue.close();
  }

  #state(): RegistryState {
    return {
      nodes: [...this.#nodes.values()],
      now: this.#now(),
      waiting: this.#queue.waiting,
      cohort: this.#cohort,
      closed: this.#closed,
    };
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
      node = new NodeRecord(name, now, this.#config, (event, fields) => this.#emit(event, fields));
      this.#nodes.set(name, node);
    }
    return node;
  }

  #tryAcquire(preferred: string | null): SlotLease | null {
    const now = this.#now();
    const candidates = [...this.#nodes.values()].filter((node) => node.availableCapacity(now) > 0);
    const node = selectNode(candidates, preferred, this.#random);
    if (node === null) return null;
    const slot = node.slots.takeIdle();
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
          node.slots.giveBack(slot, reusable, node.serverInstanceId);
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
    node.loseControl(error, this.#now());
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

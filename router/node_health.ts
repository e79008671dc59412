/**
 * A node's record and its health state machine (spec router §1.4–§1.5), driven by its
 * supervisor's status reports and its control connection:
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
 * ```
 *
 * (With recovery-threshold 1, the first healthy report takes an unhealthy node straight to
 * `ready`.) A report with a new server or supervisor instance unregisters every slot of the node
 * (the caller closes them; in-flight requests keep their count). Control loss never touches the
 * slots: running requests finish, only new dispatch stops.
 *
 * @module
 */
import type { NodeStatus } from "../link/messages.ts";
import { type ControlHandle, NodeSlots, type SlotHandle } from "./connections.ts";
import type { LoadView } from "./selection.ts";

/** A node's health state (see the module documentation). */
export type NodeState = "starting" | "ready" | "recovering" | "incompatible" | "unhealthy";

/** The target and versions every node of the pool must match (the first healthy report's). */
export interface Cohort {
  /** The report's `target`. */
  target: Record<string, string>;
  /** The report's `versions`. */
  versions: Record<string, string>;
}

/** The state machine's settings (the registry's, `kcoral router` options). */
export interface HealthThresholds {
  /** Failing reports that take a `ready` node out. */
  unhealthyThreshold: number;
  /** Healthy reports in a row that bring an `unhealthy` node back. */
  recoveryThreshold: number;
}

/** Slots to close (unregistered already) and the reason to close them with. */
export type SlotsToClose = [slots: SlotHandle[], reason: string];

/**
 * Why a healthy status report cannot be used (spec router §1.4 item 3), or `null` when it can:
 * it needs a server instance id, `worker_count > 0`, `busy_workers <= worker_count` and a probe
 * at most `maxStatusAgeMs` old.
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

/** Whether two cohorts have the same target and versions (the same keys, the same values). */
export function sameCohort(a: Cohort, b: Cohort): boolean {
  return _sameStrings(a.target, b.target) && _sameStrings(a.versions, b.versions);
}

function _sameStrings(a: Record<string, string>, b: Record<string, string>): boolean {
  const keys = Object.keys(a);
  return keys.length === Object.keys(b).length &&
    keys.every((key) => Object.hasOwn(b, key) && a[key] === b[key]);
}

/**
 * One node's record: its state, instances, counts, control connection and slots. Its state
 * changes are reported to `emit` (`node_<state>` with `from` and `reason`, `node_restarted`).
 */
export class NodeRecord implements LoadView {
  /** Its state. */
  status: NodeState = "starting";
  /** Its current control connection. */
  control: ControlHandle | null = null;
  /** The supervisor instance last reported (`""`: none). */
  supervisorInstanceId = "";
  /** The server instance last reported or adopted from a slot (`""`: none). */
  serverInstanceId = "";
  /** Instance changes seen. */
  restarts = 0;
  /** Failing observations in a row. */
  consecutiveFailures = 0;
  /** Healthy observations in a row while recovering. */
  recoverySuccesses = 0;
  /** When the current control connection last reported. */
  lastControlAt: number | null = null;
  /** Since when it has had no control connection (`null` while it has one). */
  disconnectedSince: number | null;
  /** When the last healthy report came. */
  lastSuccessAt: number | null = null;
  /** Why it is not ready (`""`: nothing to say). */
  lastError = "";
  /** `worker_count` of the last healthy report. */
  workerCount = 0;
  /** `busy_workers` of the last healthy report. */
  busyWorkers = 0;
  /** Requests running on it through this Router. */
  inFlight = 0;
  /** The selection sequence number of the last time it was chosen. */
  lastSelected = 0;
  /** Until when it is excluded after a 503 (`null`: not saturated). */
  saturatedUntil: number | null = null;
  /** Its data slots. */
  readonly slots: NodeSlots = new NodeSlots();
  readonly #thresholds: HealthThresholds;
  readonly #emit: (event: string, fields: Record<string, unknown>) => void;

  /** Creates the record of node `name` at time `now`, `starting`, without a connection. */
  constructor(
    readonly name: string,
    now: number,
    thresholds: HealthThresholds,
    emit: (event: string, fields: Record<string, unknown>) => void,
  ) {
    this.disconnectedSince = now;
    this.#thresholds = thresholds;
    this.#emit = emit;
  }

  /** Ready, connected, not saturated at `now`: its registered slots count as capacity. */
  eligible(now: number): boolean {
    return this.status === "ready" && this.control !== null &&
      (this.saturatedUntil === null || this.saturatedUntil <= now);
  }

  /** Idle slots it can take requests on at `now` (0 unless eligible). */
  availableCapacity(now: number): number {
    return this.eligible(now) ? this.slots.idleCount : 0;
  }

  /**
   * A valid healthy report at `now` (`compatible`: its cohort is the pool's); a new server or
   * supervisor instance unregisters the slots, returned to close.
   */
  reportHealthy(status: NodeStatus, compatible: boolean, now: number): SlotsToClose {
    const reason = "KCoral Server instance changed";
    const changed = (this.serverInstanceId !== "" &&
      this.serverInstanceId !== status.server_instance_id) ||
      (this.supervisorInstanceId !== "" &&
        this.supervisorInstanceId !== status.supervisor_instance_id);
    const closing = changed ? this.#instanceChanged(reason) : [];
    this.supervisorInstanceId = status.supervisor_instance_id;
    this.serverInstanceId = status.server_instance_id;
    this.workerCount = status.worker_count;
    this.busyWorkers = status.busy_workers;
    this.lastSuccessAt = now;
    this.lastError = "";
    this.consecutiveFailures = 0;
    this.saturatedUntil = null;
    if (!compatible) {
      this.recoverySuccesses = 0;
      this.lastError = "target or versions differ from the pool's";
      this.#setStatus("incompatible", this.lastError);
    } else if (this.status === "unhealthy" || this.status === "recovering") {
      this.recoverySuccesses++;
      if (this.recoverySuccesses >= this.#thresholds.recoveryThreshold) {
        this.recoverySuccesses = 0;
        this.#setStatus("ready", "recovered");
      } else {
        this.#setStatus("recovering", "healthy report");
      }
    } else {
      this.recoverySuccesses = 0;
      this.#setStatus("ready", "healthy report");
    }
    return [closing, reason];
  }

  /**
   * An unhealthy report: one more failure; a new supervisor instance unregisters the slots,
   * returned to close.
   */
  reportUnhealthy(status: NodeStatus): SlotsToClose {
    const reason = "supervisor instance changed";
    const changed = this.supervisorInstanceId !== "" &&
      this.supervisorInstanceId !== status.supervisor_instance_id;
    const closing = changed ? this.#instanceChanged(reason) : [];
    this.supervisorInstanceId = status.supervisor_instance_id;
    this.lastError = status.last_error === ""
      ? "node reports that the local KCoral Server is unhealthy"
      : status.last_error;
    this.recoverySuccesses = 0;
    this.consecutiveFailures++;
    if (
      this.consecutiveFailures >= this.#thresholds.unhealthyThreshold ||
      this.status === "starting" || this.status === "recovering"
    ) {
      this.#setStatus("unhealthy", this.lastError);
    }
    return [closing, reason];
  }

  /** It loses its current control connection at `now`: `unhealthy` at once, slots kept. */
  loseControl(error: string, now: number): void {
    this.control = null;
    this.disconnectedSince = now;
    this.consecutiveFailures = this.#thresholds.unhealthyThreshold;
    this.recoverySuccesses = 0;
    this.lastError = error;
    this.#setStatus("unhealthy", error);
  }

  /** A new server or supervisor instance: every slot is unregistered (returned to close). */
  #instanceChanged(reason: string): SlotHandle[] {
    this.restarts++;
    const slots = this.slots.clear();
    this.#emit("node_restarted", { node: this.name, reason, restarts: this.restarts });
    return slots;
  }

  #setStatus(status: NodeState, reason: string): void {
    if (this.status === status) return;
    const from = this.status;
    this.status = status;
    this.#emit(`node_${status}`, { node: this.name, from, reason });
  }
}

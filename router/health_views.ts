/**
 * What the Router shows of its node records (spec router §2.5): the public `/health` numbers,
 * which name no node, and the internal snapshot with one entry per node for tests, logs and the
 * status page.
 *
 * @module
 */
import type { HealthLoad } from "../protocol/health.ts";
import type { Cohort, NodeRecord, NodeState } from "./node_health.ts";

/** One node in the registry's snapshot (upstream's `workers` entries). */
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

/** The registry's state a view is made of, at one moment. */
export interface RegistryState {
  /** The node records, oldest first. */
  nodes: Iterable<NodeRecord>;
  /** The time (the registry's monotonic clock, ms). */
  now: number;
  /** Requests waiting for a slot (queue places in use). */
  waiting: number;
  /** The pool's cohort baseline, `null` when none. */
  cohort: Cohort | null;
  /** The registry is closed (the Router is stopping). */
  closed: boolean;
}

/**
 * The public `/health` numbers: `ok` iff some `ready` node has a registered slot;
 * `request_capacity` = registered slots of eligible nodes (`ready`, connected, not saturated);
 * `requests_in_progress` = requests running; `requests_waiting` = queue places in use;
 * `target`/`versions` = the cohort baseline (`{}` when none). A closed registry takes no more
 * work: not ok, no capacity.
 */
export function healthView(state: RegistryState): RegistryHealth {
  let ok = false;
  let capacity = 0;
  let inProgress = 0;
  for (const node of state.nodes) {
    if (node.status === "ready" && node.slots.size > 0) ok = true;
    if (node.eligible(state.now)) capacity += node.slots.size;
    inProgress += node.inFlight;
  }
  if (state.closed) (ok = false, capacity = 0);
  return {
    ok,
    load: {
      request_capacity: capacity,
      requests_in_progress: inProgress,
      requests_waiting: state.waiting,
    },
    target: { ...state.cohort?.target },
    versions: { ...state.cohort?.versions },
  };
}

/**
 * The internal snapshot (spec router §2.5 "No node list"): every node record with its state,
 * instances, counts and errors (`last_probe_ok`: its last healthy report is at most
 * `maxStatusAgeMs` old), plus the requests running and waiting.
 */
export function snapshotView(state: RegistryState, maxStatusAgeMs: number): RegistrySnapshot {
  const now = state.now;
  const workers = [...state.nodes].map((node): NodeSnapshot => ({
    name: node.name,
    status: node.status,
    supervisor_instance_id: node.supervisorInstanceId || null,
    server_instance_id: node.serverInstanceId || null,
    restarts: node.restarts,
    in_flight: node.inFlight,
    capacity: node.workerCount,
    connected_data_slots: node.slots.size,
    available_capacity: node.availableCapacity(now),
    consecutive_failures: node.consecutiveFailures,
    recovery_successes: node.recoverySuccesses,
    last_probe_ok: node.lastSuccessAt !== null && now - node.lastSuccessAt <= maxStatusAgeMs,
    last_success_age_seconds: node.lastSuccessAt === null
      ? null
      : (now - node.lastSuccessAt) / 1000,
    last_error: node.lastError || null,
  }));
  return {
    active_requests: workers.reduce((sum, node) => sum + node.in_flight, 0),
    queue_length: state.waiting,
    workers,
  };
}

/**
 * The Router's node registry: health state machine, connections and instances, slots and
 * leases, retention, `/health` numbers (spec router §1.4–§1.5, §2.3–§2.5, §3, §4, §6.1, §7).
 * Mirrors upstream's `router/pool.rs` unit tests, with a fake clock and fake connections.
 */
import assert from "node:assert/strict";
import type { LinkCloseName, NodeStatus, SlotHello } from "../link/messages.ts";
import { NoNode, RouterBusy, RouterStopping } from "../router/admission_queue.ts";
import { type ControlHandle, LinkRefusal, type SlotHandle } from "../router/connections.ts";
import { healthyReportProblem } from "../router/node_health.ts";
import { NodeRegistry, type RegistryConfig } from "../router/registry.ts";

const CONFIG: RegistryConfig = {
  maxStatusAgeMs: 5000,
  unhealthyThreshold: 3,
  recoveryThreshold: 2,
  nodeRetentionMs: 60_000,
  statusCheckIntervalMs: 1000,
  maxQueuedRequests: 1,
  queueWaitTimeoutMs: 5000,
};

class FakeControl implements ControlHandle {
  closes: [LinkCloseName, string][] = [];
  constructor(readonly connectionId: string) {}
  close(code: LinkCloseName, reason: string): void {
    this.closes.push([code, reason]);
  }
}

class FakeSlot implements SlotHandle {
  closes: [LinkCloseName, string][] = [];
  constructor(
    readonly connectionId: string,
    readonly serverInstanceId: string,
    readonly slotId = "same-slot",
    readonly nodeId = "node",
  ) {}
  close(code: LinkCloseName, reason: string): void {
    this.closes.push([code, reason]);
  }
  get hello(): SlotHello {
    return {
      t: "hello",
      node_id: this.nodeId,
      server_instance_id: this.serverInstanceId,
      slot_id: this.slotId,
      protocol_version: 1,
    };
  }
}

/** A healthy report of instance `instance` (as upstream's test helper `status`). */
function status(instance: string, arch = "cpu", node = "node"): NodeStatus {
  return {
    t: "status",
    node_id: node,
    server_healthy: true,
    supervisor_instance_id: `supervisor-${instance}`,
    server_instance_id: `server-${instance}`,
    worker_count: 1,
    busy_workers: 0,
    target: { arch },
    versions: { cuda: "13.0" },
    last_error: "",
    health_age_millis: 0,
  };
}

/** An unhealthy report of instance `instance`. */
function failing(instance: string, node = "node", lastError = "probe failed"): NodeStatus {
  return {
    ...status(instance, "cpu", node),
    server_healthy: false,
    last_error: lastError,
    health_age_millis: null,
  };
}

function setup(config: Partial<RegistryConfig> = {}, random: () => number = () => 0) {
  const clock = { ms: 0 };
  const events: [string, Record<string, unknown>][] = [];
  const registry = new NodeRegistry({ ...CONFIG, ...config }, {
    now: () => clock.ms,
    random,
    onEvent: (event, fields) => events.push([event, fields]),
  });
  const worker = (name = "node") => {
    const found = registry.snapshot().workers.find((w) => w.name === name);
    assert.ok(found, `no record of ${name}`);
    return found;
  };
  return { registry, clock, events, worker };
}

/** The refusal `run` throws. */
function refusal(run: () => unknown): LinkRefusal {
  try {
    run();
  } catch (error) {
    assert.ok(error instanceof LinkRefusal, String(error));
    return error;
  }
  assert.fail("expected a LinkRefusal");
}

/** A registry with node `node` ready (control `control`) and one idle slot. */
function readyNode(config: Partial<RegistryConfig> = {}) {
  const fixture = setup(config);
  const control = new FakeControl("control");
  fixture.registry.controlStatus(control, status("one"), true);
  const slot = new FakeSlot("first", "server-one");
  fixture.registry.registerSlot(slot.hello, slot);
  return { ...fixture, control, slot };
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 0));

Deno.test("registry: public_health_tracks_capacity_queueing_and_disconnection", async () => {
  const { registry, slot } = (() => {
    const fixture = setup();
    fixture.registry.controlStatus(new FakeControl("control"), status("one"), true);
    assert.equal(fixture.registry.health().load.request_capacity, 0);
    assert.equal(fixture.registry.health().ok, false, "ready, but no slot");
    const slot = new FakeSlot("first", "server-one");
    fixture.registry.registerSlot(slot.hello, slot);
    return { ...fixture, slot };
  })();
  const lease = await registry.acquire(null);
  const client = new AbortController();
  const queued = registry.acquire(null, client.signal);
  assert.deepEqual(registry.health(), {
    ok: true,
    load: { request_capacity: 1, requests_in_progress: 1, requests_waiting: 1 },
    target: { arch: "cpu" },
    versions: { cuda: "13.0" },
  });
  client.abort(new Error("client went away"));
  await assert.rejects(queued, /client went away/);
  registry.controlClosed(new FakeControl("control"), "lost control connection");
  const disconnected = registry.health();
  assert.equal(disconnected.ok, false);
  assert.deepEqual(disconnected.load, {
    request_capacity: 0,
    requests_in_progress: 1,
    requests_waiting: 0,
  });
  // Control loss never closes slots: the running request goes on.
  assert.deepEqual(slot.closes, []);
  assert.equal(registry.snapshot().workers[0].connected_data_slots, 1);
  lease.release(true);
  assert.equal(registry.health().load.requests_in_progress, 0);
  registry.close();
});

Deno.test("registry: public_capacity_excludes_backoff_and_incompatible_nodes", async () => {
  const { registry, control, clock, worker } = readyNode();
  const lease = await registry.acquire(null);
  lease.markSaturated();
  lease.release(true);
  assert.equal(registry.health().load.request_capacity, 0);
  assert.equal(worker().available_capacity, 0);
  registry.controlStatus(control, status("one"), false);
  assert.equal(registry.health().load.request_capacity, 1, "a healthy report clears it");
  // Without a report, the mark lasts one status-check interval.
  const again = await registry.acquire(null);
  again.markSaturated();
  again.release(true);
  clock.ms += 999;
  assert.equal(registry.health().load.request_capacity, 0);
  clock.ms += 1;
  assert.equal(registry.health().load.request_capacity, 1);
  registry.controlStatus(control, status("one", "other"), false);
  assert.equal(registry.health().load.request_capacity, 0);
  assert.equal(worker().status, "incompatible");
  assert.equal(registry.health().ok, false);
  registry.close();
});

Deno.test("registry: health_thresholds_avoid_flapping", () => {
  const { registry, worker } = setup();
  registry.controlStatus(new FakeControl("one"), status("one", "sm_100a"), true);
  registry.controlClosed(new FakeControl("one"), "lost");
  registry.controlStatus(new FakeControl("two"), status("one", "sm_100a"), true);
  assert.equal(worker().status, "recovering");
  registry.controlStatus(new FakeControl("two"), status("one", "sm_100a"), false);
  assert.equal(worker().status, "ready");
});

Deno.test("registry: a ready node tolerates threshold-1 failing reports; a healthy one resets", () => {
  const { registry, control, worker } = readyNode();
  registry.controlStatus(control, failing("one"), false);
  registry.controlStatus(control, failing("one"), false);
  assert.equal(worker().status, "ready");
  assert.equal(worker().consecutive_failures, 2);
  assert.equal(registry.health().load.request_capacity, 1, "still schedulable");
  registry.controlStatus(control, status("one"), false);
  assert.equal(worker().consecutive_failures, 0);
  for (let i = 0; i < 2; i++) registry.controlStatus(control, failing("one"), false);
  assert.equal(worker().status, "ready");
  registry.controlStatus(control, failing("one"), false);
  assert.equal(worker().status, "unhealthy");
  assert.equal(worker().last_error, "probe failed");
  assert.equal(registry.health().load.request_capacity, 0);
  registry.close();
});

Deno.test("registry: starting and recovering fall on one failing report", () => {
  const { registry, worker } = setup();
  const control = new FakeControl("c");
  registry.controlStatus(control, failing("one", "node", "KCoral Server is starting"), true);
  assert.equal(worker().status, "unhealthy");
  assert.equal(worker().consecutive_failures, 1);
  registry.controlStatus(control, status("one"), false);
  assert.equal(worker().status, "recovering");
  assert.equal(worker().recovery_successes, 1);
  registry.controlStatus(control, failing("one"), false);
  assert.equal(worker().status, "unhealthy");
  assert.equal(worker().recovery_successes, 0);
  // Heartbeats are observations: two healthy reports in a row bring it back.
  registry.controlStatus(control, status("one"), false);
  registry.controlStatus(control, status("one"), false);
  assert.equal(worker().status, "ready");
  assert.equal(worker().recovery_successes, 0);
  // An unhealthy report with no error still says something.
  const other = new FakeControl("other");
  registry.controlStatus(other, failing("x", "node-b", ""), true);
  assert.equal(
    worker("node-b").last_error,
    "node reports that the local KCoral Server is unhealthy",
  );
});

Deno.test("registry: starting and incompatible go straight to ready; threshold 1 recovers at once", () => {
  const { registry, worker } = setup({ recoveryThreshold: 1 });
  registry.controlStatus(new FakeControl("a"), status("a", "sm_90a", "gpu-a"), true);
  assert.equal(worker("gpu-a").status, "ready", "starting → ready");
  const b = new FakeControl("b");
  registry.controlStatus(b, status("b", "sm_80", "gpu-b"), true);
  assert.equal(worker("gpu-b").status, "incompatible");
  registry.controlStatus(b, status("b", "sm_90a", "gpu-b"), false);
  assert.equal(worker("gpu-b").status, "ready", "incompatible → ready");
  registry.controlClosed(b);
  assert.equal(worker("gpu-b").status, "unhealthy");
  assert.equal(worker("gpu-b").consecutive_failures, 3, "control loss: failures = threshold");
  registry.controlStatus(new FakeControl("b2"), status("b", "sm_90a", "gpu-b"), true);
  assert.equal(worker("gpu-b").status, "ready");
});

Deno.test("registry: rejects_stale_status_snapshots", () => {
  const report = { ...status("one"), health_age_millis: 6_000 };
  assert.match(healthyReportProblem(report, 5_000) ?? "", /stale/);
  assert.match(healthyReportProblem({ ...report, health_age_millis: null }, 5_000) ?? "", /stale/);
  assert.equal(healthyReportProblem({ ...report, health_age_millis: 5_000 }, 5_000), null);
  assert.match(
    healthyReportProblem({ ...status("one"), server_instance_id: "" }, 5_000) ?? "",
    /server instance/,
  );
  assert.match(
    healthyReportProblem({ ...status("one"), worker_count: 0 }, 5_000) ?? "",
    /capacity/,
  );
  assert.match(
    healthyReportProblem({ ...status("one"), busy_workers: 2 }, 5_000) ?? "",
    /capacity/,
  );

  const { registry, worker } = setup();
  // On a first message: refused, and nothing is recorded.
  const first = refusal(() => registry.controlStatus(new FakeControl("a"), report, true));
  assert.equal(first.code, "invalid_argument");
  assert.equal(registry.snapshot().workers.length, 0);
  // Unhealthy reports carry no snapshot age to check.
  const control = new FakeControl("b");
  registry.controlStatus(control, failing("one"), true);
  registry.controlStatus(control, status("one"), false);
  // On a live stream: refused, and the connection stops being the node's.
  const later = refusal(() => registry.controlStatus(control, report, false));
  assert.equal(later.code, "invalid_argument");
  assert.equal(worker().status, "unhealthy");
  assert.match(worker().last_error ?? "", /stale/);
  const next = refusal(() => registry.controlStatus(control, status("one"), false));
  assert.equal(next.code, "failed_precondition");
});

Deno.test("registry: validates_node_identifiers", () => {
  const { registry } = setup();
  registry.controlStatus(new FakeControl("ok"), status("one", "cpu", "gpu-a.1"), true);
  registry.controlStatus(new FakeControl("long"), status("one", "cpu", "a".repeat(64)), true);
  for (const bad of ["bad name", "", "-lead", "a".repeat(65), "é"]) {
    const control = refusal(() =>
      registry.controlStatus(new FakeControl(bad), status("one", "cpu", bad), true)
    );
    assert.equal(control.code, "invalid_argument", bad);
    const slot = new FakeSlot(`d-${bad}`, "server-one", "s", bad);
    assert.equal(refusal(() => registry.registerSlot(slot.hello, slot)).code, "invalid_argument");
  }
  assert.deepEqual(registry.snapshot().workers.map((w) => w.name), ["gpu-a.1", "a".repeat(64)]);
  const missing = refusal(() =>
    registry.controlStatus(
      new FakeControl("x"),
      { ...status("one"), supervisor_instance_id: "" },
      true,
    )
  );
  assert.equal(missing.code, "invalid_argument");
  for (const [instance, slotId] of [["", "s"], ["server-one", ""]]) {
    const slot = new FakeSlot("d", instance, slotId);
    assert.equal(refusal(() => registry.registerSlot(slot.hello, slot)).code, "invalid_argument");
  }
});

Deno.test("registry: old_connection_cleanup_cannot_remove_replacement", async () => {
  const { registry, worker, events } = setup();
  const oldControl = new FakeControl("old-control");
  registry.controlStatus(oldControl, status("one"), true);
  const old = new FakeSlot("old", "server-one");
  registry.registerSlot(old.hello, old);
  const lease = await registry.acquire(null);
  assert.equal(lease.slot, old);
  registry.slotClosed(old, "closed");
  const replacement = new FakeSlot("new", "server-one");
  registry.registerSlot(replacement.hello, replacement);
  const newControl = new FakeControl("new-control");
  registry.controlStatus(newControl, status("one"), true);
  // Latest wins: the older control connection is closed.
  assert.deepEqual(oldControl.closes, [[
    "failed_precondition",
    "replaced by a newer control connection",
  ]]);
  assert.ok(events.some(([event]) => event === "control_replaced"));
  registry.slotClosed(old, "late close");
  registry.controlClosed(oldControl, "late close");
  const late = refusal(() => registry.controlStatus(oldControl, status("one"), false));
  assert.equal(late.code, "failed_precondition");
  lease.release(true);
  assert.equal(worker().status, "ready");
  assert.equal(worker().connected_data_slots, 1);
  assert.equal(worker().available_capacity, 1);
  assert.equal(worker().in_flight, 0);
  assert.deepEqual(replacement.closes, []);
  const next = await registry.acquire(null);
  assert.equal(next.slot, replacement);
  next.release(true);
  registry.controlStatus(newControl, status("one"), false);
  registry.close();
});

Deno.test("registry: instance_changes_invalidate_slots_without_corrupting_active_counts", async () => {
  for (const supervisorChanged of [false, true]) {
    const { registry, worker } = setup();
    const control = new FakeControl("control");
    registry.controlStatus(control, status("one"), true);
    const old = new FakeSlot("old", "server-one");
    registry.registerSlot(old.hello, old);
    const lease = await registry.acquire(null);
    const replacement = status("two");
    if (supervisorChanged) replacement.server_instance_id = "server-one";
    else replacement.supervisor_instance_id = "supervisor-one";
    registry.controlStatus(control, replacement, false);
    assert.deepEqual(old.closes, [["unavailable", "KCoral Server instance changed"]]);
    assert.equal(worker().restarts, 1);
    const instance = supervisorChanged ? "server-one" : "server-two";
    if (!supervisorChanged) {
      const stale = new FakeSlot("stale", "server-one");
      const refused = refusal(() => registry.registerSlot(stale.hello, stale));
      assert.equal(refused.code, "failed_precondition");
      assert.equal(refused.message, "data slot does not match the current server instance");
    }
    const fresh = new FakeSlot("replacement", instance);
    registry.registerSlot(fresh.hello, fresh);
    const current = await registry.acquire(null);
    assert.equal(current.slot, fresh);
    lease.release(true);
    assert.equal(registry.snapshot().active_requests, 1);
    assert.equal(worker().available_capacity, 0, "the old slot does not come back");
    current.release(true);
    assert.equal(worker().available_capacity, 1);
    assert.equal(registry.snapshot().active_requests, 0);
    registry.close();
  }
});

Deno.test("registry: a failing report from a new supervisor closes slots, keeps the server id", () => {
  const { registry, worker, slot, control } = readyNode();
  registry.controlStatus(control, failing("two"), false);
  assert.deepEqual(slot.closes, [["unavailable", "supervisor instance changed"]]);
  assert.equal(worker().restarts, 1);
  assert.equal(worker().supervisor_instance_id, "supervisor-two");
  assert.equal(worker().server_instance_id, "server-one");
  // The new server's slots wait for the supervisor to report it.
  const early = new FakeSlot("early", "server-two", "s2");
  assert.equal(
    refusal(() => registry.registerSlot(early.hello, early)).code,
    "failed_precondition",
  );
  registry.controlStatus(control, status("two"), false);
  registry.registerSlot(early.hello, early);
  assert.equal(worker().connected_data_slots, 1);
});

Deno.test("registry: a slot first adopts its instance; duplicates are refused", () => {
  const { registry, worker, events } = setup();
  const first = new FakeSlot("d1", "server-x", "s1");
  registry.registerSlot(first.hello, first);
  assert.equal(worker().status, "starting");
  assert.equal(worker().server_instance_id, "server-x");
  const duplicate = new FakeSlot("d2", "server-x", "s1");
  assert.equal(
    refusal(() => registry.registerSlot(duplicate.hello, duplicate)).code,
    "already_exists",
  );
  assert.ok(events.some(([event, fields]) => event === "slot_refused" && fields.node === "node"));
  // A report of another instance replaces the adopted one and closes its slots.
  registry.controlStatus(new FakeControl("c"), status("one"), true);
  assert.deepEqual(first.closes, [["unavailable", "KCoral Server instance changed"]]);
  assert.equal(worker().connected_data_slots, 0);
  assert.equal(worker().status, "ready");
});

Deno.test("registry: retention_removes_data_only_nodes_rebuilds_indices_and_protects_requests", async () => {
  const { registry, clock, worker } = setup();
  const orphan = new FakeSlot("orphan", "server-one");
  registry.registerSlot(orphan.hello, orphan);
  const control = new FakeControl("control");
  registry.controlStatus(control, status("one"), true);
  const lease = await registry.acquire(null);
  registry.controlClosed(control, "gone");
  const dataOnly = new FakeSlot("data-only", "i", "s", "data-only");
  registry.registerSlot(dataOnly.hello, dataOnly);
  clock.ms = 30_000;
  const keep = new FakeSlot("keep", "i", "s", "keep");
  registry.registerSlot(keep.hello, keep);
  clock.ms = 61_000;
  registry.sweep();
  assert.deepEqual(registry.snapshot().workers.map((w) => w.name), ["node", "keep"]);
  assert.deepEqual(dataOnly.closes, [["unavailable", "node retention expired"]]);
  assert.deepEqual(orphan.closes, [], "a node with a running request is kept");
  lease.release(true);
  registry.sweep();
  assert.deepEqual(registry.snapshot().workers.map((w) => w.name), ["keep"]);
  assert.deepEqual(orphan.closes, [["unavailable", "node retention expired"]]);
  assert.deepEqual(registry.health().target, { arch: "cpu" }, "the baseline outlives its node");
  clock.ms = 89_999;
  registry.sweep();
  assert.equal(registry.snapshot().workers.length, 1);
  clock.ms = 90_000;
  registry.sweep();
  assert.equal(registry.snapshot().workers.length, 0);
  assert.deepEqual(registry.health().target, {}, "an empty table clears the baseline");
  registry.controlStatus(new FakeControl("replacement"), status("two", "different-arch"), true);
  registry.controlClosed(control, "old callback");
  assert.equal(worker().status, "ready");
  assert.deepEqual(registry.health().target, { arch: "different-arch" });
  registry.close();
});

Deno.test("registry: the cohort baseline is sticky while any record exists", () => {
  const { registry, worker } = setup();
  const a = new FakeControl("a");
  registry.controlStatus(a, status("a", "sm_80", "gpu-a"), true);
  registry.controlClosed(a);
  registry.controlStatus(new FakeControl("b"), status("b", "sm_90a", "gpu-b"), true);
  assert.equal(worker("gpu-b").status, "incompatible");
  assert.deepEqual(registry.health().target, { arch: "sm_80" });
  // Versions count as much as the target.
  const c = { ...status("c", "sm_80", "gpu-c"), versions: { cuda: "12.8" } };
  registry.controlStatus(new FakeControl("c"), c, true);
  assert.equal(worker("gpu-c").status, "incompatible");
});

Deno.test("registry: queue_permits_return_on_cancellation_and_timeout", async () => {
  const { registry } = setup({ queueWaitTimeoutMs: 20 });
  const client = new AbortController();
  const cancelled = registry.acquire(null, client.signal);
  assert.equal(registry.snapshot().queue_length, 1);
  await assert.rejects(registry.acquire(null), RouterBusy);
  client.abort(new Error("cancelled"));
  await assert.rejects(cancelled, /cancelled/);
  assert.equal(registry.snapshot().queue_length, 0);
  await assert.rejects(registry.acquire(null), NoNode);
  assert.equal(registry.snapshot().queue_length, 0);
  registry.close();
});

Deno.test("registry: schedules_without_starving_either_outbound_node", async () => {
  // `random` always draws the first candidate first: only the tie-break can spread the load.
  const { registry } = setup({}, () => 0);
  for (const name of ["gpu-a", "gpu-b"]) {
    registry.controlStatus(new FakeControl(name), status(name, "cpu", name), true);
    const slot = new FakeSlot(`d-${name}`, `server-${name}`, "s", name);
    registry.registerSlot(slot.hello, slot);
  }
  const served = new Map<string, number>();
  for (let i = 0; i < 10; i++) {
    const lease = await registry.acquire(null);
    served.set(lease.nodeId, (served.get(lease.nodeId) ?? 0) + 1);
    lease.release(true);
  }
  assert.ok(
    (served.get("gpu-a") ?? 0) >= 4 && (served.get("gpu-b") ?? 0) >= 4,
    String([...served]),
  );
  registry.close();
});

Deno.test("registry: selection prefers the named node, then the lower reported load", async () => {
  const { registry } = setup({}, () => 0);
  const controls = new Map<string, FakeControl>();
  for (const name of ["gpu-a", "gpu-b"]) {
    const control = new FakeControl(name);
    controls.set(name, control);
    registry.controlStatus(control, { ...status(name, "cpu", name), worker_count: 2 }, true);
    for (const slotId of ["s1", "s2"]) {
      const slot = new FakeSlot(`${name}-${slotId}`, `server-${name}`, slotId, name);
      registry.registerSlot(slot.hello, slot);
    }
  }
  // gpu-a reports both workers busy (a discarded slot may still compute): gpu-b is chosen.
  registry.controlStatus(
    controls.get("gpu-a")!,
    { ...status("gpu-a", "cpu", "gpu-a"), worker_count: 2, busy_workers: 2 },
    false,
  );
  const byLoad = await registry.acquire(null);
  assert.equal(byLoad.nodeId, "gpu-b");
  const preferred = await registry.acquire("gpu-a");
  assert.equal(preferred.nodeId, "gpu-a", "preferred, although busier");
  const unknown = await registry.acquire("gpu-z");
  assert.equal(unknown.nodeId, "gpu-b");
  // A saturated preferred node is no candidate: the request goes elsewhere, never waits for it.
  preferred.markSaturated();
  unknown.release(true);
  const fallback = await registry.acquire("gpu-a");
  assert.equal(fallback.nodeId, "gpu-b");
  for (const lease of [byLoad, preferred, fallback]) lease.release(true);
  registry.close();
});

Deno.test("registry: a saturated node is skipped; its next healthy report wakes waiters", async () => {
  const { registry, control } = readyNode();
  const lease = await registry.acquire(null);
  lease.markSaturated();
  lease.release(true);
  const waiting = registry.acquire(null);
  await tick();
  assert.equal(registry.health().load.requests_waiting, 1);
  registry.controlStatus(control, status("one"), false);
  const served = await waiting;
  assert.equal(served.nodeId, "node");
  served.release(true);
  registry.close();
});

Deno.test("registry: waiters are served by a released slot, a new slot, a node becoming ready", async () => {
  const { registry, control, worker } = readyNode({ maxQueuedRequests: 3 });
  const first = await registry.acquire(null);
  const released = registry.acquire(null);
  first.release(true);
  const second = await released;
  assert.equal(second.slot, first.slot);
  const registered = registry.acquire(null);
  const slot2 = new FakeSlot("second", "server-one", "s2");
  registry.registerSlot(slot2.hello, slot2);
  const third = await registered;
  assert.equal(third.slot, slot2);
  // The node falls, a slot frees up meanwhile, then the node comes back.
  for (let i = 0; i < 3; i++) registry.controlStatus(control, failing("one"), false);
  assert.equal(worker().status, "unhealthy");
  const recovering = registry.acquire(null);
  second.release(true);
  await tick();
  assert.equal(registry.health().load.requests_waiting, 1);
  registry.controlStatus(control, status("one"), false);
  assert.equal(worker().status, "recovering");
  registry.controlStatus(control, status("one"), false);
  const fourth = await recovering;
  assert.equal(fourth.slot, first.slot);
  fourth.release(true);
  third.release(true);
  registry.close();
});

Deno.test("registry: a lease is released once; a discarded slot is unregistered", async () => {
  const { registry, slot, worker } = readyNode();
  const lease = await registry.acquire(null);
  lease.release(true);
  lease.release(true);
  lease.release(false);
  assert.equal(worker().in_flight, 0);
  assert.equal(worker().available_capacity, 1, "pushed back once");
  const discarded = await registry.acquire(null);
  discarded.release(false);
  assert.equal(worker().in_flight, 0);
  assert.equal(worker().connected_data_slots, 0);
  assert.equal(registry.health().load.request_capacity, 0);
  assert.deepEqual(slot.closes, [], "closing it is the caller's");
  registry.slotClosed(slot); // the caller's close: nothing left to remove
  const again = new FakeSlot("again", "server-one");
  registry.registerSlot(again.hello, again);
  assert.equal(worker().connected_data_slots, 1);
  registry.close();
});

Deno.test("registry: a slot closed mid-request keeps the count until release", async () => {
  const { registry, slot, worker } = readyNode();
  const lease = await registry.acquire(null);
  registry.slotClosed(slot, "tunnel_disconnected");
  assert.equal(worker().connected_data_slots, 0);
  assert.equal(worker().in_flight, 1);
  assert.equal(worker().last_error, "tunnel_disconnected");
  lease.release(true);
  assert.equal(worker().in_flight, 0);
  assert.equal(worker().available_capacity, 0, "a closed slot is not reused");
  registry.close();
});

Deno.test("registry: freshness expiry drops the control connection and its next report", () => {
  const { registry, clock, control, worker, slot } = readyNode();
  // Any report keeps the connection fresh, healthy or not.
  clock.ms = 4000;
  registry.controlStatus(control, failing("one"), false);
  clock.ms = 9000;
  registry.sweep();
  assert.deepEqual(control.closes, []);
  assert.equal(worker().status, "ready");
  clock.ms = 9001;
  registry.sweep();
  assert.deepEqual(control.closes, [["unavailable", "supervisor status expired"]]);
  assert.equal(worker().status, "unhealthy");
  assert.equal(worker().consecutive_failures, 3);
  assert.equal(worker().last_error, "supervisor status expired");
  assert.deepEqual(slot.closes, [], "slots stay");
  const next = refusal(() => registry.controlStatus(control, status("one"), false));
  assert.equal(next.code, "failed_precondition");
  registry.controlClosed(control);
  const reconnect = new FakeControl("reconnect");
  registry.controlStatus(reconnect, status("one"), true);
  assert.equal(worker().status, "recovering");
  registry.controlStatus(reconnect, status("one"), false);
  assert.equal(worker().status, "ready");
  assert.equal(registry.health().load.request_capacity, 1);
});

Deno.test("registry: a control connection may not change its node id", () => {
  const { registry, control, worker } = readyNode();
  const changed = refusal(() =>
    registry.controlStatus(control, status("one", "cpu", "other"), false)
  );
  assert.equal(changed.code, "invalid_argument");
  assert.equal(worker().status, "unhealthy", "the connection is going away");
  assert.equal(registry.snapshot().workers.length, 1, "no record for the other id");
  const unknown = refusal(() =>
    registry.controlStatus(new FakeControl("never"), status("one"), false)
  );
  assert.equal(unknown.code, "failed_precondition");
});

Deno.test("registry: snapshot fields and events", async () => {
  const { registry, clock, events, worker } = readyNode();
  clock.ms = 2500;
  const lease = await registry.acquire(null);
  assert.deepEqual(worker(), {
    name: "node",
    status: "ready",
    supervisor_instance_id: "supervisor-one",
    server_instance_id: "server-one",
    restarts: 0,
    in_flight: 1,
    capacity: 1,
    connected_data_slots: 1,
    available_capacity: 0,
    consecutive_failures: 0,
    recovery_successes: 0,
    last_probe_ok: true,
    last_success_age_seconds: 2.5,
    last_error: null,
  });
  assert.deepEqual(registry.snapshot().active_requests, 1);
  clock.ms = 5001;
  assert.equal(worker().last_probe_ok, false);
  lease.release(true);
  assert.deepEqual(events.map(([event]) => event), ["node_ready", "slot_registered"]);
  assert.deepEqual(events[0][1], { node: "node", from: "starting", reason: "healthy report" });
  registry.close();
});

Deno.test("registry: a throwing event listener does not break the registry", () => {
  const registry = new NodeRegistry(CONFIG, {
    onEvent: () => {
      throw new Error("listener");
    },
  });
  const logged: unknown[] = [];
  const original = console.error;
  console.error = (...args: unknown[]) => logged.push(args);
  try {
    registry.controlStatus(new FakeControl("c"), status("one"), true);
  } finally {
    console.error = original;
  }
  assert.equal(registry.snapshot().workers[0].status, "ready");
  assert.equal(logged.length, 1);
});

Deno.test("registry: close lets waiters go and refuses later requests", async () => {
  const { registry } = setup({ queueWaitTimeoutMs: 60_000 });
  const waiting = registry.acquire(null);
  registry.close();
  await assert.rejects(waiting, RouterStopping);
  await assert.rejects(registry.acquire(null), NoNode);
  registry.start(); // a closed registry does not start its timer again
  registry.close();
});

Deno.test("registry: start runs the sweep on a timer until stopped", async () => {
  const clock = { ms: 0 };
  const registry = new NodeRegistry({ ...CONFIG, statusCheckIntervalMs: 5 }, {
    now: () => clock.ms,
  });
  const control = new FakeControl("c");
  registry.controlStatus(control, status("one"), true);
  registry.start();
  registry.start();
  clock.ms = 10_000;
  const deadline = performance.now() + 1500;
  while (control.closes.length === 0 && performance.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  assert.deepEqual(control.closes, [["unavailable", "supervisor status expired"]]);
  registry.stop();
  // Stopped: a new expiry is no longer noticed.
  const later = new FakeControl("later");
  registry.controlStatus(later, status("one"), true);
  clock.ms = 20_000;
  await new Promise((resolve) => setTimeout(resolve, 30));
  assert.deepEqual(later.closes, []);
  registry.close();
});

Deno.test("registry: tryAcquire takes a free slot at once, as acquire would, and nothing otherwise", async () => {
  const { registry, slot } = readyNode();
  const lease = registry.tryAcquire(null);
  assert.ok(lease, "a free slot");
  assert.equal(lease.slot, slot);
  assert.equal(registry.snapshot().active_requests, 1);
  // None free: null, and no place in the queue taken.
  assert.equal(registry.tryAcquire(null), null);
  assert.equal(registry.health().load.requests_waiting, 0);
  // A waiter gets the slot once it is released, as before.
  const waiting = registry.acquire(null);
  lease.release(true);
  assert.equal((await waiting).slot, slot);
  registry.close();
  // Closed: null (acquire then refuses with RouterStopping).
  assert.equal(registry.tryAcquire(null), null);
});

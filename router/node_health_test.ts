import { healthyReportProblem, NodeRecord, sameCohort } from "./node_health.ts";

Deno.test("node health: healthyReportProblem", () => {
  const report = {
    t: "status",
    node_id: "gpu-a",
    server_healthy: true,
    supervisor_instance_id: "s1",
    server_instance_id: "i1",
    worker_count: 1,
    busy_workers: 0,
    target: {},
    versions: {},
    last_error: "",
    health_age_millis: 6_000,
  } as const;
  if (healthyReportProblem(report, 5_000) !== "node reports a stale local health snapshot") {
    throw new Error();
  }
});

Deno.test("node health: sameCohort", () => {
  const pool = { target: { arch: "sm_90a" }, versions: {} };
  if (!sameCohort(pool, { target: { arch: "sm_90a" }, versions: {} })) throw new Error();
  if (sameCohort(pool, { target: { arch: "sm_80" }, versions: {} })) throw new Error();
});

Deno.test("node health: NodeRecord", () => {
  const events: string[] = [];
  const node = new NodeRecord(
    "gpu-a",
    0,
    { unhealthyThreshold: 3, recoveryThreshold: 2 },
    (event) => events.push(event),
  );
  node.reportUnhealthy({
    t: "status",
    node_id: "gpu-a",
    server_healthy: false,
    supervisor_instance_id: "s1",
    server_instance_id: "",
    worker_count: 0,
    busy_workers: 0,
    target: {},
    versions: {},
    last_error: "KCoral Server is starting",
    health_age_millis: null,
  });
  if (node.status !== "unhealthy" || events.join() !== "node_unhealthy") throw new Error();
});

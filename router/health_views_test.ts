import { healthView, snapshotView } from "./health_views.ts";

Deno.test("health views: healthView", () => {
  const health = healthView({ nodes: [], now: 0, waiting: 2, cohort: null, closed: false });
  if (health.ok || health.load.requests_waiting !== 2) throw new Error();
});

Deno.test("health views: snapshotView", () => {
  const state = { nodes: [], now: 0, waiting: 0, cohort: null, closed: false };
  if (snapshotView(state, 5000).workers.length !== 0) throw new Error();
});

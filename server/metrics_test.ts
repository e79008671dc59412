import assert from "node:assert/strict";
import { EventLog } from "../http/events.ts";
import { ServerMetrics } from "./metrics.ts";

Deno.test("metrics: a finished request is counted and its lease time observed", async () => {
  const events = new EventLog({ logDir: null, console: false, programs: false });
  const metrics = new ServerMetrics(events, () => null);
  events.emit("INFO", "request_finished", {
    http_status: 200,
    finish_reason: "completed",
    error_kind: null,
    gpu_id: 0,
    queue_ms: 1.5,
    lease_wait_ms: 0.2,
    lease_held_ms: 12,
    response_bytes: 300,
  });
  const text = await metrics.render();
  assert.ok(
    text.includes(
      'kcoral_requests_total{code="200",finish_reason="completed",error_kind="none"} 1',
    ),
  );
  assert.ok(text.includes('kcoral_lease_held_seconds_count{gpu="0"} 1'));
  assert.ok(text.includes("# TYPE kcoral_workers gauge"));
  metrics.close();
});

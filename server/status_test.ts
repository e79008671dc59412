import assert from "node:assert/strict";
import { EventLog } from "../http/events.ts";
import { ServerStatus } from "./status.ts";

Deno.test("status: a finished request is listed, without its output", () => {
  const events = new EventLog({ logDir: null, console: false, programs: false });
  const status = new ServerStatus(events, () => null);
  events.emit("INFO", "request_finished", {
    request_id: "r1",
    http_status: 200,
    finish_reason: "completed",
    output_tail: "secret",
  });
  const data = status.data({
    status: "ok",
    instance_id: "i",
    started_at: "s",
    gpu_count: 0,
    load: { request_capacity: 1, requests_in_progress: 0, requests_waiting: 0 },
    target: {},
    versions: {},
  });
  assert.equal(data.requests[0].request_id, "r1");
  assert.ok(!JSON.stringify(data).includes("secret"));
  status.close();
});

import assert from "node:assert/strict";
import { EventLog } from "../../http/events.ts";
import { Rejection } from "../../http/rejection.ts";
import { finishRequest } from "./finish.ts";

Deno.test("finish: a rejection is its answer and a request_finished record", () => {
  const events = new EventLog({ logDir: null, console: false, programs: false });
  const seen: Record<string, unknown>[] = [];
  events.subscribe((e) => seen.push(e));
  const response = finishRequest(
    events,
    "0f6c2b4e-1111-4222-8333-444455556666",
    new Rejection(
      413,
      "request_too_large",
      "request exceeds the configured size limit",
      "rejected",
      {
        error_kind: "request_too_large",
      },
    ),
  );
  assert.equal(response.status, 413);
  assert.equal(seen[0].finish_reason, "rejected");
});

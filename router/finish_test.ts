import { RequestTrace, routerRejections } from "./finish.ts";
import { EventLog } from "../http/events.ts";

Deno.test("finish: routerRejections", () => {
  const full = routerRejections.queueFull();
  if (full.status !== 503 || full.kind !== "router_busy" || full.reason !== "queue_full") {
    throw new Error();
  }
});

Deno.test("finish: RequestTrace", async () => {
  const lines: string[] = [];
  const events = new EventLog({
    logDir: null,
    console: true,
    programs: false,
    consoleWrite: (line) => lines.push(line),
  });
  const trace = new RequestTrace(events);
  const response = trace.rejected(routerRejections.noNode());
  const body = await response.bytes();
  if (response.status !== 503 || response.headers.get("retry-after") !== "1") throw new Error();
  if (response.headers.get("content-length") !== String(body.length)) throw new Error();
  if (!lines.some((line) => line.includes("finish_reason=queue_timeout"))) throw new Error();
});

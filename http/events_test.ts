import { EventLog } from "./events.ts";
import { consoleMessage, isoNow } from "./events.ts";

Deno.test("events: consoleMessage", () => {
  if (consoleMessage("text", "listening", "serve") !== "listening") throw new Error();
  const record = JSON.parse(consoleMessage("json", "listening", "serve"));
  if (record.event !== "serve" || record.message !== "listening" || record.level !== "INFO") {
    throw new Error();
  }
});

Deno.test("events: isoNow", () => {
  const before = Date.now();
  const text = isoNow();
  const after = Date.now();
  const ms = Date.parse(text);
  if (!(ms >= before && ms <= after) || new Date(ms).toISOString() !== text) throw new Error(text);
});

Deno.test("events: EventLog.flush", () => {
  const lines: string[] = [];
  const log = new EventLog({
    logDir: null,
    console: true,
    programs: false,
    consoleWrite: (text) => lines.push(text),
    consoleBatched: ["request_finished"],
  });
  log.emit("INFO", "request_finished", { request_id: "r1" });
  log.emit("INFO", "request_finished", { request_id: "r2" });
  if (lines.length !== 0) throw new Error("written at once");
  log.flush();
  if (!lines[0].endsWith("request_id=r1") || !lines[1].endsWith("request_id=r2")) {
    throw new Error(lines.join());
  }
  log.close();
});

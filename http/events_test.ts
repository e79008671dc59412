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

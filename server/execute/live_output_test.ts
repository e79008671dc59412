import assert from "node:assert/strict";
import { LiveOutput } from "./live_output.ts";

Deno.test("live output: queued chunks come first, then the final answer", async () => {
  const live = new LiveOutput();
  live.send({ stream: "stdout", data: "hi\n" });
  const text = await live.response("r", Promise.resolve(new Response("{}"))).text();
  assert.ok(text.startsWith('{"stream":"stdout","data":"hi\\n"}\n'), text);
  assert.ok(text.endsWith("\n{}"), text);
});

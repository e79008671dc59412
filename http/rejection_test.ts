import { Rejection, unhandledFields } from "./rejection.ts";

Deno.test("rejection: Rejection", async () => {
  const busy = new Rejection(503, "busy", "server saturated", "no_worker", { queue_ms: 0 });
  const response = busy.response("0f6c2b4e-1111-4222-8333-444455556666");
  if (response.status !== 503 || response.headers.get("retry-after") !== "1") throw new Error();
  const timeout = new Rejection(504, "timeout", "execution timed out", "timeout");
  timeout.headers["x-kcoral-gpu-receipt"] = "{}";
  if (timeout.response("r").headers.get("x-kcoral-gpu-receipt") !== "{}") throw new Error();
  const body = await response.bytes();
  if (response.headers.get("content-length") !== String(body.length)) throw new Error("length");
});

Deno.test("rejection: unhandledFields", () => {
  const fields = unhandledFields(new TypeError("x is undefined"));
  if (fields.error_message !== "TypeError: x is undefined") throw new Error();
});

import { bodyReadRejection, receiveRequest } from "./intake.ts";
import { BodyTimeoutError } from "../http/request_body.ts";

Deno.test("intake: receiveRequest", async () => {
  const routed = await receiveRequest(
    new Request("http://router/execute", {
      method: "POST",
      body: "{}",
      headers: { "x-kcoral-node": "gpu-a", "content-length": "2" },
    }),
    { maxRequestBytes: 1 << 20 },
  );
  if (routed.preferred !== "gpu-a" || routed.body?.length !== 2) throw new Error("read whole");
});

Deno.test("intake: bodyReadRejection", () => {
  if (bodyReadRejection(new BodyTimeoutError(30_000)).status !== 408) throw new Error();
  if (bodyReadRejection(new Error("reset")).status !== 400) throw new Error();
});

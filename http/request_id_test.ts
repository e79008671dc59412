import { requestId } from "./request_id.ts";

Deno.test("request_id: requestId", () => {
  const id = "0f6c2b4e-1111-4222-8333-444455556666";
  if (requestId(new Headers({ "x-request-id": id })) !== id) throw new Error();
  if (requestId(new Headers({ "x-request-id": "../etc" })) === "../etc") throw new Error();
});

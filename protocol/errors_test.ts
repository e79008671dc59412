import { ERROR_MESSAGES, errorBody } from "./mod.ts";
import { errorMessage } from "./errors.ts";

Deno.test("errors: ERROR_MESSAGES", () => {
  if (ERROR_MESSAGES.busy !== "server saturated") throw new Error();
});

Deno.test("errors: errorBody", () => {
  const body = errorBody("r1", "busy", "server saturated");
  if (
    body !==
      '{"status":"ERROR","request_id":"r1","error":{"kind":"busy","message":"server saturated"}}'
  ) {
    throw new Error(body);
  }
});

Deno.test("errors: errorMessage", () => {
  if (errorMessage(new Error("gone")) !== "gone" || errorMessage(7) !== "7") throw new Error();
});

import { decodeServerError, type ServerErrorInfo } from "./server_error_decode.ts";

Deno.test("server_error_decode: ServerErrorInfo", () => {
  const info: ServerErrorInfo = decodeServerError(502, new TextEncoder().encode("bad gateway"));
  if (info.message !== "HTTP 502" || info.kind !== null) throw new Error();
});

Deno.test("server_error_decode: decodeServerError", () => {
  const info = decodeServerError(
    503,
    new TextEncoder().encode(
      '{"status":"ERROR","request_id":"r","error":{"kind":"busy","message":"server saturated"}}',
    ),
  );
  if (info.message !== "server saturated" || info.kind !== "busy" || info.requestId !== "r") {
    throw new Error();
  }
});

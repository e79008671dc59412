import { describeTlsFailure } from "./tls_failure.ts";

Deno.test("tls_failure: describeTlsFailure", () => {
  const error = new TypeError("fetch failed", {
    cause: new Error("client error (Connect): invalid peer certificate: Expired"),
  });
  if (!describeTlsFailure(error)?.includes("has expired")) throw new Error();
  if (describeTlsFailure(new Error("connection refused")) !== null) throw new Error();
});

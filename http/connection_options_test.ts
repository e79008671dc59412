import { connectionLimits, connectionOptions } from "./connection_options.ts";
import assert from "node:assert/strict";

Deno.test("connection_options: connectionOptions", () => {
  if (connectionOptions.maxConnections.flag !== "--max-connections") throw new Error();
});

Deno.test("connection_options: connectionLimits", () => {
  const limits = connectionLimits({
    headerTimeoutSeconds: 10,
    keepAliveTimeoutSeconds: 30,
    bodyTimeoutSeconds: 2,
    maxConnections: 1024,
  });
  assert.deepEqual(limits, {
    headerTimeoutMs: 10_000,
    keepAliveTimeoutMs: 30_000,
    bodyTimeoutMs: 2000,
    maxConnections: 1024,
  });
});

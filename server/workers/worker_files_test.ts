import assert from "node:assert/strict";
import { hostPaths, WorkerFileError } from "./worker_files.ts";

Deno.test("hostPaths: a worker's result paths map to the host, none outside", () => {
  const outcome = {
    status: "COMPLETED" as const,
    results: "{}",
    error: null,
    parts: [],
    stdout: { path: "/kcoral/results/stdout", size: 1 },
    stderr: null,
  };
  const mapped = hostPaths(outcome, "/kcoral/results", "/tmp/kcoral-x/slots/0/results");
  assert.equal(mapped.stdout?.path, "/tmp/kcoral-x/slots/0/results/stdout");
  const outside = { ...outcome, stdout: { path: "/etc/passwd", size: 1 } };
  assert.throws(() => hostPaths(outside, "/kcoral/results", "/h"), WorkerFileError);
});

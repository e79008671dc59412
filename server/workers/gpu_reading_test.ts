import assert from "node:assert/strict";
import { readGpuState } from "./gpu_reading.ts";

Deno.test("readGpuState: a helper that cannot start is an error, not a rejection", async () => {
  const reading = await readGpuState(["sim-0"], {
    python: "/nonexistent/python3",
    runtimePath: "/rt",
    env: {},
  });
  assert.ok(reading.error?.startsWith("cannot start"), reading.error);
});

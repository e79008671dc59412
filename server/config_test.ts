import assert from "node:assert/strict";
import { distinctGpuCount, resolveServerConfig, serverConfigSchema } from "./config.ts";

Deno.test("config: defaults from the environment, problems named by flag", () => {
  assert.equal(serverConfigSchema.defaults({ HOME: "/h" }).diskCacheDir, "/h/.cache/kcoral/files");
  const checked = serverConfigSchema.check({ numWorkers: 0 });
  assert.ok(!checked.ok && checked.problems[0].flag === "--num-workers");
});

Deno.test("config: distinct GPUs counted, none on a CPU server", () => {
  assert.equal(distinctGpuCount(resolveServerConfig({ gpus: [0, 1, 1] })), 2);
  assert.equal(distinctGpuCount(resolveServerConfig({ device: "cpu" })), 0);
});

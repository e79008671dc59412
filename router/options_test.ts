import assert from "node:assert/strict";
import {
  defaultRegistryConfig,
  parseRouterArgs,
  parseRouterCommandLine,
  registryConfig,
  routerUsage,
} from "./options.ts";

Deno.test("router options: routerUsage", () => {
  if (!routerUsage().startsWith("usage: kcoral router [-h] [--version]")) throw new Error();
});

Deno.test("router options: parseRouterCommandLine", () => {
  const { config, access } = parseRouterCommandLine(["--client-token", "a,b"], {});
  assert.equal(config.port, 9000);
  assert.deepEqual(access.clientTokens, ["a", "b"]);
});

Deno.test("router options: registryConfig", () => {
  const defaults = parseRouterArgs([], {});
  assert.deepEqual(registryConfig(defaults), {
    maxStatusAgeMs: 5000,
    unhealthyThreshold: 3,
    recoveryThreshold: 2,
    nodeRetentionMs: 600_000,
    statusCheckIntervalMs: 1000,
    maxQueuedRequests: 1024,
    queueWaitTimeoutMs: 1_800_000,
  });
});

Deno.test("router options: defaultRegistryConfig", () => {
  const config = defaultRegistryConfig({ maxQueuedRequests: 0 });
  assert.equal(config.maxQueuedRequests, 0);
  assert.equal(config.maxStatusAgeMs, 5000);
});

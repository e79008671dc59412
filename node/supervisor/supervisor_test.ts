import { nodeServerEnv, runSupervisor, SHUTTING_DOWN, STARTING } from "./supervisor.ts";

Deno.test("supervisor: nodeServerEnv", () => {
  const env = nodeServerEnv({
    routerEndpoint: "http://10.0.0.1:9000",
    nodeId: "gpu-a",
    nodeToken: "s3cret",
    host: "[::1]",
    port: 8000,
  });
  if (env.KCORAL_SERVER_HOST !== "::1" || env.KCORAL_NODE_TOKEN !== "s3cret") throw new Error();
});

Deno.test("supervisor: STARTING", () => {
  if (STARTING !== "KCoral Server is starting") throw new Error();
});

Deno.test("supervisor: SHUTTING_DOWN", () => {
  if (SHUTTING_DOWN !== "Supervisor is shutting down") throw new Error();
});

Deno.test("supervisor: runSupervisor", async () => {
  const code = await runSupervisor({
    nodeId: "gpu-a",
    routerEndpoint: "http://127.0.0.1:9",
    nodeToken: null,
    serverUrl: "http://127.0.0.1:8000/",
    child: { command: "sleep", args: ["30"], env: {} },
    healthIntervalSeconds: 2,
    healthTimeoutSeconds: 1,
    failureThreshold: 3,
    startupGraceSeconds: 30,
    stableResetSeconds: 60,
    terminationGraceSeconds: 5,
    restartMinDelaySeconds: 1,
    restartMaxDelaySeconds: 30,
    restartJitter: 0.2,
    signal: AbortSignal.abort(),
    log: () => {},
  });
  if (code !== 0) throw new Error();
});

import { nodeLinkTargetFromEnv, withNodeLink } from "./linked_app.ts";
import { createApp } from "../server/app.ts";

Deno.test("linked app: nodeLinkTargetFromEnv", () => {
  const target = nodeLinkTargetFromEnv({
    KCORAL_NODE_SERVER: "1",
    KCORAL_ROUTER_ENDPOINT: "http://r:9000",
    KCORAL_NODE_ID: "gpu-a",
  });
  if (target?.nodeId !== "gpu-a" || target.nodeToken !== null) throw new Error();
  if (nodeLinkTargetFromEnv({}) !== null) throw new Error();
});

Deno.test("linked app: withNodeLink", () => {
  const app = withNodeLink(
    createApp({ device: "cpu", sandbox: "none", logConsole: false, diskCacheDir: null }),
    { routerEndpoint: "http://127.0.0.1:1", nodeId: "cpu-a", nodeToken: null },
  );
  if (app.config.device !== "cpu") throw new Error();
});

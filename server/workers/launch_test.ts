import assert from "node:assert/strict";
import { resolveServerConfig } from "../config.ts";
import { WorkerLaunch } from "./launch.ts";

Deno.test("launch: a CPU server without a sandbox changes no child's environment", () => {
  const config = resolveServerConfig({ device: "cpu", sandbox: "none", diskCacheDir: null });
  const python = {
    executable: "/usr/bin/python3",
    prefix: "/usr",
    basePrefix: "/usr",
    path: [],
    userSite: null,
    userBase: null,
    version: "3.11.0",
  };
  const launch = new WorkerLaunch(config, {
    python,
    runtimePath: "/rt",
    blobDir: "/blobs",
    env: {},
    devices: [],
  });
  assert.equal(launch.sandboxed, false);
  assert.deepEqual(launch.childEnv([]), { env: {}, unset: [] });
});

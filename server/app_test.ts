import assert from "node:assert/strict";
import { appInternals, createApp, executeTunnelled } from "./app.ts";

Deno.test("app: not started, no pool; a tunnelled request is answered busy", async () => {
  const app = createApp({ device: "cpu", sandbox: "none", logConsole: false, diskCacheDir: null });
  assert.equal(appInternals(app).pool, null);
  const answer = await executeTunnelled(app, {
    headers: new Headers({ "content-length": "0" }),
    bytes: () => Promise.resolve(new Uint8Array(0)),
    discard: () => {},
  }, "outbound-tunnel");
  assert.equal(answer.status, 503);
  await answer.body?.cancel();
});
